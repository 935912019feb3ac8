import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { decodeTransition } from '../../src/exporters/kafka/encoding';
import { startChildSidecar, freePort } from '../support/child-sidecar';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { API, ERR, KafkaTestBroker } from '../support/kafka-broker';
import { startSidecar } from '../support/sidecar';

let upstream: FakeModelServer;
beforeAll(async () => {
  upstream = await startFakeModelServer({ flavor: 'vllm' });
});
afterAll(() => upstream.close());

const kafkaOverrides = (broker: KafkaTestBroker, extra: Record<string, unknown> = {}) => ({
  service: { exporter: 'kafka' },
  receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
  exporters: { kafka: { brokers: broker.brokers, connection_timeout_ms: 300, request_timeout_ms: 2000, ...extra } },
  processors: { episodes: { tool_span_wait_ms: 0 } },
});

async function rollout(origin: string, id: string, calls: number): Promise<void> {
  const client = new OpenAI({ baseURL: `${origin}/rollout/${id}/v1`, apiKey: 'k', maxRetries: 0 });
  for (let i = 0; i < calls; i++) await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `${id} ${i}` }] });
  const res = await fetch(`${origin}/lightning/v1/rollouts/${id}/reward`, { method: 'POST', body: '{"value":1}' });
  if (res.status !== 202) throw new Error(`reward not accepted: ${res.status}`);
}

async function until(what: string, fn: () => boolean, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const ids = (broker: KafkaTestBroker) => broker.records('lightning.transitions').map((r) => JSON.parse(r.value!.toString()).transition_id as string);
const expected = (rollouts: string[], calls: number) => rollouts.flatMap((r) => Array.from({ length: calls }, (_, i) => `${r}/0/${i}`)).sort();

describe('delivery to Kafka (test broker)', () => {
  it('serves agents while Kafka is down at start, then delivers every transition once Kafka comes up', async () => {
    const broker = new KafkaTestBroker();
    broker.port = await freePort();
    const sidecar = await startSidecar(upstream.url, kafkaOverrides(broker));
    try {
      await rollout(sidecar.origin, 'down-a', 2);
      await rollout(sidecar.origin, 'down-b', 3);
      const ready = (await (await fetch(`${sidecar.telemetryOrigin}/readyz`)).json()) as { status: string; degraded: Record<string, string> };
      expect(ready).toMatchObject({ status: 'ready', degraded: { kafka: expect.stringContaining('not connected') } });
      const connected = async () => (await (await fetch(`${sidecar.telemetryOrigin}/metrics`)).text()).match(/^lightning_sidecar_kafka_connected (\d)$/m)?.[1];
      expect(await connected()).toBe('0');
      await broker.start();
      await until('5 transitions in Kafka', () => new Set(ids(broker)).size === 5);
      expect(await connected()).toBe('1');
      expect(new Set(ids(broker))).toEqual(new Set([...expected(['down-a'], 2), ...expected(['down-b'], 3)]));
      const [first] = broker.records('lightning.transitions');
      expect(first.key!.toString()).toMatch(/^down-/);
      expect(first.headers).toMatchObject({ 'content-type': 'application/json', 'lightning-schema': 'lightning.transition.v1' });
      await until('2 episodes', () => broker.records('lightning.episodes').length >= 2);
    } finally {
      await sidecar.stop();
      await broker.close();
    }
  });

  it('loses nothing when the broker stops under steady traffic and answers retriable errors; duplicates keep their id', async () => {
    const broker = new KafkaTestBroker();
    await broker.start();
    const sidecar = await startSidecar(upstream.url, kafkaOverrides(broker, { encoding: 'protobuf' }));
    try {
      const names = Array.from({ length: 12 }, (_, i) => `steady-${i}`);
      for (const [i, name] of names.entries()) {
        if (i === 3) await broker.stop();
        if (i === 6) await broker.start();
        if (i === 8) broker.setErrorRate(API.Produce, ERR.NOT_LEADER_OR_FOLLOWER, 0.7);
        await rollout(sidecar.origin, name, 2);
      }
      await until(
        '24 distinct transitions',
        () => new Set(broker.records('lightning.transitions').map((r) => decodeTransition(r.value!, 'protobuf').transition_id)).size === 24,
        40_000,
      );
      broker.setErrorRate(API.Produce, ERR.NOT_LEADER_OR_FOLLOWER, 0);
      const got = broker.records('lightning.transitions').map((r) => decodeTransition(r.value!, 'protobuf'));
      expect(new Set(got.map((t) => t.transition_id))).toEqual(new Set(expected(names, 2)));
      expect(got[0]).toMatchObject({ schema: 'lightning.transition.v1', final_reward: 1, response_token_ids: expect.any(Array) });
      expect(broker.records('lightning.transitions')[0].headers['content-type']).toBe('application/x-protobuf');
    } finally {
      await sidecar.stop();
      await broker.close();
    }
  });

  it('delivers every acknowledged record after a SIGKILL and a restart on the same data dir', async () => {
    const broker = new KafkaTestBroker();
    await broker.start();
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-kill-'));
    const env = {
      LIGHTNING_UPSTREAM_URL: upstream.url,
      LIGHTNING_DATA_DIR: dataDir,
      LIGHTNING_EXPORTER: 'kafka',
      LIGHTNING_KAFKA_BROKERS: broker.brokers[0],
      LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
      LIGHTNING_LOG_LEVEL: 'error',
    };
    const first = await startChildSidecar(env);
    const acked: string[] = [];
    try {
      // Kafka goes away so deliveries pile up in the journal; then the process is killed.
      await rollout(first.origin, 'k-0', 2);
      acked.push('k-0');
      await broker.stop();
      for (let i = 1; i < 4; i++) {
        await rollout(first.origin, `k-${i}`, 2);
        acked.push(`k-${i}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      await first.kill('SIGKILL');
    }
    await broker.start();
    const second = await startChildSidecar(env);
    try {
      await until('8 transitions', () => new Set(ids(broker)).size === 8, 30_000);
      expect(new Set(ids(broker))).toEqual(new Set(expected(acked, 2)));
    } finally {
      expect((await second.kill('SIGTERM')).code).toBe(0);
      await broker.close();
    }
  });

  it('sends a transition above the message limit as chunks the broker takes, bodies and token ids whole', async () => {
    const broker = new KafkaTestBroker({ maxMessageBytes: 200_000 });
    await broker.start();
    const sidecar = await startSidecar(upstream.url, kafkaOverrides(broker, { max_message_bytes: 150_000 }));
    try {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/huge/v1`, apiKey: 'k', maxRetries: 0 });
      await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(400_000) }] });
      await fetch(`${sidecar.origin}/lightning/v1/rollouts/huge/reward`, { method: 'POST', body: '{"value":1}' });
      await until('the episode in Kafka', () => broker.records('lightning.episodes').length === 1);
      const chunks = broker.records('lightning.transitions');
      expect(chunks.length).toBeGreaterThan(2);
      expect(chunks.every((c) => c.value!.length <= 150_000 && c.headers['lightning-record-id'] === 'huge/0/0')).toBe(true);
      const t = JSON.parse(Buffer.concat(chunks.map((c) => c.value!)).toString());
      expect(t.transition_id).toBe('huge/0/0');
      expect(t.request.messages[0].content).toBe('x'.repeat(400_000));
      expect(t.prompt_token_ids.length).toBeGreaterThan(3);
      const m = await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_export_oversize_total');
      expect(m).toContain('action="chunked"} 1');
    } finally {
      await sidecar.stop();
      await broker.close();
    }
  });

  it('keeps records in the journal through a permanent error and delivers them once it clears', async () => {
    const broker = new KafkaTestBroker();
    await broker.start();
    const sidecar = await startSidecar(upstream.url, kafkaOverrides(broker));
    try {
      broker.setErrorRate(API.Produce, 29 /* TOPIC_AUTHORIZATION_FAILED */, 1);
      await rollout(sidecar.origin, 'denied', 1);
      await until('a permanent export error', () => sidecar.logs.some((l) => l.includes('TOPIC_AUTHORIZATION_FAILED') || l.includes('authoriz')), 10_000);
      expect(ids(broker)).toEqual([]);
      broker.setErrorRate(API.Produce, 29, 0);
      await until('the transition after the error cleared', () => ids(broker).includes('denied/0/0'), 20_000);
      const m = await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_export_errors_total');
      expect(m).toMatch(/kind="permanent"\} [1-9]/);
    } finally {
      await sidecar.stop();
      await broker.close();
    }
  });
});

describe('lightning-sidecar tail --kafka', () => {
  it('prints the transitions in the topic, decoded, with a kafkajs consumer', async () => {
    const broker = new KafkaTestBroker();
    await broker.start();
    const sidecar = await startSidecar(upstream.url, kafkaOverrides(broker, { encoding: 'protobuf' }));
    try {
      await rollout(sidecar.origin, 'tail-me', 2);
      await until('2 transitions', () => broker.records('lightning.transitions').length === 2);
      const { execFile } = await import('node:child_process');
      const out = await new Promise<string>((resolve, reject) =>
        execFile(
          process.execPath,
          [path.join(__dirname, '../../dist/main.js'), 'tail', '--kafka', '--brokers', broker.brokers[0], '--from-beginning', '--max', '2'],
          { timeout: 20_000, env: { PATH: process.env.PATH } },
          (err, stdout) => (err ? reject(err) : resolve(stdout)),
        ),
      );
      const lines = out.trim().split('\n');
      expect(lines).toHaveLength(2);
      expect(lines[0]).toMatch(/^tail-me\/0\/0\s+chat\.completions/);
      expect(lines[1]).toMatch(/^tail-me\/0\/1 .*reward=1\.000/);
    } finally {
      await sidecar.stop();
      await broker.close();
    }
  });
});
