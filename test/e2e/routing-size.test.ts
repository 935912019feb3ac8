import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Trajectory } from '../../src/model/records';
import { requirementsMet } from '../python/requirements';
import { startChildSidecar, type ChildSidecar } from '../support/child-sidecar';
import { startKafkaTestBroker, type KafkaTestBroker, type StoredRecord } from '../support/kafka-broker';
import { npyUint8 } from '../support/qwen3-server';
import { runToExit } from '../support/run-to-exit';
import { readNdjson } from '../support/sidecar';

/**
 * Routing replay at full size: one call of 32,768 tokens (prompt + output) from a 48-layer,
 * top-8 MoE, its routed experts a 12 MB uint8 `.npy` (16.8 MB in base64), goes through built
 * sidecars (dist/, child processes) to the file exporter and, as chunked Kafka records, to the
 * test broker in JSON and in protobuf. The file trajectory's rows are, byte for byte, what the
 * model server returned; the Python client rebuilds every trajectory (from the chunks, or from the
 * files) with the same rows and ids, bit-exact (SHA-256 of the arrays). Each sidecar's peak RSS
 * (VmHWM) is measured, with the image's memory settings: it must stay within the 200 MiB bar of
 * docs/reliability.md.
 */

const ROOT = path.join(__dirname, '../..');
const PACKAGE = path.join(ROOT, 'clients/python');
const PROMPT = 32_400;
const OUTPUT = 368;
const TOKENS = PROMPT + OUTPUT;
const ROWS = TOKENS - 1;
const LAYERS = 48;
const TOP_K = 8;
/** docs/reliability.md: "Peak RSS … against the 200 MiB bar". */
const RSS_BAR_KIB = 200 * 1024;
/** The image's memory settings (deploy/Dockerfile), with which the bar is measured. */
const IMAGE_MEMORY_ENV = { NODE_OPTIONS: '--max-semi-space-size=4', MALLOC_MMAP_THRESHOLD_: '131072' };

const promptIds = Array.from({ length: PROMPT }, (_, i) => (i * 7919) % 151_643);
const outputIds = Array.from({ length: OUTPUT }, (_, i) => 1000 + ((i * 13) % 5000));
const ids = [...promptIds, ...outputIds];

/** The expert the stand-in reports for position p, layer l, choice k: 0..255, so uint8. */
function expert(p: number, l: number, k: number): number {
  return (p * 31 + l * 7 + k) % 256;
}

function expectedRouting(): Buffer {
  const out = Buffer.alloc(ROWS * LAYERS * TOP_K);
  let at = 0;
  for (let p = 0; p < ROWS; p++) for (let l = 0; l < LAYERS; l++) for (let k = 0; k < TOP_K; k++) out[at++] = expert(p, l, k);
  return out;
}

const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
const idsBytes = (xs: readonly number[]): Buffer => Buffer.from(Int32Array.from(xs).buffer);

/** A vLLM stand-in: every non-streamed chat call gets the same 32,768-token answer with routing. */
async function startStandIn(routing: Buffer): Promise<{ url: string; calls: number; close(): Promise<void> }> {
  const npy = npyUint8(routing, [ROWS, LAYERS, TOP_K]).toString('base64');
  const answer = (withIds: boolean, withLogprobs: boolean): Buffer =>
    Buffer.from(
      JSON.stringify({
        id: 'chatcmpl-routing-size',
        object: 'chat.completion',
        created: 1_764_000_000,
        model: 'Qwen/Qwen3-30B-A3B',
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: 'word '.repeat(OUTPUT).trim(), reasoning_content: null, tool_calls: [] },
            logprobs: withLogprobs
              ? { content: outputIds.map((t) => ({ token: `token_id:${t}`, logprob: -(t % 7) / 8, bytes: null, top_logprobs: [] })) }
              : null,
            finish_reason: 'stop',
            stop_reason: null,
            ...(withIds ? { token_ids: outputIds } : {}),
            routed_experts: npy,
          },
        ],
        usage: { prompt_tokens: PROMPT, completion_tokens: OUTPUT, total_tokens: TOKENS },
        ...(withIds ? { prompt_token_ids: promptIds } : {}),
      }),
    );
  const state = { calls: 0 };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/v1/chat/completions') {
        res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}');
        return;
      }
      const json = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      state.calls++;
      const body = answer(json.return_token_ids === true, json.logprobs === true);
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length }).end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    get calls() {
      return state.calls;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A python3 with confluent-kafka, protobuf and numpy; or why there is none. */
function findPython(): { python: string } | { missing: string } {
  let missing = 'python3 is not installed (Debian: python3)';
  for (const c of [process.env.LIGHTNING_PYTHON, 'python3', '/usr/bin/python3'].filter((x): x is string => !!x)) {
    const probe = spawnSync(c, ['-c', 'import confluent_kafka, google.protobuf, numpy'], { encoding: 'utf8' });
    if (probe.error) continue;
    if (probe.status === 0) return { python: c };
    missing = `${c} lacks confluent-kafka, protobuf or numpy (Debian: python3-confluent-kafka python3-protobuf python3-numpy)`;
  }
  return { missing };
}

/** Reads every trajectory of each source with the Python client; prints what it rebuilt, hashed. */
const PY_SCRIPT = `
import hashlib, json, sys, uuid
import numpy as np
from lightning_sidecar_client import iter_trajectories, routed_experts_array, routing_missing_mask
out = {}
for name, src in json.loads(sys.argv[1]).items():
    if 'data_dir' in src:
        got = list(iter_trajectories(data_dir=src['data_dir'], idle_exit_ms=1000))
    else:
        got = list(iter_trajectories(brokers=src['brokers'], consumer_group=f'routing-size-{uuid.uuid4()}', trajectories_topic=src['trajectories_topic'],
                                     episodes_topic=src['episodes_topic'], idle_exit_ms=1500))
    rows = []
    for t in got:
        a = routed_experts_array(t)
        rows.append({'trajectory_id': t['trajectory_id'], 'shape': list(a.shape), 'dtype': str(a.dtype),
                     'routing_sha256': hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(),
                     'ids_sha256': hashlib.sha256(np.asarray(t['token_ids'], dtype='<i4').tobytes()).hexdigest(),
                     'missing_rows': int(routing_missing_mask(t).sum()), 'routing_complete': t['routing_complete'],
                     'routing_coverage': t['routing_coverage'], 'prompt_length': t['prompt_length']})
    out[name] = rows
print(json.dumps(out))
`;

interface PyTrajectory {
  trajectory_id: string;
  shape: number[];
  dtype: string;
  routing_sha256: string;
  ids_sha256: string;
  missing_rows: number;
  routing_complete: boolean;
  routing_coverage: number;
  prompt_length: number;
}

interface KafkaSidecar {
  name: 'json' | 'protobuf';
  rollout: string;
  trajectoriesTopic: string;
  episodesTopic: string;
  sidecar: ChildSidecar;
}

async function until(what: string, ok: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`${what}: not after ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The peak resident set of a live process, in KiB (/proc/<pid>/status VmHWM). */
function vmHwmKib(pid: number): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no VmHWM for ${pid}`);
  return Number(m[1]);
}

/** A chunked record's chunks, in order, checked against their headers; the whole value. */
function reassemble(chunks: StoredRecord[]): Buffer {
  const h = chunks[0].headers;
  expect(h['lightning-chunk']).toBe('v1');
  const count = Number(h['lightning-chunk-count']);
  expect(chunks.map((c) => Number(c.headers['lightning-chunk-index']))).toEqual(Array.from({ length: count }, (_, i) => i));
  for (const c of chunks) expect(c.value!.length).toBeLessThanOrEqual(1_000_000);
  const whole = Buffer.concat(chunks.map((c) => c.value!));
  expect(whole.length).toBe(Number(h['lightning-record-bytes']));
  expect(sha256(whole)).toBe(h['lightning-record-sha256']);
  return whole;
}

const found = findPython();
const TITLE = 'a 32k-token trajectory with 48 layers × top-8 routing, to files and chunked Kafka records, rebuilt bit-exact by the Python client';
const runs = requirementsMet('test/e2e/routing-size.test.ts', 'missing' in found ? found.missing : null, TITLE);

(runs ? describe : describe.skip)(TITLE, () => {
  const python = 'python' in found ? found.python : '';
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-routing-size-'));
  const expected = expectedRouting();
  const expectedSha = sha256(expected);
  const idsSha = sha256(idsBytes(ids));
  let broker: KafkaTestBroker;
  let standIn: Awaited<ReturnType<typeof startStandIn>>;
  let file: ChildSidecar;
  const fileData = path.join(dir, 'file-data');
  const kafka: KafkaSidecar[] = [];
  /** VmHWM in KiB once started (before the call), and once its episode is out. */
  const idle: Record<string, number> = {};
  const peaks: Record<string, number> = {};
  let fromPython: Promise<Record<string, PyTrajectory[]>> | null = null;

  /** The Python client's view of every source, read once. */
  function pythonView(): Promise<Record<string, PyTrajectory[]>> {
    fromPython ??= (async () => {
      const sources: Record<string, Record<string, string>> = { file: { data_dir: fileData } };
      for (const k of kafka) sources[k.name] = { brokers: broker.brokers.join(','), trajectories_topic: k.trajectoriesTopic, episodes_topic: k.episodesTopic };
      const r = await runToExit(python, ['-c', PY_SCRIPT, JSON.stringify(sources)], { env: { PYTHONPATH: PACKAGE, HOME: dir }, timeoutMs: 40_000 });
      if (r.code !== 0) throw new Error(`python exited ${r.code}:\n${r.stdout}\n${r.stderr}`);
      return JSON.parse(r.stdout) as Record<string, PyTrajectory[]>;
    })();
    return fromPython;
  }

  async function call(origin: string, rollout: string): Promise<void> {
    const res = await fetch(`${origin}/rollout/${rollout}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'Qwen/Qwen3-30B-A3B', messages: [{ role: 'user', content: 'Write a very long essay.' }] }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const reward = await fetch(`${origin}/lightning/v1/rollouts/${rollout}/reward`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ value: 1 }),
    });
    expect(reward.status).toBe(202);
  }

  beforeAll(async () => {
    broker = await startKafkaTestBroker();
    standIn = await startStandIn(expected);
    const common = {
      ...IMAGE_MEMORY_ENV,
      LIGHTNING_UPSTREAM_URL: standIn.url,
      LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
      LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
      LIGHTNING_LOG_LEVEL: 'warn',
      // The product default (child-sidecar.ts exports both for the suite).
      LIGHTNING_EXPORT_RECORDS: 'trajectories',
    };
    const started = await Promise.all([
      startChildSidecar({ ...common, LIGHTNING_DATA_DIR: fileData }),
      ...(['json', 'protobuf'] as const).map((name) =>
        startChildSidecar({
          ...common,
          LIGHTNING_DATA_DIR: path.join(dir, `${name}-data`),
          LIGHTNING_EXPORTER: 'kafka',
          LIGHTNING_KAFKA_BROKERS: broker.brokers.join(','),
          LIGHTNING_KAFKA_ENCODING: name,
          LIGHTNING_KAFKA_TOPIC: `rs-${name}.transitions`,
          LIGHTNING_KAFKA_TRAJECTORIES_TOPIC: `rs-${name}.trajectories`,
          LIGHTNING_KAFKA_EPISODES_TOPIC: `rs-${name}.episodes`,
        }),
      ),
    ]);
    file = started[0];
    started.forEach((s, i) => (idle[['file', 'json', 'protobuf'][i]] = vmHwmKib(s.proc.pid!)));
    kafka.push(
      ...(['json', 'protobuf'] as const).map((name, i) => ({
        name,
        rollout: `rs-${name}`,
        trajectoriesTopic: `rs-${name}.trajectories`,
        episodesTopic: `rs-${name}.episodes`,
        sidecar: started[i + 1],
      })),
    );
    // One sidecar at a time: each builds and exports its trajectory alone (a 2-core machine).
    await call(file.origin, 'rs-file');
    await until('the file episode', () => readNdjson<{ rollout_id: string }>(path.join(fileData, 'episodes')).some((e) => e.rollout_id === 'rs-file'), 20_000);
    peaks.file = vmHwmKib(file.proc.pid!);
    for (const k of kafka) {
      await call(k.sidecar.origin, k.rollout);
      await until(`the ${k.name} episode on Kafka`, () => broker.records(k.episodesTopic).some((r) => r.value?.includes(k.rollout)), 20_000);
      peaks[k.name] = vmHwmKib(k.sidecar.proc.pid!);
    }
    expect(standIn.calls).toBe(3);
  }, 60_000);

  afterAll(async () => {
    await Promise.all([file, ...kafka.map((k) => k.sidecar)].filter((s) => s !== undefined).map((s) => s.kill()));
    await standIn?.close();
    await broker?.close();
  });

  it('the file trajectory: 32,768 ids, routed experts [32767, 48, 8] uint8, every row what the server returned; the Python client agrees', async () => {
    const trajectories = readNdjson<Trajectory>(path.join(fileData, 'trajectories'));
    expect(trajectories.map((t) => t.trajectory_id)).toEqual(['rs-file/0/s0']);
    const [t] = trajectories;
    expect(t.token_ids).toEqual(ids);
    expect(t.prompt_length).toBe(PROMPT);
    const re = t.routed_experts!;
    expect({ dtype: re.dtype, shape: re.shape, missing: re.missing }).toEqual({ dtype: 'uint8', shape: [ROWS, LAYERS, TOP_K], missing: [] });
    expect([t.routing_complete, t.routing_coverage]).toEqual([true, 1]);
    const data = Buffer.from(re.data, 'base64');
    expect(data.length).toBe(ROWS * LAYERS * TOP_K);
    // The first differing byte, named, rather than a 12 MB diff.
    const at = data.findIndex((v, i) => v !== expected[i]);
    expect(at === -1 ? 'every byte equal' : `byte ${at} (row ${Math.floor(at / (LAYERS * TOP_K))}): ${data[at]}, expected ${expected[at]}`).toBe(
      'every byte equal',
    );
    expect(sha256(data)).toBe(expectedSha);

    const [py] = (await pythonView()).file;
    expect(py).toMatchObject({ trajectory_id: 'rs-file/0/s0', shape: [ROWS, LAYERS, TOP_K], dtype: 'uint8', routing_sha256: expectedSha, ids_sha256: idsSha });
  }, 45_000);

  it.each(['json', 'protobuf'] as const)(
    'Kafka, %s: the trajectory record is chunked, whole again by its checksum, and the Python client rebuilds routing and ids bit-exact',
    async (name) => {
      const k = kafka.find((x) => x.name === name)!;
      const chunks = broker.records(k.trajectoriesTopic).filter((r) => r.key?.toString() === k.rollout);
      expect(chunks.length).toBeGreaterThan(1);
      expect(Number(chunks[0].headers['lightning-chunk-count'])).toBe(chunks.length);
      const whole = reassemble(chunks);
      process.stderr.write(`routing-size ${name}: trajectory record ${whole.length} bytes in ${chunks.length} chunks\n`);
      if (name === 'json') {
        const t = JSON.parse(whole.toString('utf8')) as Trajectory;
        expect(t.token_ids).toEqual(ids);
        expect(t.routed_experts!.shape).toEqual([ROWS, LAYERS, TOP_K]);
        expect(sha256(Buffer.from(t.routed_experts!.data, 'base64'))).toBe(expectedSha);
      } else {
        // Raw bytes, not base64: the record is smaller than the routing's base64 alone.
        expect(whole.length).toBeLessThan(Math.ceil(expected.length / 3) * 4);
        expect(whole.includes(expected.subarray(0, 4096))).toBe(true);
      }
      const got = (await pythonView())[name];
      expect(got).toEqual([
        {
          trajectory_id: `${k.rollout}/0/s0`,
          shape: [ROWS, LAYERS, TOP_K],
          dtype: 'uint8',
          routing_sha256: expectedSha,
          ids_sha256: idsSha,
          missing_rows: 0,
          routing_complete: true,
          routing_coverage: 1,
          prompt_length: PROMPT,
        },
      ]);
    },
    45_000,
  );

  it('the sidecars (files, Kafka JSON, Kafka protobuf) peaked within the 200 MiB bar (VmHWM) building and exporting the trajectory', () => {
    process.stderr.write(
      `routing-size peak RSS (VmHWM): ${Object.entries(peaks)
        .map(([n, kib]) => `${n} ${(kib / 1024).toFixed(1)} MiB (${(idle[n] / 1024).toFixed(1)} MiB once started)`)
        .join(', ')}\n`,
    );
    expect(Object.keys(peaks).sort()).toEqual(['file', 'json', 'protobuf']);
    expect(peaks.file).toBeLessThan(RSS_BAR_KIB);
    expect(peaks.json).toBeLessThan(RSS_BAR_KIB);
    expect(peaks.protobuf).toBeLessThan(RSS_BAR_KIB);
  });
});
