import { appendFileSync, closeSync, existsSync, fsyncSync, openSync, readFileSync, writeSync } from 'node:fs';
import type { Producer } from 'kafkajs';
import { kafkajs } from '../exporters/kafka/kafkajs-producer';
import { ChunkReassembler, type IncompleteRecord } from '../trainer/chunk-reassembly';
import { GroupAssembler, type GroupEvent, type Position } from '../trainer/groups';
import { UsageError, type Command, type CommandSpec } from './command';
import {
  coPartitionedAssigner,
  decodeEpisodeRecord,
  decodeTrajectoryRecord,
  decodeTransitionRecord,
  gaveUpMessage,
  kafkaCommandConfig,
  kafkaForCommand,
} from './kafka-consumer';

const spec: CommandSpec = {
  name: 'groups',
  summary: 'emit complete GRPO groups from Kafka, once each (the reference trainer consumer)',
  synopsis:
    '--group-size N [--rows trajectories|transitions] [--brokers H:P,...] [--group-id ID] [--out FILE | --to-topic T] [--state FILE] [--group-timeout-ms MS] [--max-groups N] [--idle-exit-ms MS]',
  options: {
    'group-size': { type: 'integer', value: 'N', description: 'episodes per group (required)' },
    rows: {
      type: 'string',
      value: 'KIND',
      description: 'trajectories (default: one row per token segment, loss-masked) or transitions (one row per call)',
    },
    brokers: { type: 'string', value: 'H:P,...', description: 'Kafka brokers (default: the config, then $LIGHTNING_KAFKA_BROKERS)' },
    'group-id': { type: 'string', value: 'ID', description: 'Kafka consumer group (default: lightning-groups)' },
    out: { type: 'string', value: 'FILE', description: "append groups to FILE as JSON lines, each fsync'd before offsets move (default: stdout)" },
    'to-topic': { type: 'string', value: 'T', description: 'produce groups to topic T instead' },
    state: { type: 'string', value: 'FILE', description: 'groups already emitted or given up on (default: OUT.state, or ./lightning-groups.state)' },
    'group-timeout-ms': { type: 'integer', value: 'MS', description: 'give up on a group (and a chunked record) after MS (default: 600000)' },
    'max-groups': { type: 'integer', value: 'N', description: 'exit after emitting N groups' },
    'idle-exit-ms': { type: 'integer', value: 'MS', description: 'exit after MS without a message' },
    config: { type: 'string', value: 'FILE', description: 'config file for brokers, topics and Kafka settings (default: $LIGHTNING_CONFIG)' },
  },
  notes: [
    'Reads the trajectories (or transitions) and episodes topics in a consumer group; writes lightning.group.v1 lines (veRL-style batches).',
    'Each group is emitted once, across restarts: offsets are committed only below records still pending.',
    'Chunked records are reassembled and prompt deltas made whole before grouping.',
  ],
};

/**
 * `groups`: the reference trainer-side consumer. Reads transitions and episodes in a consumer
 * group, emits each group of N closed episodes once (JSONL to stdout or a file, or to a topic),
 * commits offsets only below what is still pending (a group, or a record still in chunks), and
 * remembers emitted groups: with `--out FILE` the output file itself (each line is fsync'd before
 * offsets move), otherwise `--state`.
 */
export const groupsCommand: Command = {
  spec,
  async run({ values }, io) {
    const groupSize = values['group-size'] as number | undefined;
    if (groupSize === undefined || groupSize < 1) throw new UsageError('groups: --group-size N is required (a positive whole number)', spec);
    const out = values.out as string | undefined;
    const toTopic = values['to-topic'] as string | undefined;
    if (out !== undefined && toTopic !== undefined) throw new UsageError('groups: --out and --to-topic exclude each other', spec);
    const config = kafkaCommandConfig(values, io);
    const brokers = config.exporters.kafka.brokers;
    if (brokers.length === 0) throw new UsageError('groups: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS)', spec);
    const statePath = (values.state as string | undefined) ?? (out ? `${out}.state` : 'lightning-groups.state');
    const timeoutMs = (values['group-timeout-ms'] as number | undefined) ?? 600_000;
    const maxGroups = (values['max-groups'] as number | undefined) ?? Infinity;
    const idleExitMs = (values['idle-exit-ms'] as number | undefined) ?? Infinity;
    const rows = (values.rows as string | undefined) ?? 'trajectories';
    if (rows !== 'trajectories' && rows !== 'transitions') throw new UsageError(`groups: --rows is trajectories or transitions, not '${rows}'`, spec);
    const topics = {
      records: rows === 'trajectories' ? config.exporters.kafka.trajectories_topic : config.exporters.kafka.topic,
      episodes: config.exporters.kafka.episodes_topic,
    };

    const chunks = new ChunkReassembler({ timeoutMs, maxBytes: 256 * 1024 * 1024 });
    // A group is emitted only once nothing pending (chunks included) comes before it on its partitions.
    const assembler = new GroupAssembler({ groupSize, timeoutMs, rows, blockers: () => chunks.lowestPending() }, loadDone(statePath, out));
    const { kafka } = kafkaForCommand(config, 'groups', io);
    const consumer = kafka.consumer({
      groupId: (values['group-id'] as string | undefined) ?? 'lightning-groups',
      maxWaitTimeInMs: 250,
      partitionAssigners: [coPartitionedAssigner],
    });
    const producer: Producer | null = toTopic ? kafka.producer({ idempotent: true, createPartitioner: kafkajs().Partitioners.DefaultPartitioner }) : null;
    const lastSeen = new Map<string, Position>();
    let outFd: number | null = null;
    let emitted = 0;
    let lastActivity = Date.now();
    let failure: unknown = null;

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
        } else if (ev.kind === 'not_exported') {
          const other = ev.rows === 'trajectories' ? 'transitions' : 'trajectories';
          io.err.write(
            `groups: episode ${ev.rollout_id}/${ev.attempt_id} has no exported ${ev.rows} (exporters.records is ${other}); use --rows ${other} or export ${ev.rows}\n`,
          );
        } else if (ev.kind === 'incomplete') {
          remember(statePath, ev.uid, 'incomplete');
          io.err.write(`groups: gave up on ${ev.uid}: ${ev.episodes} of ${groupSize} episodes after ${ev.waitedMs} ms\n`);
        } else if (ev.kind === 'late') {
          io.err.write(`groups: ignored episode ${ev.rollout_id}/${ev.attempt_id}: group ${ev.uid} is already emitted or full\n`);
        } else if (ev.kind === 'ungrouped') {
          io.err.write(`groups: episode ${ev.rollout_id}/${ev.attempt_id} has no group_id; skipped\n`);
        } else if (ev.kind === 'unresolved_delta') {
          io.err.write(`groups: transition ${ev.transition_id} has a prompt delta that cannot be made whole (${ev.reason}); its row is left out\n`);
        } else {
          io.err.write(`groups: dropped ${ev.records} ${rows} whose episode never arrived\n`);
        }
      }
    }

    const reportDropped = (records: IncompleteRecord[]): void => {
      for (const r of records)
        io.err.write(
          `groups: dropped record ${r.recordId} at ${r.topic}/${r.partition}: ${r.have} of ${r.count} chunks (${r.reason === 'timeout' ? `after ${r.waitedMs} ms` : 'chunk buffer full'})\n`,
        );
    };

    /** Commits, per partition, up to the lowest record still needed (or past the last one seen). */
    async function commit(): Promise<void> {
      const groupsLow = assembler.lowestPending();
      const chunksLow = chunks.lowestPending();
      const offsets = [...lastSeen.entries()].map(([k, p]) => ({
        topic: p.topic,
        partition: p.partition,
        offset: String(Math.min(groupsLow.get(k) ?? Infinity, chunksLow.get(k) ?? Infinity, p.offset + 1)),
      }));
      if (offsets.length > 0) await consumer.commitOffsets(offsets);
    }

    let finish!: () => void;
    const finished = new Promise<void>((r) => (finish = r));
    const stop = (): void => finish();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    // A rebalance: the consumer reads again from the committed offsets, below everything that was
    // pending, so what it owns now is rebuilt from there.
    consumer.on(consumer.events.GROUP_JOIN, (e) => {
      assembler.reset();
      chunks.reset();
      lastSeen.clear();
      const assigned = Object.entries(e.payload.memberAssignment)
        .map(([topic, partitions]) => [topic, [...partitions].sort((x, y) => x - y)] as const)
        .sort(([a], [b]) => (a < b ? -1 : 1));
      const owned = assigned.map(([topic, partitions]) => `${topic} [${partitions.join(',')}]`).join(', ');
      io.err.write(`groups: joined consumer group ${e.payload.groupId}: ${owned || 'no partitions'}\n`);
      // Partition p of one topic without partition p of the other: those groups can never complete here.
      const coPartitioned = assigned.length === 0 || (assigned.length === 2 && assigned[0][1].join(',') === assigned[1][1].join(','));
      if (!coPartitioned)
        io.err.write(
          `groups: this consumer owns ${owned}, not the same partitions of each topic: a group whose records are split between consumers never completes (give the topics as many partitions each, and every consumer of the group this command)\n`,
        );
    });
    consumer.on(consumer.events.CRASH, (e) => {
      if (e.payload.restart) return;
      failure = e.payload.error;
      finish();
    });
    const timer = setInterval(
      () => {
        const now = Date.now();
        reportDropped([...chunks.tick(now), ...chunks.takeEvicted()]);
        void emit(assembler.tick(now))
          .then(commit)
          .catch(() => {});
        if (now - lastActivity > idleExitMs) finish();
      },
      Math.min(1000, Math.max(50, timeoutMs / 4)),
    );
    try {
      await producer?.connect();
      await consumer.connect();
      await consumer.subscribe({ topics: [topics.records, topics.episodes], fromBeginning: true });
      outFd = out ? openSync(out, 'a') : null;
      await consumer.run({
        autoCommit: false,
        eachMessage: async ({ topic, partition, message }) => {
          const now = Date.now();
          lastActivity = now;
          const at: Position = { topic, partition, offset: Number(message.offset) };
          lastSeen.set(`${topic}\u0000${partition}`, at);
          const outcome = chunks.add(at, message.headers, message.value, now);
          reportDropped(chunks.takeEvicted());
          if (outcome.kind === 'invalid')
            io.err.write(`groups: skipping record ${outcome.recordId ?? '?'} at ${topic}/${partition}@${message.offset}: ${outcome.reason}\n`);
          if (outcome.kind !== 'record') {
            await commit();
            return;
          }
          const { record } = outcome;
          let events: GroupEvent[];
          try {
            events =
              topic === topics.episodes
                ? assembler.addEpisode(decodeEpisodeRecord(record), record.pos, now)
                : rows === 'trajectories'
                  ? assembler.addTrajectory(decodeTrajectoryRecord(record), record.pos, now)
                  : assembler.addTransition(decodeTransitionRecord(record), record.pos, now);
          } catch {
            io.err.write(`groups: skipping an undecodable record at ${topic}/${partition}@${record.pos.offset}\n`);
            await commit();
            return;
          }
          await emit(events);
          await commit();
          if (emitted >= maxGroups) finish();
        },
      });
      await finished;
      await commit().catch(() => {});
    } catch (err) {
      failure = err;
    } finally {
      clearInterval(timer);
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      await consumer.disconnect().catch(() => {});
      await producer?.disconnect().catch(() => {});
      if (outFd !== null) closeSync(outFd);
    }
    if (failure !== null) {
      io.err.write(gaveUpMessage('groups', brokers, failure));
      return 1;
    }
    return 0;
  },
};

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
