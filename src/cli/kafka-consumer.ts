import type { Kafka } from 'kafkajs';
import { loadConfig } from '../config/load';
import type { Config } from '../config/schema';
import { decodeEpisode, decodeTrajectory, decodeTransition, type Encoding } from '../exporters/kafka/encoding';
import { createKafkaClient, kafkaClientOptions } from '../exporters/kafka/kafkajs-producer';
import type { EpisodeSummary, Trajectory } from '../model/records';
import { createLogger, type Logger } from '../telemetry/logger';
import { headerValue, type WholeRecord } from '../trainer/chunk-reassembly';
import type { WireTransition } from '../trainer/prompt-delta';
import type { CliIo } from './command';

/** Config for a Kafka command: `--config` (or $LIGHTNING_CONFIG), env, then `--brokers`/`--topic`. */
export function kafkaCommandConfig(values: { config?: string; brokers?: string; topic?: string }, io: CliIo): Config {
  const kafka: Record<string, unknown> = {};
  if (values.brokers !== undefined)
    kafka.brokers = values.brokers
      .split(',')
      .map((b) => b.trim())
      .filter((b) => b.length > 0);
  if (values.topic !== undefined) kafka.topic = values.topic;
  return loadConfig({ file: values.config ?? (io.env.LIGHTNING_CONFIG || undefined), env: io.env, overrides: { exporters: { kafka } } });
}

/** A kafkajs client with the exporter's connection settings whose logs go through our logger, on stderr. */
export function kafkaForCommand(config: Config, command: string, io: CliIo): { kafka: Kafka; logger: Logger } {
  const logger = createLogger({ level: config.service.log_level, component: command, write: (line) => io.err.write(line) });
  return { kafka: createKafkaClient(kafkaClientOptions(config.exporters.kafka, `lightning-sidecar-${command}`), logger), logger };
}

/** The one line a Kafka command ends with when the client gives up. */
export function gaveUpMessage(command: string, brokers: string[], err: unknown): string {
  const e = err as Error & { retryCount?: number; cause?: unknown };
  const root = e.name === 'KafkaJSNumberOfRetriesExceeded' && e.cause instanceof Error ? e.cause : e;
  const reason = (root instanceof Error ? root.message : String(root)).replace(/^Connection error: /, '');
  const tries = typeof e.retryCount === 'number' ? ` after ${e.retryCount + 1} tries` : '';
  return `${command}: gave up on Kafka at ${brokers.join(',')}${tries}: ${reason}\n`;
}

export function encodingOf(record: WholeRecord): Encoding {
  return headerValue(record.headers, 'content-type') === 'application/x-protobuf' ? 'protobuf' : 'json';
}

export function decodeTransitionRecord(record: WholeRecord): WireTransition {
  return decodeTransition(record.value, encodingOf(record));
}

export function decodeEpisodeRecord(record: WholeRecord): EpisodeSummary {
  return decodeEpisode(record.value, encodingOf(record));
}

export function decodeTrajectoryRecord(record: WholeRecord): Trajectory {
  return decodeTrajectory(record.value, encodingOf(record));
}
