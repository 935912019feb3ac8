import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Kafka, logLevel, Partitioners } from 'kafkajs';
import OpenAI from 'openai';
import type { TrajectoryGroupBatch } from '../../src/trainer/groups';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startKafkaTestBroker, type KafkaTestBroker } from '../support/kafka-broker';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Trainers scale out on Kafka: two agent pods (two sidecars) write GRPO groups whose rollouts are
 * split across the pods, to topics of 6 partitions; `groups` consumers share one consumer group,
 * one of them is killed mid-stream and another joins. Every group comes out once, whole, across
 * their outputs.
 */

const MAIN = path.join(__dirname, '../../dist/main.js');
const ROOT = path.join(__dirname, '../..');
/** A python3 with confluent-kafka (the Python client's consumers), or null. */
const python =
  ['/usr/bin/python3', 'python3'].find((p) => spawnSync(p, ['-c', 'import confluent_kafka, google.protobuf'], { stdio: 'ignore' }).status === 0) ?? null;
const GROUP_SIZE = 3;
const PARTITIONS = 6;

/** The partition the sidecar's producer (kafkajs' default partitioner) picks for a key. */
const partitionOf = (() => {
  const partitioner = Partitioners.DefaultPartitioner();
  const partitionMetadata = Array.from({ length: PARTITIONS }, (_, i) => ({ partitionId: i, leader: 0, partitionErrorCode: 0, replicas: [0], isr: [0] }));
  return (key: string) => partitioner({ topic: 't', partitionMetadata, message: { key, value: null } });
})();

/** Group ids `{prefix}{n}`, the first one that lands on each partition. */
function uidsByPartition(prefix: string): string[] {
  const out: string[] = new Array<string>(PARTITIONS);
  for (let n = 0, found = 0; found < PARTITIONS && n < 10_000; n++) {
    const p = partitionOf(`${prefix}${n}`);
    if (out[p] === undefined) {
      out[p] = `${prefix}${n}`;
      found++;
    }
  }
  return out;
}

interface Consumer {
  name: string;
  out: string;
  proc: ChildProcess;
  stderr: string;
  exited: Promise<number | null>;
}

describe('groups consumers in one consumer group (6 partitions, 2 sidecars)', () => {
  let broker: KafkaTestBroker;
  let upstream: FakeModelServer;
  const pods: TestSidecar[] = [];
  const consumers: Consumer[] = [];
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-scale-out-'));
  /** The groups the sidecars wrote (for the Python consumers). */
  const allGroups: string[] = [];

  beforeAll(async () => {
    broker = await startKafkaTestBroker({ defaultPartitions: PARTITIONS });
    upstream = await startFakeModelServer({ flavor: 'vllm', script: (r) => ({ content: `reply ${(r.json?.messages as unknown[]).length}` }) });
    for (let i = 0; i < 2; i++)
      pods.push(
        await startSidecar(upstream.url, {
          service: { exporter: 'kafka' },
          receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
          exporters: { records: 'trajectories', kafka: { brokers: broker.brokers, connection_timeout_ms: 500 } },
        }),
      );
  });
  afterAll(async () => {
    for (const c of consumers) c.proc.kill('SIGKILL');
    for (const p of pods) await p.stop();
    await upstream?.close();
    await broker?.close();
  });

  function startConsumer(name: string): Consumer {
    const out = path.join(dir, `${name}.jsonl`);
    const proc = spawn(
      process.execPath,
      [MAIN, 'groups', '--group-size', String(GROUP_SIZE), '--brokers', broker.brokers.join(','), '--group-id', 'trainers', '--out', out],
      { env: { PATH: process.env.PATH ?? '' }, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    const c: Consumer = { name, out, proc, stderr: '', exited: new Promise((r) => proc.once('exit', r)) };
    proc.stderr!.on('data', (d: Buffer) => (c.stderr += d.toString()));
    consumers.push(c);
    return c;
  }

  /** Rollouts `from`… of a group of 3, each of 2 calls that continue each other, spread over the two pods. */
  async function group(uid: string, from = 0, to = GROUP_SIZE): Promise<void> {
    for (let k = from; k < to; k++) {
      const pod = pods[k % 2];
      const rollout = `${uid}-r${k}`;
      const client = new OpenAI({ baseURL: `${pod.origin}/rollout/${rollout}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': uid } });
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: `${rollout} question` }];
      const reply = await client.chat.completions.create({ model: 'm', messages });
      messages.push({ role: 'assistant', content: reply.choices[0].message.content }, { role: 'user', content: 'and?' });
      await client.chat.completions.create({ model: 'm', messages });
      expect((await postReward(pod.origin, rollout, k / 2)).status).toBe(202);
    }
  }

  /** Groups in every consumer's output. */
  const emitted = (): TrajectoryGroupBatch[] =>
    consumers.flatMap((c) =>
      existsSync(c.out)
        ? readFileSync(c.out, 'utf8')
            .split('\n')
            .filter((l) => l.trim() !== '')
            .map((l) => JSON.parse(l) as TrajectoryGroupBatch)
        : [],
    );

  async function until(check: () => boolean, ms: number): Promise<void> {
    const end = Date.now() + ms;
    while (!check() && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
  }

  it('emits every group exactly once, whole, across consumers that join, crash mid-group and join again', async () => {
    const a = startConsumer('a');
    const b = startConsumer('b');
    // Both in the group, each owning partitions (the last assignment each printed).
    const owns = (c: Consumer) => /joined consumer group trainers: (?!no partitions)[^\n]*\n(?![\s\S]*joined consumer group)/.test(c.stderr);
    await until(() => owns(a) && owns(b), 30_000);
    expect([owns(a), owns(b)]).toEqual([true, true]);
    // One group on each partition: both consumers own some (partition p of both topics each).
    const first = uidsByPartition('g');
    for (const uid of first) await group(uid);
    await until(() => emitted().length >= PARTITIONS, 30_000);
    if (process.env.DEBUG_SCALE) process.stderr.write(`a: ${a.stderr}\nb: ${b.stderr}\n`);
    expect(
      emitted()
        .map((g) => g.uid)
        .sort(),
    ).toEqual([...first].sort());
    const uidsOf = (c: Consumer) =>
      (existsSync(c.out) ? readFileSync(c.out, 'utf8').trim().split('\n').filter(Boolean) : []).map((l) => (JSON.parse(l) as { uid: string }).uid);
    const ofA = first.map((uid, p) => ({ uid, p })).filter((x) => uidsOf(a).includes(x.uid));
    expect(ofA.length).toBeGreaterThan(0);
    expect(uidsOf(b).length).toBeGreaterThan(0);

    // Mid-stream: a group on one of a's partitions gets 2 of its 3 rollouts; a crashes and c joins;
    // then the third rollout comes. The group's first records are below a's committed offsets, so
    // whoever owns the partition next rebuilds it from there.
    const partition = ofA[0].p;
    const mid = uidsByPartition('mid')[partition];
    await group(mid, 0, 2);
    await new Promise((r) => setTimeout(r, 1500));
    a.proc.kill('SIGKILL');
    await a.exited;
    startConsumer('c');
    await group(mid, 2, 3);
    for (const uid of uidsByPartition('h')) await group(uid);
    // The crashed member's partitions move at the next rebalance (at the latest when its session expires: kafkajs, 30 s).
    await until(() => emitted().length >= 2 * PARTITIONS + 1, 75_000);
    const groups = emitted();
    expect(groups.map((g) => g.uid).sort()).toEqual([...first, mid, ...uidsByPartition('h')].sort());
    for (const g of groups) {
      expect(g.episodes.map((e) => e.rollout_id)).toEqual([`${g.uid}-r0`, `${g.uid}-r1`, `${g.uid}-r2`]);
      expect(g.batch.trajectory_id).toEqual([`${g.uid}-r0/0/s0`, `${g.uid}-r1/0/s0`, `${g.uid}-r2/0/s0`]);
      expect(g.batch.turns).toEqual([2, 2, 2]);
    }
    expect(uidsOf(a)).not.toContain(mid);
    for (const c of consumers) expect(c.stderr).not.toMatch(/gave up on|ignored episode/);
    expect(b.proc.exitCode).toBeNull();
    allGroups.push(...groups.map((g) => g.uid));
  }, 150_000);

  it('warns when a consumer owns a partition of one topic but not of the other (topics of unequal partition counts)', async () => {
    const admin = new Kafka({ brokers: broker.brokers, logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    await admin.createTopics({
      topics: [
        { topic: 'skew.trajectories', numPartitions: 2 },
        { topic: 'skew.episodes', numPartitions: 1 },
      ],
    });
    await admin.disconnect();
    // Not spawnSync: the test broker runs in this process and must keep answering.
    const p = spawn(
      process.execPath,
      [MAIN, 'groups', '--group-size', '2', '--brokers', broker.brokers.join(','), '--group-id', 'skew', '--idle-exit-ms', '1500'],
      {
        env: { PATH: process.env.PATH ?? '', LIGHTNING_KAFKA_TRAJECTORIES_TOPIC: 'skew.trajectories', LIGHTNING_KAFKA_EPISODES_TOPIC: 'skew.episodes' },
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    const r = { stderr: '', status: null as number | null };
    p.stderr.on('data', (c: Buffer) => (r.stderr += c.toString()));
    const kill = setTimeout(() => p.kill('SIGKILL'), 30_000);
    r.status = await new Promise<number | null>((resolve) => p.once('exit', resolve));
    clearTimeout(kill);
    expect(r.status).toBe(0);
    expect(r.stderr).toContain('groups: joined consumer group skew: skew.episodes [0], skew.trajectories [0,1]');
    expect(r.stderr).toContain('not the same partitions of each topic');
  });

  // The Python client's consumers on the same records (copied to fresh topics in two waves by the
  // script, which kills one of its consumers and adds one between them).
  (python || process.env.CI === 'true' ? it : it.skip)(
    'the Python client: every group once across consumers that join, crash and join again',
    async () => {
      expect(python).not.toBeNull();
      expect(allGroups.length).toBe(2 * PARTITIONS + 1);
      const spec = path.join(dir, 'spec.json');
      writeFileSync(
        spec,
        JSON.stringify({
          brokers: broker.brokers.join(','),
          group_size: GROUP_SIZE,
          scale_out: {
            partitions: PARTITIONS,
            consumers: 2,
            rows: 'trajectories',
            source: { records_topic: 'lightning.trajectories', episodes_topic: 'lightning.episodes', groups: allGroups, incomplete: [] },
          },
        }),
      );
      const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
        const p = spawn(python!, [path.join(ROOT, 'clients/python/tests/scale_out.py'), spec], {
          env: { PATH: process.env.PATH ?? '', PYTHONPATH: path.join(ROOT, 'clients/python') },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let out = '';
        p.stdout.on('data', (c: Buffer) => (out += c));
        p.stderr.on('data', (c: Buffer) => (out += c));
        const kill = setTimeout(() => p.kill('SIGKILL'), 150_000);
        p.once('exit', (code) => {
          clearTimeout(kill);
          resolve({ code, out });
        });
      });
      if (r.code !== 0) throw new Error(`scale_out.py exited ${r.code}:\n${r.out}`);
      expect(r.out).toMatch(new RegExp(`${allGroups.length} groups, ${allGroups.length} emitted; twice: \\[\\]; missing: \\[\\]`));
    },
    180_000,
  );
});
