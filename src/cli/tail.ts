import { createReadStream, existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { Kafka, logLevel } from 'kafkajs';
import { randomUUID } from 'node:crypto';
import { loadConfig } from '../config/load';
import { decodeTransition, type Encoding } from '../exporters/kafka/encoding';
import type { Transition } from '../pipeline/records';

export interface TailIo {
  env: NodeJS.ProcessEnv;
  out: NodeJS.WritableStream;
  err: NodeJS.WritableStream;
}

/** One readable line per transition. */
export function formatTransition(t: Transition): string {
  const tokens = `${t.prompt_token_ids?.length ?? '-'}→${t.response_token_ids?.length ?? '-'}`;
  const tools = t.tool_calls.length > 0 ? ` tools=${t.tool_calls.map((c) => `${c.name ?? '?'}:${c.status ?? '?'}`).join(',')}` : '';
  const reward = t.reward.toFixed(3);
  return `${t.transition_id.padEnd(28)} ${t.api.padEnd(18)} ${(t.model ?? '-').padEnd(16)} ${t.status.padEnd(7)} tokens=${tokens.padEnd(9)} reward=${reward} final=${t.final_reward ?? '-'} ${t.finish_reason ?? '-'}${t.streamed ? ' (stream)' : ''}${tools}`;
}

export async function runTail(args: string[], io: TailIo): Promise<number> {
  const i = args.indexOf('--data-dir');
  const dataDir = i >= 0 ? args[i + 1] : io.env.LIGHTNING_DATA_DIR || './data';
  const json = args.includes('--json');
  const follow = args.includes('--follow');
  if (args.includes('--kafka')) return tailKafka(args, io, json);
  const dir = path.join(dataDir, 'transitions');
  if (!existsSync(dir)) {
    io.err.write(`tail: no transitions under ${dir} yet (is LIGHTNING_DATA_DIR right?)\n`);
    return follow ? waitAndFollow(dir, io, json) : 1;
  }
  const seen = new Map<string, number>();
  await printNew(dir, seen, io, json);
  return follow ? waitAndFollow(dir, io, json, seen) : 0;
}

async function printNew(dir: string, seen: Map<string, number>, io: TailIo, json: boolean): Promise<void> {
  if (!existsSync(dir)) return;
  const files = readdirSync(dir).filter((f) => f.endsWith('.ndjson')).sort();
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

function waitAndFollow(dir: string, io: TailIo, json: boolean, seen = new Map<string, number>()): Promise<number> {
  return new Promise((resolve) => {
    const timer = setInterval(() => void printNew(dir, seen, io, json), 500);
    const stop = (): void => {
      clearInterval(timer);
      resolve(0);
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}

export function option(args: string[], name: string): string | undefined {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
}

/**
 * `tail --kafka`: a kafkajs consumer in a fresh group (so it sees every partition, and never
 * moves a trainer's offsets) printing transitions as they arrive, JSON or protobuf by header.
 */
async function tailKafka(args: string[], io: TailIo, json: boolean): Promise<number> {
  const config = loadConfig({ file: option(args, '--config') ?? (io.env.LIGHTNING_CONFIG || undefined), env: io.env });
  const brokers = option(args, '--brokers')?.split(',') ?? config.exporters.kafka.brokers;
  if (brokers.length === 0) {
    io.err.write('tail --kafka: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS)\n');
    return 2;
  }
  const topic = option(args, '--topic') ?? config.exporters.kafka.topic;
  const max = Number(option(args, '--max') ?? Infinity);
  const kafka = new Kafka({ clientId: 'lightning-sidecar-tail', brokers, logLevel: logLevel.ERROR });
  const consumer = kafka.consumer({ groupId: `lightning-tail-${randomUUID()}`, maxWaitTimeInMs: 250 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: args.includes('--from-beginning') });
  let seen = 0;
  await new Promise<void>((resolve) => {
    const stop = (): void => resolve();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    void consumer.run({
      eachMessage: async ({ message }) => {
        if (seen >= max) return;
        const encoding: Encoding = message.headers?.['content-type']?.toString() === 'application/x-protobuf' ? 'protobuf' : 'json';
        try {
          const t = decodeTransition(message.value ?? Buffer.alloc(0), encoding);
          io.out.write(json ? `${JSON.stringify(t)}\n` : `${formatTransition(t)}\n`);
        } catch {
          io.err.write(`tail: skipping an undecodable message at offset ${message.offset}\n`);
        }
        if (++seen >= max) resolve();
      },
    });
  });
  await consumer.disconnect();
  return 0;
}
