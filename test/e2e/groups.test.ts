import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import OpenAI from 'openai';
import type { GroupBatch } from '../../src/trainer/groups';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startKafkaTestBroker, type KafkaTestBroker } from '../support/kafka-broker';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

const MAIN = path.join(__dirname, '../../dist/main.js');

/** Runs `lightning-sidecar groups …` (dist/) to its exit; bounded. */
function runGroups(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [MAIN, 'groups', ...args], { env: { PATH: process.env.PATH ?? '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c));
    p.stderr.on('data', (c: Buffer) => (stderr += c));
    const kill = setTimeout(() => p.kill('SIGKILL'), 30_000);
    p.once('error', reject);
    p.once('exit', (code) => {
      clearTimeout(kill);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('lightning-sidecar groups (reference trainer consumer, test broker)', () => {
  let broker: KafkaTestBroker;
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;

  beforeAll(async () => {
    broker = await startKafkaTestBroker();
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, {
      service: { exporter: 'kafka' },
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      exporters: { kafka: { brokers: broker.brokers, connection_timeout_ms: 500 } },
    });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
    await broker.close();
  });

  async function rollout(id: string, group: string, reward: number): Promise<void> {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${id}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': group } });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `${id} step 1` }] });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `${id} step 2` }] });
    expect((await postReward(sidecar.origin, id, reward)).status).toBe(202);
  }

  async function delivered(episodes: number): Promise<void> {
    for (let i = 0; i < 400 && broker.records('lightning.episodes').length < episodes; i++) await new Promise((r) => setTimeout(r, 25));
    expect(broker.records('lightning.episodes')).toHaveLength(episodes);
  }

  it('emits each complete group exactly once across a restart, ignores redelivered duplicates, and reports a group that never completes', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-groups-'));
    const out = path.join(dir, 'groups.jsonl');
    const common = ['--group-size', '2', '--brokers', broker.brokers.join(','), '--group-id', 'trainer', '--out', out];

    await rollout('g1-a', 'g1', 1);
    await rollout('g1-b', 'g1', 0);
    await rollout('g2-a', 'g2', 0.5); // g2 is not complete yet
    await delivered(3);
    const first = await runGroups([...common, '--max-groups', '1']);
    expect(first.code).toBe(0);
    expect(first.stderr).toContain('emitted g1 (2 episodes, 4 rows)');

    // Offsets were committed up to, not past, what g2 (still open) needs: g2-a's records.
    const kafka = new Kafka({ brokers: broker.brokers, logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    const committed = await admin.fetchOffsets({ groupId: 'trainer', topics: ['lightning.transitions', 'lightning.episodes'] });
    await admin.disconnect();
    expect(committed.map((t) => [t.topic, t.partitions[0].offset])).toEqual([['lightning.transitions', '4'], ['lightning.episodes', '2']]);

    // The exporter redelivers g1 (at-least-once) and g2 completes while the consumer is down.
    const producer = kafka.producer();
    await producer.connect();
    for (const topic of ['lightning.transitions', 'lightning.episodes']) {
      const again = broker.records(topic).filter((r) => r.value!.toString().includes('"g1"'));
      await producer.send({ topic, messages: again.map((r) => ({ key: r.key, value: r.value, headers: { 'content-type': 'application/json' } })) });
    }
    await producer.disconnect();
    await rollout('g2-b', 'g2', 1);
    await rollout('g3-a', 'g3', 1); // g3 never completes
    await delivered(7); // 3 + 2 redelivered + g2-b + g3-a

    const second = await runGroups([...common, '--idle-exit-ms', '1500', '--group-timeout-ms', '800']);
    expect(second.code).toBe(0);
    expect(second.stderr).toContain('emitted g2 (2 episodes, 4 rows)');
    expect(second.stderr).not.toContain('emitted g1');
    expect(second.stderr).toMatch(/gave up on g3: 1 of 2 episodes/);

    const lines = readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as GroupBatch);
    expect(lines.map((g) => g.uid)).toEqual(['g1', 'g2']);
    const g2 = lines[1];
    expect(g2).toMatchObject({ schema: 'lightning.group.v1', group_size: 2 });
    expect(g2.episodes.map((e) => [e.rollout_id, e.final_reward])).toEqual([['g2-a', 0.5], ['g2-b', 1]]);
    expect(g2.batch.uid).toEqual(['g2', 'g2', 'g2', 'g2']);
    expect(g2.batch.reward).toEqual([0.5, 0.5, 1, 1]);
    for (const [i, ids] of g2.batch.response_ids.entries()) {
      expect(g2.batch.response_mask[i]).toEqual(ids.map(() => 1));
      expect(g2.batch.token_level_scores[i]).toEqual(ids.map((_, k) => (k === ids.length - 1 ? g2.batch.reward[i] : 0)));
      expect(g2.batch.rollout_log_probs[i]).toHaveLength(ids.length);
      expect(g2.batch.prompt_ids[i].length).toBeGreaterThan(0);
    }
  });
});
