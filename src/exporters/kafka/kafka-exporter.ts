import { appendFile, mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { KafkaExporterConfig } from '../../config/schema';
import { once } from '../../pipeline/component';
import type { ClosedEpisode, TransitionRecord } from '../../pipeline/records';
import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { NO_JOURNAL, type Exporter } from '../exporter';
import { TransitionWriter } from '../transition-json';
import { CONTENT_TYPE, encodeEpisode, encodeTransition } from './encoding';
import type { OutMessage, Producer, SendResult } from './producer';

/** Bytes Kafka adds around a record (batch and record headers), kept out of max_message_bytes. */
const RECORD_OVERHEAD = 512;

export class ExportError extends Error {
  constructor(
    message: string,
    readonly retryable: boolean,
    override readonly cause?: Error,
  ) {
    super(message);
  }
}

export interface KafkaExporterDeps {
  producer: Producer;
  logger: Logger;
  metrics: Metrics;
  deadLetterDir: string;
}

/**
 * Transitions to `topic`, episode summaries to `episodes_topic`, keyed by rollout id so one
 * rollout's records stay ordered on one partition. An export resolves only when the broker
 * acknowledged everything (acks=all); otherwise it rejects and the pipeline retries from the
 * journal. Starts without Kafka: connection is attempted on each export until it succeeds.
 */
export function createKafkaExporter(config: KafkaExporterConfig, deps: KafkaExporterDeps): Exporter & { readonly connected: boolean } {
  const log = deps.logger.child('exporter.kafka');
  const m = deps.metrics;
  const contentType = CONTENT_TYPE[config.encoding];
  const limit = config.max_message_bytes - RECORD_OVERHEAD;

  function headers(schema: string, t: { rollout_id: string; group_id: string | null }): Record<string, string> {
    const h: Record<string, string> = { 'content-type': contentType, 'lightning-schema': schema, 'rollout-id': t.rollout_id };
    if (t.group_id !== null) h['group-id'] = t.group_id;
    return h;
  }

  /** Encodes a transition to fit: whole, else without raw bodies (token ids stay), else null. */
  function fit(t: TransitionRecord, writer: TransitionWriter): Buffer | null {
    const whole = encodeTransition(t, config.encoding, writer);
    if (whole.length <= limit) return whole;
    const smaller = encodeTransition({ ...t, request: null, response: null }, config.encoding, writer, { bodies_dropped: true });
    m.exportOversize.inc({ action: smaller.length <= limit ? 'bodies_dropped' : 'dead_letter' });
    return smaller.length <= limit ? smaller : null;
  }

  async function deadLetter(kind: string, record: unknown, reason: string): Promise<void> {
    await mkdir(deps.deadLetterDir, { recursive: true });
    await appendFile(path.join(deps.deadLetterDir, `${kind}.ndjson`), JSON.stringify({ reason, record }) + '\n');
    log.once(`dead_letter:${reason}`, 'warn', 'records too large for Kafka are written to dead-letter/', { dir: deps.deadLetterDir, reason });
  }

  /** Sends in chunks of at most max_batch_bytes; a refusal for size splits the chunk. */
  async function sendAll(topic: string, messages: { msg: OutMessage; record: unknown }[], kind: string): Promise<void> {
    let chunk: typeof messages = [];
    let bytes = 0;
    const flush = async (): Promise<void> => {
      if (chunk.length > 0) await sendChunk(topic, chunk, kind);
      chunk = [];
      bytes = 0;
    };
    for (const item of messages) {
      if (bytes + item.msg.value.length > config.max_batch_bytes) await flush();
      chunk.push(item);
      bytes += item.msg.value.length;
    }
    await flush();
  }

  async function sendChunk(topic: string, chunk: { msg: OutMessage; record: unknown }[], kind: string): Promise<void> {
    const result: SendResult = await deps.producer.send(topic, chunk.map((c) => c.msg));
    if (result.status === 'success') return;
    if (result.status === 'failure' && result.tooLarge) {
      if (chunk.length === 1) {
        m.exportOversize.inc({ action: 'dead_letter' });
        await deadLetter(kind, chunk[0].record, `broker refused the size: ${result.error.message}`);
        return;
      }
      const half = Math.ceil(chunk.length / 2);
      await sendChunk(topic, chunk.slice(0, half), kind);
      await sendChunk(topic, chunk.slice(half), kind);
      return;
    }
    const retryable = result.status === 'retryable';
    m.exportErrors.inc({ exporter: 'kafka', kind: retryable ? 'retryable' : 'permanent' });
    if (!retryable) log.once(`permanent:${result.error.message}`, 'error', `exporter kafka: ${result.error.message}; records stay in the journal and are retried`, { topic });
    throw new ExportError(`exporter kafka: ${result.error.message}`, retryable, result.error);
  }

  const exporter = {
    name: 'kafka',
    get connected() {
      return deps.producer.connected;
    },
    async start(): Promise<void> {
      // Do not wait for Kafka: agents are served and the journal holds the backlog meanwhile.
      deps.producer.connect().then(
        () => log.info('connected', { brokers: config.brokers }),
        (err: Error) => log.warn('kafka unreachable at start; will retry on export', { err, brokers: config.brokers }),
      );
    },
    async export(batch: ClosedEpisode[], read = NO_JOURNAL): Promise<void> {
      const writer = new TransitionWriter(read);
      if (!deps.producer.connected) {
        try {
          await deps.producer.connect();
        } catch (err) {
          m.exportErrors.inc({ exporter: 'kafka', kind: 'retryable' });
          throw new ExportError(`exporter kafka: cannot connect to ${config.brokers.join(',')}: ${(err as Error).message}`, true, err as Error);
        }
      }
      const transitions: { msg: OutMessage; record: unknown }[] = [];
      for (const c of batch) {
        for (const t of c.transitions) {
          const value = fit(t, writer);
          if (value === null) {
            await deadLetter('transitions', writer.materialize(t), `larger than max_message_bytes (${config.max_message_bytes}) even without bodies`);
            continue;
          }
          transitions.push({ msg: { key: t.rollout_id, value, headers: headers('lightning.transition.v1', t) }, record: t });
        }
      }
      await sendAll(config.topic, transitions, 'transitions');
      const episodes = batch.map((c) => ({ msg: { key: c.episode.rollout_id, value: encodeEpisode(c.episode, config.encoding), headers: headers('lightning.episode.v1', c.episode) }, record: c.episode }));
      await sendAll(config.episodes_topic, episodes, 'episodes');
    },
    shutdown: once(async () => {
      await deps.producer.disconnect();
    }),
  };
  return exporter;
}
