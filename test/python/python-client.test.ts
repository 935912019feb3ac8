import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startChildSidecar, type ChildSidecar } from '../support/child-sidecar';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest } from '../support/fake-model-server';
import { startKafkaTestBroker, type KafkaTestBroker } from '../support/kafka-broker';
import { requirementsMet } from './requirements';

/**
 * The Python trainer client (clients/python) against the Kafka test broker, with streams a real
 * sidecar (dist/) produced in front of a vLLM-like model server: its pytest suite (unit tests, and
 * integration tests reading what this file describes in $LIGHTNING_TEST_KAFKA_SPEC), then its
 * `groups` command against the Node one on the same stream, line for line.
 */

const ROOT = path.join(__dirname, '../..');
const MAIN = path.join(ROOT, 'dist/main.js');
const PACKAGE = path.join(ROOT, 'clients/python');
const GROUP_SIZE = 2;

/** A python3 with confluent-kafka, protobuf, pytest and numpy, plus protoc; or why there is none. */
function findPython(): { python: string } | { missing: string } {
  const candidates = [process.env.LIGHTNING_PYTHON, 'python3', '/usr/bin/python3'].filter((c): c is string => !!c);
  let missing = 'python3 is not installed (Debian: python3)';
  for (const c of candidates) {
    // numpy: without it pytest skips the client's numpy tests (importorskip).
    const probe = spawnSync(c, ['-c', 'import confluent_kafka, google.protobuf, pytest, numpy'], { encoding: 'utf8' });
    if (probe.error) continue;
    if (probe.status !== 0) {
      missing = `${c} lacks confluent-kafka, protobuf, pytest or numpy (Debian: python3-confluent-kafka python3-protobuf python3-pytest python3-numpy)`;
      continue;
    }
    if (spawnSync('protoc', ['--version']).status !== 0) return { missing: 'protoc is not installed (Debian: protobuf-compiler)' };
    return { python: c };
  }
  return { missing };
}

function run(cmd: string, args: string[], env: Record<string, string>, timeoutMs: number): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    // TMPDIR: pytest's temporary files go where the suite's do (removed after the run).
    const p = spawn(cmd, args, { cwd: ROOT, env: { PATH: process.env.PATH ?? '', TMPDIR: os.tmpdir(), ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c));
    p.stderr.on('data', (c: Buffer) => (stderr += c));
    const kill = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.once('error', reject);
    p.once('exit', (code) => {
      clearTimeout(kill);
      resolve({ code, stdout, stderr });
    });
  });
}

interface Call {
  prompt: number[];
  response: number[];
  logprobs: number[];
}

interface Stream {
  name: string;
  /** What the sidecar exported (`exporters.records`). */
  records: 'trajectories' | 'transitions' | 'both';
  topic: string;
  trajectories_topic: string;
  episodes_topic: string;
  encoding: 'json' | 'protobuf';
  chunked: boolean;
  delta: boolean;
  groups: Record<string, string[]>;
  incomplete: string[];
  calls: Record<string, Call[]>;
}

/** The rollouts driven through each sidecar: g1 and g2 complete, g3 never does. */
const ROLLOUTS: { id: string; group: string; calls: number; reward: number }[] = [
  { id: 'g1-a', group: 'g1', calls: 3, reward: 1 },
  { id: 'g1-b', group: 'g1', calls: 1, reward: 0 },
  { id: 'g2-a', group: 'g2', calls: 2, reward: 0.5 },
  { id: 'g2-b', group: 'g2', calls: 2, reward: -0.25 },
  { id: 'g3-a', group: 'g3', calls: 1, reward: 1 },
];

const found = findPython();
const python = 'python' in found ? found.python : null;
const TITLE = 'Python trainer client (clients/python) against the test broker and a real sidecar';
const runs = requirementsMet('test/python/python-client.test.ts', 'missing' in found ? found.missing : null, TITLE);

(runs ? describe : describe.skip)(TITLE, () => {
  let broker: KafkaTestBroker;
  let upstream: FakeModelServer;
  const sidecars: ChildSidecar[] = [];
  const streams: Stream[] = [];
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-python-'));

  /** Whether this build's exporter chunks records and sends prompt deltas (config accepts the keys). */
  async function producerFeatures(): Promise<string | null> {
    const file = path.join(dir, 'chunks-and-deltas.yaml');
    writeFileSync(file, 'exporters:\n  kafka:\n    prompt_ids: delta\n    max_message_bytes: 1400\n');
    const v = await run(process.execPath, [MAIN, 'validate', file], {}, 15_000);
    return v.code === 0 ? file : null;
  }

  async function drive(stream: Stream, sidecar: ChildSidecar): Promise<void> {
    for (const r of ROLLOUTS) {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${r.id}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': r.group } });
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'system', content: `You are agent ${r.id}.` }];
      stream.calls[r.id] = [];
      for (let step = 0; step < r.calls; step++) {
        messages.push({ role: 'user', content: `${stream.name} ${r.id} step ${step}: ${'tell me more. '.repeat(20 * step)}` });
        const index = upstream.requests.length;
        const reply = await client.chat.completions.create({ model: 'm', messages });
        messages.push({ role: 'assistant', content: reply.choices[0].message.content });
        // What the model server sent: the ids the trainer must see, exactly.
        const body = JSON.parse(upstream.responses[index].toString('utf8')) as {
          prompt_token_ids: number[];
          choices: { token_ids: number[]; logprobs: { content: { logprob: number }[] } }[];
        };
        stream.calls[r.id].push({
          prompt: body.prompt_token_ids,
          response: body.choices[0].token_ids,
          logprobs: body.choices[0].logprobs.content.map((c) => c.logprob),
        });
      }
      const res = await fetch(`${sidecar.origin}/lightning/v1/rollouts/${r.id}/reward`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ value: r.reward }),
      });
      expect(res.status).toBe(202);
    }
  }

  /** Waits until the episodes topic holds every episode (whole messages, or last chunks). */
  async function delivered(stream: Stream): Promise<void> {
    const count = () =>
      broker
        .records(stream.episodes_topic)
        .filter(
          (m) => m.headers['lightning-chunk'] === undefined || Number(m.headers['lightning-chunk-index']) === Number(m.headers['lightning-chunk-count']) - 1,
        ).length;
    for (let i = 0; i < 400 && count() < ROLLOUTS.length; i++) await new Promise((r) => setTimeout(r, 25));
    expect(count()).toBe(ROLLOUTS.length);
  }

  beforeAll(async () => {
    broker = await startKafkaTestBroker();
    upstream = await startFakeModelServer({
      flavor: 'vllm',
      script: (req: ReceivedRequest) => ({ content: `answer ${((req.json?.messages as unknown[]) ?? []).length}` }),
    });
    const features = await producerFeatures();
    // JSON with both kinds of records; protobuf with trajectories only (the default), chunked.
    const kinds: { name: string; encoding: 'json' | 'protobuf'; config: string | null; records: Stream['records'] }[] = [
      { name: 'json', encoding: 'json', config: null, records: 'both' },
      { name: 'protobuf', encoding: 'protobuf', config: features, records: 'trajectories' },
    ];
    for (const k of kinds) {
      const topic = k.name === 'json' ? 'lightning.transitions' : `${k.name}.transitions`;
      const trajectoriesTopic = k.name === 'json' ? 'lightning.trajectories' : `${k.name}.trajectories`;
      const episodesTopic = k.name === 'json' ? 'lightning.episodes' : `${k.name}.episodes`;
      const sidecar = await startChildSidecar(
        {
          LIGHTNING_UPSTREAM_URL: upstream.url,
          LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
          LIGHTNING_EXPORTER: 'kafka',
          LIGHTNING_KAFKA_BROKERS: broker.brokers.join(','),
          LIGHTNING_KAFKA_ENCODING: k.encoding,
          LIGHTNING_KAFKA_TOPIC: topic,
          LIGHTNING_KAFKA_TRAJECTORIES_TOPIC: trajectoriesTopic,
          LIGHTNING_KAFKA_EPISODES_TOPIC: episodesTopic,
          LIGHTNING_EXPORT_RECORDS: k.records,
          LIGHTNING_DATA_DIR: mkdtempSync(path.join(dir, `${k.name}-data-`)),
          LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
          LIGHTNING_LOG_LEVEL: 'warn',
        },
        k.config ? ['--config', k.config] : [],
      );
      sidecars.push(sidecar);
      const stream: Stream = {
        name: k.name,
        records: k.records,
        topic,
        trajectories_topic: trajectoriesTopic,
        episodes_topic: episodesTopic,
        encoding: k.encoding,
        chunked: k.config !== null,
        delta: k.config !== null && k.records !== 'trajectories',
        groups: { g1: ['g1-a', 'g1-b'], g2: ['g2-a', 'g2-b'] },
        incomplete: ['g3'],
        calls: {},
      };
      await drive(stream, sidecar);
      await delivered(stream);
      streams.push(stream);
    }
    if (!features)
      process.stderr.write(
        "test/python: this build's exporter neither chunks nor sends prompt deltas; those paths are covered by records built from the spec only\n",
      );
  }, 90_000);

  afterAll(async () => {
    for (const s of sidecars) await s.kill();
    await upstream?.close();
    await broker?.close();
  });

  it('passes its pytest suite, with the integration tests reading the sidecar streams', async () => {
    const spec = path.join(dir, 'spec.json');
    writeFileSync(spec, JSON.stringify({ brokers: broker.brokers.join(','), group_size: GROUP_SIZE, streams }));
    const res = await run(
      python!,
      ['-m', 'pytest', 'clients/python/tests', '-q', '-rs', '-p', 'no:cacheprovider'],
      { LIGHTNING_TEST_KAFKA_SPEC: spec, HOME: process.env.HOME ?? dir },
      240_000,
    );
    if (res.code === 5) throw new Error(`pytest collected no tests:\n${res.stdout}${res.stderr}`);
    if (res.code !== 0) throw new Error(`pytest exited ${res.code}:\n${res.stdout}\n${res.stderr}`);
    process.stderr.write(
      res.stdout
        .split('\n')
        .filter((l) => /passed|SKIPPED|failed/.test(l))
        .join('\n') + '\n',
    );
    expect(res.stdout).toMatch(/\d+ passed/);
    // The integration tests ran (they skip only without the spec).
    expect(res.stdout).not.toContain('LIGHTNING_TEST_KAFKA_SPEC is not set');
  }, 300_000);

  it('prints the same group lines as the Node groups command on the same stream, for each kind of row it exported', async () => {
    for (const s of streams) {
      for (const rows of s.records === 'both' ? ['trajectories', 'transitions'] : [s.records]) {
        const nodeOut = path.join(dir, `node-${s.name}-${rows}.jsonl`);
        const pyOut = path.join(dir, `python-${s.name}-${rows}.jsonl`);
        const common = [
          '--group-size',
          String(GROUP_SIZE),
          '--rows',
          rows,
          '--brokers',
          broker.brokers.join(','),
          '--idle-exit-ms',
          '2000',
          '--group-timeout-ms',
          '1000',
        ];
        const topics = {
          LIGHTNING_KAFKA_TOPIC: s.topic,
          LIGHTNING_KAFKA_TRAJECTORIES_TOPIC: s.trajectories_topic,
          LIGHTNING_KAFKA_EPISODES_TOPIC: s.episodes_topic,
        };
        const [n, p] = await Promise.all([
          run(process.execPath, [MAIN, 'groups', ...common, '--group-id', `node-${s.name}-${rows}`, '--out', nodeOut], topics, 60_000),
          run(
            python!,
            ['-m', 'lightning_sidecar_client', 'groups', ...common, '--group-id', `python-${s.name}-${rows}`, '--out', pyOut],
            { PYTHONPATH: PACKAGE, ...topics },
            60_000,
          ),
        ]);
        expect([n.code, p.code]).toEqual([0, 0]);
        const nodeLines = readFileSync(nodeOut, 'utf8').trim().split('\n').sort();
        const pyLines = readFileSync(pyOut, 'utf8').trim().split('\n').sort();
        expect(pyLines.map((l) => (JSON.parse(l) as { uid: string }).uid)).toEqual(Object.keys(s.groups).sort());
        // Byte for byte: same rows, same token ids, same number formatting.
        expect(pyLines).toEqual(nodeLines);
        if (rows === 'trajectories') for (const l of nodeLines) expect((JSON.parse(l) as { rows?: string }).rows).toBe('trajectories');
        for (const out of [n.stderr, p.stderr]) for (const uid of s.incomplete) expect(out).toContain(`groups: gave up on ${uid}: 1 of ${GROUP_SIZE} episodes`);
      }
    }
  }, 180_000);
});
