import { statSync } from 'node:fs';
import type { Producer } from 'kafkajs';
import type { Config } from '../config/schema';
import type { EpisodeSummary } from '../model/records';
import { kafkajs } from '../exporters/kafka/kafkajs-producer';
import { GroupAssembler, type GroupEvent, type Position } from '../trainer/groups';
import { UsageError, type CliIo, type Command, type CommandSpec, type ParsedValues } from './command';
import { ChunkedMessages, ConsumerRun } from './consumer-runner';
import { groupsFromFiles } from './groups-files';
import { GroupOutput, type GroupsRun } from './groups-output';
import { EpisodeTally, loadDone, stateLine } from './groups-state';
import {
  coPartitionedAssigner,
  decodeEpisodeRecord,
  decodeTrajectoryRecord,
  decodeTransitionRecord,
  kafkaCommandConfig,
  kafkaForCommand,
} from './kafka-consumer';

const spec: CommandSpec = {
  name: 'groups',
  summary: "emit complete GRPO groups from Kafka or the file exporter's files, once each (the reference trainer consumer)",
  synopsis: [
    '--group-size N [--rows trajectories|transitions] [--brokers H:P,...] [--group-id ID] [--out FILE | --to-topic T] [--state FILE] [--group-timeout-ms MS] [--max-groups N] [--idle-exit-ms MS]',
    '--group-size N --data-dir DIR [--follow [--idle-exit-ms MS]] [--rows trajectories|transitions] [--out FILE] [--state FILE] [--group-timeout-ms MS] [--max-groups N]',
  ],
  options: {
    'group-size': { type: 'integer', value: 'N', description: 'episodes per group (required)' },
    rows: {
      type: 'string',
      value: 'KIND',
      description: 'trajectories (default: one row per token segment, loss-masked) or transitions (one row per call)',
    },
    brokers: { type: 'string', value: 'H:P,...', description: 'Kafka brokers (default: the config, then $LIGHTNING_KAFKA_BROKERS)' },
    'group-id': { type: 'string', value: 'ID', description: 'Kafka consumer group (default: lightning-groups)' },
    'data-dir': { type: 'string', value: 'DIR', description: "read the file exporter's files in DIR (the sidecar's data_dir) instead of Kafka" },
    follow: { type: 'boolean', description: 'with --data-dir: keep reading as the sidecar writes (default: read what is there and exit)' },
    out: { type: 'string', value: 'FILE', description: "append groups to FILE as JSON lines, each fsync'd before offsets move (default: stdout)" },
    'to-topic': { type: 'string', value: 'T', description: 'produce groups to topic T instead' },
    state: { type: 'string', value: 'FILE', description: 'groups already emitted or given up on (default: OUT.state, or ./lightning-groups.state)' },
    'group-timeout-ms': { type: 'integer', value: 'MS', description: 'give up on a group (and a chunked record) after MS (default: 600000)' },
    'max-groups': { type: 'integer', value: 'N', description: 'exit after emitting N groups' },
    'idle-exit-ms': { type: 'integer', value: 'MS', description: 'exit after MS without a message (with --data-dir: a new line)' },
    config: { type: 'string', value: 'FILE', description: 'config file for brokers, topics and Kafka settings (default: $LIGHTNING_CONFIG)' },
  },
  notes: [
    'Reads the trajectories (or transitions) and episodes topics in a consumer group; writes lightning.group.v1 lines (veRL-style batches).',
    'Each group is emitted once, across restarts: offsets are committed only below records still pending.',
    'Chunked records are reassembled and prompt deltas made whole before grouping.',
    'With --data-dir, reads DIR/trajectories/ (or transitions/) and DIR/episodes/*.ndjson once, or as they grow with --follow; the state file keeps a later run from emitting a group again.',
  ],
};

/** Options that only mean something on Kafka. */
const KAFKA_ONLY = ['brokers', 'group-id', 'to-topic', 'config'] as const;

/**
 * `groups`: the reference trainer-side consumer. Reads trajectories (or transitions) and episodes,
 * from Kafka in a consumer group or from the file exporter's files (`--data-dir`), emits each
 * group of N closed episodes once (JSONL to stdout or a file, or to a topic), and remembers
 * emitted groups: with `--out FILE` the output file itself (each line is fsync'd before offsets
 * move), otherwise `--state`. On Kafka, offsets are committed only below what is still pending (a
 * group, or a record still in chunks). A run that emits nothing says why.
 */
export const groupsCommand: Command = {
  spec,
  async run({ values }, io) {
    const run = runOptions(values);
    const dataDir = values['data-dir'] as string | undefined;
    if (dataDir !== undefined) {
      const kafkaOnly = KAFKA_ONLY.find((o) => values[o] !== undefined);
      if (kafkaOnly)
        throw new UsageError(`groups: --data-dir and --${kafkaOnly} exclude each other (--data-dir reads files; --${kafkaOnly} is for Kafka)`, spec);
      // Followed, the directory may be one a sidecar still starting creates; read once, a missing one is a typo.
      if (values.follow !== true && !isDirectory(dataDir))
        throw new UsageError(`groups: --data-dir ${dataDir} is not a directory (give the file exporter's data directory, or --follow to wait for it)`, spec);
      if (values['idle-exit-ms'] !== undefined && values.follow !== true)
        throw new UsageError('groups: --idle-exit-ms needs --follow with --data-dir (without it the files are read once and the command exits)', spec);
    } else if (values.follow === true) throw new UsageError('groups: --follow needs --data-dir (Kafka is read until --idle-exit-ms or a signal)', spec);
    const config = dataDir === undefined ? kafkaConfig(values, io) : null;

    const done = loadDone(run.statePath, run.out);
    const tally = new EpisodeTally(done);
    const start = stateLine(done);
    if (start) io.err.write(start);
    const { code, emitted } =
      dataDir !== undefined
        ? await groupsFromFiles(run, { dir: dataDir, follow: values.follow === true }, done.uids, tally, io)
        : await groupsFromKafka(run, config!, values, done.uids, tally, io);
    if (code === 0 && emitted === 0) io.err.write(tally.noGroupLine(run.groupSize));
    return code;
  },
};

/** The options both sources share, checked. */
function runOptions(values: ParsedValues): GroupsRun {
  const groupSize = values['group-size'] as number | undefined;
  if (groupSize === undefined || groupSize < 1) throw new UsageError('groups: --group-size N is required (a positive whole number)', spec);
  const out = values.out as string | undefined;
  if (out !== undefined && values['to-topic'] !== undefined) throw new UsageError('groups: --out and --to-topic exclude each other', spec);
  const rows = (values.rows as string | undefined) ?? 'trajectories';
  if (rows !== 'trajectories' && rows !== 'transitions') throw new UsageError(`groups: --rows is trajectories or transitions, not '${rows}'`, spec);
  return {
    groupSize,
    rows,
    out,
    statePath: (values.state as string | undefined) ?? (out ? `${out}.state` : 'lightning-groups.state'),
    timeoutMs: (values['group-timeout-ms'] as number | undefined) ?? 600_000,
    maxGroups: (values['max-groups'] as number | undefined) ?? Infinity,
    idleExitMs: (values['idle-exit-ms'] as number | undefined) ?? Infinity,
  };
}

function isDirectory(dir: string): boolean {
  return statSync(dir, { throwIfNoEntry: false })?.isDirectory() ?? false;
}

function kafkaConfig(values: ParsedValues, io: CliIo): Config {
  const config = kafkaCommandConfig(values, io);
  if (config.exporters.kafka.brokers.length === 0)
    throw new UsageError('groups: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS, or --data-dir DIR for the file exporter)', spec);
  return config;
}

async function groupsFromKafka(
  run: GroupsRun,
  config: Config,
  values: ParsedValues,
  done: Set<string>,
  tally: EpisodeTally,
  io: CliIo,
): Promise<{ code: number; emitted: number }> {
  const { groupSize, rows, timeoutMs, maxGroups, idleExitMs } = run;
  const brokers = config.exporters.kafka.brokers;
  const toTopic = values['to-topic'] as string | undefined;
  const topics = {
    records: rows === 'trajectories' ? config.exporters.kafka.trajectories_topic : config.exporters.kafka.topic,
    episodes: config.exporters.kafka.episodes_topic,
  };

  const messages = new ChunkedMessages(
    'groups',
    io,
    timeoutMs,
    (r) =>
      `${r.recordId} at ${r.topic}/${r.partition}: ${r.have} of ${r.count} chunks (${r.reason === 'timeout' ? `after ${r.waitedMs} ms` : 'chunk buffer full'})`,
  );
  const chunks = messages.chunks;
  // A group is emitted only once nothing pending (chunks included) comes before it on its partitions.
  const assembler = new GroupAssembler({ groupSize, timeoutMs, rows, blockers: () => chunks.lowestPending() }, new Set(done));
  const { kafka } = kafkaForCommand(config, 'groups', io);
  const consumer = kafka.consumer({
    groupId: (values['group-id'] as string | undefined) ?? 'lightning-groups',
    maxWaitTimeInMs: 250,
    partitionAssigners: [coPartitionedAssigner],
  });
  const producer: Producer | null = toTopic ? kafka.producer({ idempotent: true, createPartitioner: kafkajs().Partitioners.DefaultPartitioner }) : null;
  const output = new GroupOutput(run, io, producer ? { producer, topic: toTopic! } : undefined);
  const session = new ConsumerRun('groups', io, consumer, brokers);
  const lastSeen = new Map<string, Position>();
  let lastActivity = Date.now();
  const emit = (events: GroupEvent[]): Promise<void> => output.write(events);
  const tallied = (e: EpisodeSummary): EpisodeSummary => {
    tally.note(e);
    return e;
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
  const code = await session.run({
    timer: {
      everyMs: Math.min(1000, Math.max(50, timeoutMs / 4)),
      tick(now) {
        messages.tick(now);
        void emit(assembler.tick(now))
          .then(commit)
          .catch(() => {});
        if (now - lastActivity > idleExitMs) session.finish();
      },
    },
    async start() {
      await producer?.connect();
      await consumer.connect();
      await consumer.subscribe({ topics: [topics.records, topics.episodes], fromBeginning: true });
      output.open();
      await consumer.run({
        autoCommit: false,
        eachMessage: async ({ topic, partition, message }) => {
          const now = Date.now();
          lastActivity = now;
          const at: Position = { topic, partition, offset: Number(message.offset) };
          lastSeen.set(`${topic}\u0000${partition}`, at);
          const record = messages.add(at, message, now);
          // Eviction makes room for a chunk still pending, so a message that evicts is never also invalid.
          messages.reportEvicted();
          if (record === null) {
            await commit();
            return;
          }
          let events: GroupEvent[];
          try {
            events =
              topic === topics.episodes
                ? assembler.addEpisode(tallied(decodeEpisodeRecord(record)), record.pos, now)
                : rows === 'trajectories'
                  ? assembler.addTrajectory(decodeTrajectoryRecord(record), record.pos, now)
                  : assembler.addTransition(decodeTransitionRecord(record), record.pos, now);
          } catch {
            messages.undecodable(topic, partition, record);
            await commit();
            return;
          }
          await emit(events);
          await commit();
          if (output.emitted >= maxGroups) session.finish();
        },
      });
    },
    beforeDisconnect: () => commit().catch(() => {}),
    async afterDisconnect() {
      await producer?.disconnect().catch(() => {});
      output.close();
    },
  });
  return { code, emitted: output.emitted };
}
