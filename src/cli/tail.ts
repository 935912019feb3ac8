import { randomUUID } from 'node:crypto';
import { createReadStream, existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { loadConfig } from '../config/load';
import type { Transition } from '../model/records';
import type { WireTransition } from '../trainer/prompt-delta';
import { UsageError, type CliIo, type Command, type CommandSpec, type ParsedValues } from './command';
import { ChunkedMessages, ConsumerRun, stopOnSignals } from './consumer-runner';
import { decodeTransitionRecord, kafkaCommandConfig, kafkaForCommand } from './kafka-consumer';

const FILE_ONLY = ['data-dir', 'follow'];
const KAFKA_ONLY = ['brokers', 'topic', 'from-beginning', 'max'];

const spec: CommandSpec = {
  name: 'tail',
  summary: 'print exported transitions, one line each (files, or Kafka with --kafka)',
  synopsis: ['[--data-dir DIR] [--follow] [--json]', '--kafka [--brokers H:P,...] [--topic T] [--from-beginning] [--max N] [--json]'],
  options: {
    'data-dir': { type: 'string', value: 'DIR', description: 'where the file exporter writes (default: the config, then $LIGHTNING_DATA_DIR, then ./data)' },
    follow: { type: 'boolean', description: 'keep printing new transitions until interrupted' },
    json: { type: 'boolean', description: 'print each transition as its JSON record' },
    kafka: { type: 'boolean', description: 'read the transitions topic in a fresh consumer group (moves no trainer offsets)' },
    brokers: { type: 'string', value: 'H:P,...', description: 'Kafka brokers (default: the config, then $LIGHTNING_KAFKA_BROKERS)' },
    topic: { type: 'string', value: 'T', description: 'transitions topic (default: the config, lightning.transitions)' },
    'from-beginning': { type: 'boolean', description: 'start at the oldest record instead of the newest' },
    max: { type: 'integer', value: 'N', description: 'stop after N transitions' },
    config: { type: 'string', value: 'FILE', description: 'config file for the defaults above (default: $LIGHTNING_CONFIG)' },
  },
  notes: ['Chunked records are reassembled; a prompt sent as a delta shows as +N prompt tokens.'],
};

export const tailCommand: Command = {
  spec,
  async run({ values }, io) {
    const misplaced = (values.kafka ? FILE_ONLY : KAFKA_ONLY).find((name) => values[name] !== undefined);
    if (misplaced) throw new UsageError(`tail: --${misplaced} ${values.kafka ? 'reads files, not Kafka' : 'needs --kafka'}`, spec);
    return values.kafka ? tailKafka(values, io) : tailFiles(values, io);
  },
};

/** One readable line per transition. */
export function formatTransition(t: WireTransition): string {
  const prompt = t.prompt_token_ids?.length ?? (t.prompt_token_ids_delta ? `+${t.prompt_token_ids_delta.suffix.length}` : '-');
  const tokens = `${prompt}→${t.response_token_ids?.length ?? '-'}`;
  const tools = t.tool_calls.length > 0 ? ` tools=${t.tool_calls.map((c) => `${c.name ?? '?'}:${c.status ?? '?'}`).join(',')}` : '';
  const reward = t.reward.toFixed(3);
  return `${t.transition_id.padEnd(28)} ${t.api.padEnd(18)} ${(t.model ?? '-').padEnd(16)} ${t.status.padEnd(7)} tokens=${tokens.padEnd(9)} reward=${reward} final=${t.final_reward ?? '-'} ${t.finish_reason ?? '-'}${t.streamed ? ' (stream)' : ''}${tools}`;
}

async function tailFiles(values: ParsedValues, io: CliIo): Promise<number> {
  const json = values.json === true;
  const follow = values.follow === true;
  let dataDir = values['data-dir'] as string | undefined;
  if (dataDir === undefined) {
    const config = loadConfig({ file: (values.config as string | undefined) ?? (io.env.LIGHTNING_CONFIG || undefined), env: io.env });
    dataDir = config.exporters.file.dir ?? config.service.data_dir;
  }
  const dir = path.join(dataDir, 'transitions');
  if (!existsSync(dir)) {
    const trajectoriesOnly = existsSync(path.join(dataDir, 'trajectories'));
    io.err.write(
      trajectoriesOnly
        ? `tail: no transitions under ${dir}: the exporter writes trajectories only (${path.join(dataDir, 'trajectories')}); set exporters.records (LIGHTNING_EXPORT_RECORDS) to both for per-call transitions\n`
        : `tail: no transitions under ${dir} yet (is the data dir right?)\n`,
    );
    return follow ? waitAndFollow(dir, io, json) : 1;
  }
  const seen = new Map<string, number>();
  await printNew(dir, seen, io, json);
  return follow ? waitAndFollow(dir, io, json, seen) : 0;
}

async function printNew(dir: string, seen: Map<string, number>, io: CliIo, json: boolean): Promise<void> {
  if (!existsSync(dir)) return;
  const files = readdirSync(dir)
    .filter((f) => f.endsWith('.ndjson'))
    .sort();
  for (const f of files) {
    const file = path.join(dir, f);
    const from = seen.get(file) ?? 0;
    const size = statSync(file).size;
    if (size <= from) continue;
    const rl = createInterface({ input: createReadStream(file, { start: from, end: size - 1 }) });
    let consumed = from;
    for await (const line of rl) {
      consumed += Buffer.byteLength(line) + 1;
      if (line.trim() === '') continue;
      try {
        const t = JSON.parse(line) as Transition;
        io.out.write(json ? `${line}\n` : `${formatTransition(t)}\n`);
      } catch {
        io.err.write(`tail: skipping an unreadable line in ${file}\n`);
      }
    }
    seen.set(file, Math.min(consumed, size));
  }
}

function waitAndFollow(dir: string, io: CliIo, json: boolean, seen = new Map<string, number>()): Promise<number> {
  return new Promise((resolve) => {
    const timer = setInterval(() => void printNew(dir, seen, io, json), 500);
    // The listeners stay until the process exits: the command ends with the first signal.
    stopOnSignals(() => {
      clearInterval(timer);
      resolve(0);
    });
  });
}

/**
 * `tail --kafka`: a consumer in a fresh group (so it sees every partition, and never moves a
 * trainer's offsets) printing transitions as they arrive, whole or reassembled from chunks.
 */
async function tailKafka(values: ParsedValues, io: CliIo): Promise<number> {
  const config = kafkaCommandConfig(values, io);
  const { brokers, topic } = config.exporters.kafka;
  if (brokers.length === 0) throw new UsageError('tail --kafka: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS)', spec);
  const json = values.json === true;
  const max = (values.max as number | undefined) ?? Infinity;
  const { kafka } = kafkaForCommand(config, 'tail', io);
  const consumer = kafka.consumer({ groupId: `lightning-tail-${randomUUID()}`, maxWaitTimeInMs: 250 });
  const messages = new ChunkedMessages('tail', io, 60_000, (r) => `${r.recordId}: ${r.have} of ${r.count} chunks (${r.reason})`);
  const session = new ConsumerRun('tail', io, consumer, brokers);
  let printed = 0;
  return session.run({
    timer: { everyMs: 1000, unref: true, tick: (now) => messages.tick(now) },
    async start() {
      await consumer.connect();
      await consumer.subscribe({ topic, fromBeginning: values['from-beginning'] === true });
      await consumer.run({
        eachMessage: async ({ topic: t, partition, message }) => {
          if (printed >= max) return;
          const record = messages.add({ topic: t, partition, offset: Number(message.offset) }, message, Date.now());
          if (record === null) return;
          let tr: WireTransition;
          try {
            tr = decodeTransitionRecord(record);
          } catch {
            messages.undecodable(t, partition, record);
            return;
          }
          io.out.write(json ? `${JSON.stringify(tr)}\n` : `${formatTransition(tr)}\n`);
          if (++printed >= max) session.finish();
        },
      });
    },
  });
}
