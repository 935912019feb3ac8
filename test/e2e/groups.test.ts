import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import OpenAI from 'openai';
import type { Trajectory } from '../../src/model/records';
import type { GroupBatch, TrajectoryGroupBatch } from '../../src/trainer/groups';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { runToExit, type Exited } from '../support/run-to-exit';
import { startKafkaTestBroker, type KafkaTestBroker } from '../support/kafka-broker';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

const MAIN = path.join(__dirname, '../../dist/main.js');

/** Runs `lightning-sidecar groups …` (dist/) to its exit; bounded. */
function runGroups(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return runCli(['groups', ...args]);
}

function runCli(args: string[]): Promise<Exited> {
  return runToExit(process.execPath, [MAIN, ...args]);
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
    const common = ['--group-size', '2', '--rows', 'transitions', '--brokers', broker.brokers.join(','), '--group-id', 'trainer', '--out', out];

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
    expect(committed.map((t) => [t.topic, t.partitions[0].offset])).toEqual([
      ['lightning.transitions', '4'],
      ['lightning.episodes', '2'],
    ]);

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

    const lines = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as GroupBatch);
    expect(lines.map((g) => g.uid)).toEqual(['g1', 'g2']);
    const g2 = lines[1];
    expect(g2).toMatchObject({ schema: 'lightning.group.v1', group_size: 2 });
    expect(g2.episodes.map((e) => [e.rollout_id, e.final_reward])).toEqual([
      ['g2-a', 0.5],
      ['g2-b', 1],
    ]);
    expect(g2.batch.uid).toEqual(['g2', 'g2', 'g2', 'g2']);
    expect(g2.batch.reward).toEqual([0.5, 0.5, 1, 1]);
    for (const [i, ids] of g2.batch.response_ids.entries()) {
      expect(g2.batch.response_mask[i]).toEqual(ids.map(() => 1));
      expect(g2.batch.token_level_scores[i]).toEqual(ids.map((_, k) => (k === ids.length - 1 ? g2.batch.reward[i] : 0)));
      expect(g2.batch.rollout_log_probs[i]).toHaveLength(ids.length);
      expect(g2.batch.prompt_ids[i].length).toBeGreaterThan(0);
    }
  });

  it('emits trajectory rows by default: each row the first prompt, then the rest of its trajectory masked as the record says', async () => {
    const turns = async (id: string, group: string, reward: number) => {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${id}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': group } });
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: `${id} first` }];
      for (let i = 0; i < 3; i++) {
        const reply = await client.chat.completions.create({ model: 'm', messages });
        messages.push({ role: 'assistant', content: reply.choices[0].message.content }, { role: 'user', content: `${id} next ${i}` });
      }
      expect((await postReward(sidecar.origin, id, reward)).status).toBe(202);
    };
    const before = broker.records('lightning.episodes').length;
    await turns('tg-a', 'tg', 1);
    await turns('tg-b', 'tg', 0);
    await delivered(before + 2);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-groups-'));
    const out = path.join(dir, 'groups.jsonl');
    const r = await runGroups([
      '--group-size',
      '2',
      '--brokers',
      broker.brokers.join(','),
      '--group-id',
      'trajectories',
      '--out',
      out,
      '--idle-exit-ms',
      '1500',
      '--group-timeout-ms',
      '800',
    ]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain('emitted tg (2 episodes, 2 rows)');
    const group = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as TrajectoryGroupBatch)
      .find((g) => g.uid === 'tg')!;
    expect(group.rows).toBe('trajectories');
    const records = new Map(
      broker.records('lightning.trajectories').map((m) => {
        const t = JSON.parse(m.value!.toString('utf8')) as Trajectory;
        return [t.trajectory_id, t];
      }),
    );
    expect(group.batch.trajectory_id).toEqual(['tg-a/0/s0', 'tg-b/0/s0']);
    group.batch.trajectory_id.forEach((id, i) => {
      const t = records.get(id)!;
      expect(t.turns).toHaveLength(3);
      expect([...group.batch.prompt_ids[i], ...group.batch.response_ids[i]]).toEqual(t.token_ids);
      expect(group.batch.prompt_ids[i]).toHaveLength(t.prompt_length);
      expect(group.batch.response_mask[i]).toEqual(t.loss_mask.slice(t.prompt_length));
      expect(group.batch.rollout_log_probs[i]).toEqual(t.logprobs!.slice(t.prompt_length));
      // The final reward on the last sampled token, nothing elsewhere (no AIR here).
      const scores = group.batch.token_level_scores[i];
      expect(scores.filter((x) => x !== 0)).toEqual(t.final_reward === 0 ? [] : [t.final_reward]);
      expect(scores[scores.length - 1]).toBe(t.final_reward);
      expect(group.batch.response_mask[i].reduce((a, b) => a + b, 0)).toBe(t.turns.reduce((n, x) => n + x.response_end - x.response_start, 0));
    });
  });
});

describe('groups and tail --kafka read chunked records and prompt deltas (docs/kafka-records.md)', () => {
  let broker: KafkaTestBroker;
  beforeAll(async () => {
    broker = await startKafkaTestBroker();
  });
  afterAll(async () => {
    await broker.close();
  });

  type Message = { key: string; value: Buffer; headers: Record<string, string> };

  function whole(key: string, record: object, schema: string): Message {
    return { key, value: Buffer.from(JSON.stringify(record)), headers: { 'content-type': 'application/json', 'lightning-schema': schema, 'rollout-id': key } };
  }

  /** The chunks a producer sends for a record larger than its message size. */
  function chunks(m: Message, recordId: string, size: number): Message[] {
    const count = Math.ceil(m.value.length / size);
    const sha = createHash('sha256').update(m.value).digest('hex');
    return Array.from({ length: count }, (_, i) => ({
      key: m.key,
      value: m.value.subarray(i * size, Math.min((i + 1) * size, m.value.length)),
      headers: {
        ...m.headers,
        'lightning-chunk': 'v1',
        'lightning-record-id': recordId,
        'lightning-chunk-index': String(i),
        'lightning-chunk-count': String(count),
        'lightning-record-bytes': String(m.value.length),
        'lightning-record-sha256': sha,
      },
    }));
  }

  function transition(rollout: string, seq: number, fields: object): object {
    return {
      schema: 'lightning.transition.v1',
      transition_id: `${rollout}/0/${seq}`,
      rollout_id: rollout,
      attempt_id: '0',
      group_id: 'c1',
      seq,
      choice_index: 0,
      agent_name: null,
      model: 'm',
      policy_version: null,
      api: 'chat.completions',
      request: null,
      response: null,
      streamed: false,
      status: 'ok',
      http_status: 200,
      error: null,
      finish_reason: 'stop',
      usage: null,
      response_logprobs: null,
      continues_previous: seq > 0,
      tool_calls: [],
      intermediate_reward: null,
      final_reward: 1,
      reward: 1,
      credit: null,
      is_last: false,
      episode_status: 'completed',
      truncated: false,
      trace_id: null,
      span_id: null,
      started_at: '2026-01-01T00:00:00Z',
      ended_at: '2026-01-01T00:00:01Z',
      latency_ms: 1,
      ttft_ms: null,
      injected: [],
      ...fields,
    };
  }

  function episode(rollout: string, n: number): object {
    return {
      schema: 'lightning.episode.v1',
      rollout_id: rollout,
      attempt_id: '0',
      group_id: 'c1',
      episode_status: 'completed',
      final_reward: 1,
      rewards: [],
      credit_mode: 'identical',
      transitions: n,
      transition_ids: Array.from({ length: n }, (_, i) => `${rollout}/0/${i}`),
      policy_versions: [],
      policy_version_lag: null,
      started_at: '',
      ended_at: '',
    };
  }

  it('reassembles chunks interleaved with other records and redelivered, rebuilds delta prompts, and never commits past a record still in chunks', async () => {
    const prompt = Array.from({ length: 3000 }, (_, i) => 1000 + i);
    const a0 = whole('c1-a', transition('c1-a', 0, { prompt_token_ids: prompt, response_token_ids: [7, 8] }), 'lightning.transition.v1');
    const a1 = whole(
      'c1-a',
      transition('c1-a', 1, {
        prompt_token_ids: null,
        prompt_token_ids_delta: { previous_transition_id: 'c1-a/0/0', prefix_length: 3002, suffix: [9, 10, 11] },
        response_token_ids: [12],
      }),
      'lightning.transition.v1',
    );
    a1.headers['lightning-prompt-ids'] = 'delta';
    const b0 = whole('c1-b', transition('c1-b', 0, { prompt_token_ids: [1, 2], response_token_ids: [3] }), 'lightning.transition.v1');
    const z0 = whole('z', transition('z', 0, { group_id: 'other', prompt_token_ids: prompt, response_token_ids: [1] }), 'lightning.transition.v1');
    const a0chunks = chunks(a0, 'c1-a/0/0', 4000);
    expect(a0chunks.length).toBeGreaterThanOrEqual(3);
    const zchunks = chunks(z0, 'z/0/0', 4000);
    // z's record (another group) begins after c1's last record: c1 is emitted while z stays in chunks.
    const transitions = [a0chunks[0], b0, a0chunks[1], a0chunks[0], ...a0chunks.slice(2), a1, zchunks[0]];
    const episodeA = whole('c1-a', episode('c1-a', 2), 'lightning.episode.v1');
    const episodes = [...chunks(episodeA, 'episode:c1-a/0', 100), whole('c1-b', episode('c1-b', 1), 'lightning.episode.v1')];

    const kafka = new Kafka({ brokers: broker.brokers, logLevel: logLevel.NOTHING });
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({ topic: 'lightning.transitions', messages: transitions });
    await producer.send({ topic: 'lightning.episodes', messages: episodes });
    await producer.disconnect();

    const out = path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-chunked-')), 'groups.jsonl');
    const r = await runGroups([
      '--group-size',
      '2',
      '--rows',
      'transitions',
      '--brokers',
      broker.brokers.join(','),
      '--group-id',
      'chunked',
      '--out',
      out,
      '--max-groups',
      '1',
    ]);
    expect(r.stderr).toContain('emitted c1 (2 episodes, 3 rows)');
    expect(r.stderr).not.toMatch(/skipping|cannot be made whole/);
    expect(r.code).toBe(0);
    const [g] = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as GroupBatch);
    expect(g.batch.transition_id).toEqual(['c1-a/0/0', 'c1-a/0/1', 'c1-b/0/0']);
    expect(g.batch.prompt_ids).toEqual([prompt, [...prompt, 7, 8, 9, 10, 11], [1, 2]]);

    // z's record is still in chunks: the commit stops at its first chunk.
    const admin = kafka.admin();
    await admin.connect();
    const committed = await admin.fetchOffsets({ groupId: 'chunked', topics: ['lightning.transitions'] });
    await admin.disconnect();
    expect(committed[0].partitions[0].offset).toBe(String(transitions.indexOf(zchunks[0])));

    const tail = await runCli(['tail', '--kafka', '--brokers', broker.brokers.join(','), '--from-beginning', '--max', '3']);
    expect(tail.code).toBe(0);
    const lines = tail.stdout.trim().split('\n');
    expect(lines.map((l) => l.split(/\s+/)[0])).toEqual(['c1-b/0/0', 'c1-a/0/0', 'c1-a/0/1']);
    expect(lines[1]).toContain('tokens=3000→2');
    expect(lines[2]).toContain('tokens=+3→1');
  });
});
