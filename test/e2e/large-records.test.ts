import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import type { GroupBatch, TrajectoryGroupBatch } from '../../src/trainer/groups';
import { startChildSidecar } from '../support/child-sidecar';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startKafkaTestBroker, type KafkaTestBroker } from '../support/kafka-broker';
import { runToExit, type Exited } from '../support/run-to-exit';
import { postReward, startSidecar } from '../support/sidecar';

const MAIN = path.join(__dirname, '../../dist/main.js');

/** A 1 MiB user message: "abcdefg " is two tokens for the fake tokenizer, so ~256k prompt tokens. */
const HUGE = 'abcdefg '.repeat(131_072);

function runGroups(args: string[]): Promise<Exited> {
  return runToExit(process.execPath, [MAIN, 'groups', ...args], { timeoutMs: 60_000 });
}

/** What the model server answered for the call at `index`: its prompt and answer ids. */
function served(upstream: FakeModelServer, index: number): { prompt: number[]; answer: number[] } {
  const body = JSON.parse(upstream.responses[index].toString('utf8')) as { prompt_token_ids: number[]; choices: { token_ids: number[] }[] };
  return { prompt: body.prompt_token_ids, answer: body.choices[0].token_ids };
}

describe('transitions of any size reach the trainer', () => {
  let broker: KafkaTestBroker;
  let upstream: FakeModelServer;
  beforeAll(async () => {
    broker = await startKafkaTestBroker();
    upstream = await startFakeModelServer({ flavor: 'vllm' });
  });
  afterAll(async () => {
    await upstream.close();
    await broker.close();
  });

  it('a 256k-token prompt goes through the proxy, is chunked to Kafka, and `groups` emits it with the exact ids; nothing is dead-lettered', async () => {
    const sidecar = await startSidecar(upstream.url, {
      service: { exporter: 'kafka' },
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      exporters: { kafka: { brokers: broker.brokers, connection_timeout_ms: 500 } },
    });
    try {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/huge-1/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': 'g-huge' } });
      await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: HUGE }] });
      const want = served(upstream, upstream.requests.length - 1);
      expect(want.prompt.length).toBeGreaterThan(250_000);
      expect((await postReward(sidecar.origin, 'huge-1', 1)).status).toBe(202);
      const until = Date.now() + 30_000;
      while (!broker.records('lightning.episodes').some((r) => r.value?.toString().includes('"huge-1"')) && Date.now() < until)
        await new Promise((r) => setTimeout(r, 50));
      for (const topic of ['lightning.transitions', 'lightning.trajectories']) {
        const chunks = broker.records(topic).filter((r) => r.key?.toString() === 'g-huge');
        expect(chunks.length).toBeGreaterThan(1);
      }
      expect(existsSync(path.join(sidecar.dataDir, 'dead-letter'))).toBe(false);

      // Trajectory rows (the default) and per-call rows, each from its own topic.
      for (const rows of ['trajectories', 'transitions']) {
        const out = path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-huge-')), 'groups.jsonl');
        const r = await runGroups([
          '--group-size',
          '1',
          '--rows',
          rows,
          '--brokers',
          broker.brokers.join(','),
          '--group-id',
          `huge-${rows}`,
          '--out',
          out,
          '--max-groups',
          '1',
        ]);
        expect(r.code).toBe(0);
        const [g] = readFileSync(out, 'utf8')
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l) as GroupBatch | TrajectoryGroupBatch);
        expect('trajectory_id' in g.batch ? g.batch.trajectory_id : g.batch.transition_id).toEqual([rows === 'trajectories' ? 'huge-1/0/s0' : 'huge-1/0/0']);
        expect(g.batch.prompt_ids[0]).toEqual(want.prompt);
        expect(g.batch.response_ids[0]).toEqual(want.answer);
      }
    } finally {
      await sidecar.stop();
    }
  }, 120_000);

  it('the same prompt through the file exporter: one NDJSON line with the exact ids', async () => {
    const sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    try {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/huge-f/v1`, apiKey: 'k', maxRetries: 0 });
      await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: HUGE }] });
      const want = served(upstream, upstream.requests.length - 1);
      expect((await postReward(sidecar.origin, 'huge-f', 1)).status).toBe(202);
      await sidecar.waitForEpisodes(1, 30_000);
      const [t] = sidecar.transitions();
      expect(t.prompt_token_ids).toEqual(want.prompt);
      expect(t.response_token_ids).toEqual(want.answer);
      expect((t.request as { messages: { content: string }[] }).messages[0].content).toBe(HUGE);
      // The raw response does not repeat the ids lifted out of it.
      expect(t.response as Record<string, unknown>).not.toHaveProperty('prompt_token_ids');
    } finally {
      await sidecar.stop();
    }
  }, 120_000);

  it('a SIGKILL between two chunks of one record leaves no half record for the project consumer', async () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-chunk-kill-'));
    const configFile = path.join(dataDir, 'config.yaml');
    writeFileSync(
      configFile,
      'exporters:\n  kafka:\n    topic: kill.transitions\n    episodes_topic: kill.episodes\n    max_message_bytes: 65536\n    max_batch_bytes: 65536\n    connection_timeout_ms: 500\n',
    );
    const env = {
      LIGHTNING_UPSTREAM_URL: upstream.url,
      LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
      LIGHTNING_DATA_DIR: dataDir,
      LIGHTNING_EXPORTER: 'kafka',
      LIGHTNING_KAFKA_BROKERS: broker.brokers.join(','),
      LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
      LIGHTNING_LOG_LEVEL: 'warn',
      LIGHTNING_CONFIG: configFile,
    };
    const first = await startChildSidecar(env);
    const content = 'abcdefg '.repeat(40_000);
    try {
      const client = new OpenAI({ baseURL: `${first.origin}/rollout/cut-chunks/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': 'g-cut' } });
      await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content }] });
      // Every produce request now takes 300 ms: the record's chunks go one request at a time.
      broker.setLatencyMs(300);
      expect((await postReward(first.origin, 'cut-chunks', 1)).status).toBe(202);
      const until = Date.now() + 20_000;
      while (broker.records('kill.transitions').length === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
      await first.kill('SIGKILL');
    } finally {
      if (first.proc.exitCode === null && first.proc.signalCode === null) await first.kill('SIGKILL');
      broker.setLatencyMs(0);
    }
    const before = broker.records('kill.transitions');
    const count = Number(before[0].headers['lightning-chunk-count']);
    expect(before.length).toBeGreaterThan(0);
    expect(before.length).toBeLessThan(count);

    // After the restart the journal replays the episode and the whole record is sent again.
    const second = await startChildSidecar(env);
    try {
      const out = path.join(dataDir, 'groups.jsonl');
      const r = await runGroups([
        '--group-size',
        '1',
        '--rows',
        'transitions',
        '--brokers',
        broker.brokers.join(','),
        '--config',
        configFile,
        '--group-id',
        'cut',
        '--out',
        out,
        '--max-groups',
        '1',
      ]);
      expect(r.code).toBe(0);
      expect(r.stderr).not.toMatch(/incomplete|cannot be made whole/);
      const lines = readFileSync(out, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as GroupBatch);
      expect(lines).toHaveLength(1);
      expect(lines[0].batch.transition_id).toEqual(['cut-chunks/0/0']);
      expect(lines[0].batch.prompt_ids[0]).toEqual(served(upstream, upstream.requests.length - 1).prompt);
    } finally {
      await second.kill('SIGTERM');
    }
  }, 120_000);
});
