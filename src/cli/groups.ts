import { appendFileSync, closeSync, existsSync, fsyncSync, openSync, readFileSync, writeSync } from 'node:fs';
import { Kafka, logLevel, type Producer } from 'kafkajs';
import { loadConfig } from '../config/load';
import { decodeEpisode, decodeTransition, type Encoding } from '../exporters/kafka/encoding';
import { GroupAssembler, type GroupEvent, type Position } from '../trainer/groups';
import { option, type TailIo } from './tail';

export const GROUPS_USAGE = `  lightning-sidecar groups --group-size N [--brokers H:P,...] [--group-id ID] [--out FILE | --to-topic T]
                          [--state FILE] [--group-timeout-ms MS] [--max-groups N] [--idle-exit-ms MS]
                                              emit complete GRPO groups (lightning.group.v1) from the transitions
                                              and episodes topics, in a Kafka consumer group
`;

/**
 * `groups`: the reference trainer-side consumer. Reads transitions and episodes in a consumer
 * group, emits each group of N closed episodes once (JSONL to stdout or a file, or to a topic),
 * commits offsets only below what is still pending, and remembers emitted groups: with `--out
 * FILE` the output file itself (each line is fsync'd before offsets move), otherwise `--state`.
 */
export async function runGroups(args: string[], io: TailIo): Promise<number> {
  const config = loadConfig({ file: option(args, '--config') ?? (io.env.LIGHTNING_CONFIG || undefined), env: io.env });
  const groupSize = Number(option(args, '--group-size'));
  if (!Number.isInteger(groupSize) || groupSize < 1) {
    io.err.write(`groups: --group-size N is required (a positive integer)\n${GROUPS_USAGE}`);
    return 2;
  }
  const brokers = option(args, '--brokers')?.split(',') ?? config.exporters.kafka.brokers;
  if (brokers.length === 0) {
    io.err.write('groups: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS)\n');
    return 2;
  }
  const out = option(args, '--out');
  const toTopic = option(args, '--to-topic');
  const statePath = option(args, '--state') ?? (out ? `${out}.state` : 'lightning-groups.state');
  const timeoutMs = Number(option(args, '--group-timeout-ms') ?? 600_000);
  const maxGroups = Number(option(args, '--max-groups') ?? Infinity);
  const idleExitMs = Number(option(args, '--idle-exit-ms') ?? Infinity);
  const topics = { transitions: config.exporters.kafka.topic, episodes: config.exporters.kafka.episodes_topic };

  const done = loadDone(statePath, out);
  const assembler = new GroupAssembler({ groupSize, timeoutMs }, done);
  const kafka = new Kafka({ clientId: 'lightning-sidecar-groups', brokers, logLevel: logLevel.ERROR });
  const consumer = kafka.consumer({ groupId: option(args, '--group-id') ?? 'lightning-groups', maxWaitTimeInMs: 250 });
  let producer: Producer | null = null;
  if (toTopic) {
    producer = kafka.producer({ idempotent: true });
    await producer.connect();
  }
  const outFd = out ? openSync(out, 'a') : null;
  const lastSeen = new Map<string, Position>();
  let emitted = 0;
  let lastActivity = Date.now();

  async function emit(events: GroupEvent[]): Promise<void> {
    for (const ev of events) {
      if (ev.kind === 'group') {
        const line = JSON.stringify(ev.batch) + '\n';
        if (outFd !== null) {
          writeSync(outFd, line);
          fsyncSync(outFd);
        } else if (producer) {
          await producer.send({ topic: toTopic!, acks: -1, messages: [{ key: ev.batch.uid, value: line.trimEnd() }] });
          remember(statePath, ev.batch.uid, 'emitted');
        } else {
          io.out.write(line);
          remember(statePath, ev.batch.uid, 'emitted');
        }
        emitted++;
        io.err.write(`groups: emitted ${ev.batch.uid} (${ev.batch.episodes.length} episodes, ${ev.batch.batch.uid.length} rows)\n`);
      } else if (ev.kind === 'incomplete') {
        remember(statePath, ev.uid, 'incomplete');
        io.err.write(`groups: gave up on ${ev.uid}: ${ev.episodes} of ${groupSize} episodes after ${ev.waitedMs} ms\n`);
      } else if (ev.kind === 'late') {
        io.err.write(`groups: ignored episode ${ev.rollout_id}/${ev.attempt_id}: group ${ev.uid} is already emitted or full\n`);
      } else if (ev.kind === 'ungrouped') {
        io.err.write(`groups: episode ${ev.rollout_id}/${ev.attempt_id} has no group_id; skipped\n`);
      } else {
        io.err.write(`groups: dropped ${ev.transitions} transitions whose episode never arrived\n`);
      }
    }
  }

  /** Commits, per partition, up to the lowest record still needed (or past the last one seen). */
  async function commit(): Promise<void> {
    const low = assembler.lowestPending();
    const offsets = [...lastSeen.entries()].map(([k, p]) => ({ topic: p.topic, partition: p.partition, offset: String(Math.min(low.get(k) ?? Infinity, p.offset + 1)) }));
    if (offsets.length > 0) await consumer.commitOffsets(offsets);
  }

  await consumer.connect();
  await consumer.subscribe({ topics: [topics.transitions, topics.episodes], fromBeginning: true });
  let finish!: () => void;
  const finished = new Promise<void>((r) => (finish = r));
  process.once('SIGINT', () => finish());
  process.once('SIGTERM', () => finish());
  const timer = setInterval(() => {
    void emit(assembler.tick(Date.now())).then(commit).catch(() => {});
    if (Date.now() - lastActivity > idleExitMs) finish();
  }, Math.min(1000, Math.max(50, timeoutMs / 4)));
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ topic, partition, message }) => {
      lastActivity = Date.now();
      const pos: Position = { topic, partition, offset: Number(message.offset) };
      lastSeen.set(`${topic}\u0000${partition}`, pos);
      const encoding: Encoding = message.headers?.['content-type']?.toString() === 'application/x-protobuf' ? 'protobuf' : 'json';
      const bytes = message.value ?? Buffer.alloc(0);
      let events: GroupEvent[];
      try {
        events = topic === topics.episodes ? assembler.addEpisode(decodeEpisode(bytes, encoding), pos, Date.now()) : assembler.addTransition(decodeTransition(bytes, encoding) as never, pos, Date.now());
      } catch {
        io.err.write(`groups: skipping an undecodable message at ${topic}/${partition}@${message.offset}\n`);
        return;
      }
      await emit(events);
      await commit();
      if (emitted >= maxGroups) finish();
    },
  });
  await finished;
  clearInterval(timer);
  await commit().catch(() => {});
  await consumer.disconnect();
  await producer?.disconnect();
  if (outFd !== null) closeSync(outFd);
  return 0;
}

/** uids already handled: the output file's groups and the state file's lines. */
function loadDone(statePath: string, out: string | undefined): Set<string> {
  const done = new Set<string>();
  for (const file of [out, statePath]) {
    if (!file || !existsSync(file)) continue;
    for (const line of readFileSync(file, 'utf8').split('\n')) {
      if (!line.trim()) continue;
      try {
        const o = JSON.parse(line) as { uid?: unknown };
        if (typeof o.uid === 'string') done.add(o.uid);
      } catch {
        // A torn last line (crash mid-write) is not a record.
      }
    }
  }
  return done;
}

function remember(statePath: string, uid: string, status: 'emitted' | 'incomplete'): void {
  const fd = openSync(statePath, 'a');
  try {
    appendFileSync(fd, JSON.stringify({ uid, status, at: new Date().toISOString() }) + '\n');
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
