import type { Logger } from './logger';

/** kafkajs' numeric levels (its `logLevel` enum), kept here so this file needs no kafkajs import. */
const KAFKAJS = { ERROR: 1, WARN: 2, INFO: 4, DEBUG: 5 } as const;

/** What kafkajs hands a log creator's function (its `LogEntry`). */
export interface KafkajsLogEntry {
  namespace: string;
  level: number;
  label?: string;
  log: { message: string; [field: string]: unknown };
}

/** kafkajs' log level to ask for: INFO, which we log at debug; DEBUG is per request. */
export const KAFKAJS_LOG_LEVEL = KAFKAJS.INFO;

/**
 * Routes a kafkajs client's logs through our logger, one shape for every client (exporter,
 * control consumer, `groups`, `tail --kafka`): `kafka: …` messages, a fixed set of fields, no
 * stack traces. kafkajs reports an unreachable broker twice per retry round (the connection's
 * error, then the broker pool's retry); the two become one warn line with the broker, the error,
 * the attempt and, unless it was the client's last (after `retries` retries), when the next one is.
 */
export function createKafkaLogCreator(logger: Logger, options: { retries: number }): () => (entry: KafkajsLogEntry) => void {
  const log = logger.child('kafka');
  return () => {
    let pending: { broker: string; error: string } | null = null;
    const flush = (): void => {
      if (!pending) return;
      log.warn(`kafka: cannot reach broker ${pending.broker}: ${pending.error}`, pending);
      pending = null;
    };
    return (entry) => {
      const l = entry.log;
      if (entry.namespace === 'Connection' && typeof l.broker === 'string' && /^Connection (error|timeout)/.test(l.message)) {
        flush();
        pending = { broker: l.broker, error: l.message.replace(/^Connection error: /, '') };
        // The broker pool's retry line follows within the same turn when this was a connect attempt.
        setImmediate(flush);
        return;
      }
      if (pending && /Failed to connect to seed broker/.test(l.message)) {
        const { broker, error } = pending;
        pending = null;
        const attempt = typeof l.retryCount === 'number' ? l.retryCount + 1 : undefined;
        const last = attempt !== undefined && attempt > options.retries;
        const inMs = !last && typeof l.retryTime === 'number' ? l.retryTime : undefined;
        const when = attempt === undefined ? '' : ` (attempt ${attempt}${last ? ', the last' : inMs !== undefined ? `, next in ${inMs} ms` : ''})`;
        log.warn(`kafka: cannot reach broker ${broker}: ${error}${when}`, { broker, error, attempt, retry_in_ms: inMs });
        return;
      }
      flush();
      const fields = pick(entry);
      const msg = `kafka: ${l.message}`;
      // A consumer that lost its broker crashes and restarts (or, for a non-retriable crash, our
      // own handler reconnects it and says so): the attempts above already said why, so the crash
      // is detail and the restart a retry, not an error.
      if (/^Crash: .*(Connection (error|timeout)|Closed connection)/.test(l.message)) log.debug(msg, fields);
      else if (/^Restarting the consumer/.test(l.message)) log.warn(msg, fields);
      // A broker (or a proxy before it) that closes the connection during an outage: the pool
      // retries, as for an unreachable broker. A retry round, not an error.
      else if (entry.namespace === 'BrokerPool' && /^Closed connection/.test(l.message) && typeof l.retryCount === 'number') log.warn(msg, fields);
      // Said at every start of an idempotent producer with bounded retries, as ours are on purpose:
      // a batch that fails is retried from the journal by the pipeline (with its backoff and
      // shutdown), and delivery is at least once with consumers de-duplicating by id. Detail.
      else if (/^Limiting retries for the idempotent producer/.test(l.message)) log.debug(msg, fields);
      else if (entry.level <= KAFKAJS.ERROR) log.error(msg, fields);
      else if (entry.level <= KAFKAJS.WARN) log.warn(msg, fields);
      else log.debug(msg, fields);
    };
  };
}

/** The fields worth keeping from a kafkajs entry, renamed to our snake_case; stacks are dropped. */
function pick(entry: KafkajsLogEntry): Record<string, unknown> {
  const l = entry.log;
  const out: Record<string, unknown> = { kafka_namespace: entry.namespace };
  if (typeof l.broker === 'string') out.broker = l.broker;
  if (typeof l.topic === 'string') out.topic = l.topic;
  if (typeof l.groupId === 'string') out.group_id = l.groupId;
  if (typeof l.error === 'string') out.error = l.error;
  if (typeof l.retryCount === 'number') out.attempt = l.retryCount + 1;
  if (typeof l.retryTime === 'number') out.retry_in_ms = l.retryTime;
  return out;
}
