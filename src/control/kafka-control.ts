import { randomUUID } from 'node:crypto';
import os from 'node:os';
import type { Consumer, Kafka } from 'kafkajs';
import type { Logger } from '../telemetry/logger';
import type { Metrics } from '../telemetry/metrics';
import { ControlMessageError, parseControlMessage, type Controller } from './controller';

/** Control messages replayed at start-up (the tail of the topic; later ones override earlier ones). */
const RECENT = 100;

/**
 * Consumes the control topic from its end (after replaying its last RECENT messages), in a consumer group of its own (every sidecar sees
 * every message; nothing is committed that another sidecar depends on). Never blocks start-up:
 * while Kafka is away it retries in the background, and the sidecar runs on its last known state.
 */
export function createKafkaControl(kafka: Kafka, topic: string, controller: Controller, deps: { logger: Logger; metrics: Metrics }) {
  const log = deps.logger.child('control');
  const groupId = `lightning-control-${os.hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
  let consumer: Consumer | null = null;
  let stopped = false;
  let retry: NodeJS.Timeout | null = null;
  let running: Promise<void> | null = null;
  let joined!: () => void;
  const joinedOnce = new Promise<void>((r) => (joined = r));

  async function connect(): Promise<void> {
    const c = kafka.consumer({ groupId, sessionTimeout: 10_000, heartbeatInterval: 1_000 });
    consumer = c;
    c.on(c.events.CRASH, (e) => {
      log.once('crash', 'warn', 'control consumer stopped; reconnecting', { err: e.payload.error });
      if (!stopped && !e.payload.restart) schedule();
    });
    await c.connect();
    // Where each partition ends now: the last RECENT messages are replayed, so a sidecar that starts
    // mid-run learns the current policy version (and a pause still in force).
    const ends = await recentOffsets();
    let caughtUp = false;
    c.on(c.events.GROUP_JOIN, () => {
      // Only on this consumer's first join: a later rejoin continues where it was.
      if (!caughtUp) for (const e of ends) c.seek({ topic, partition: e.partition, offset: e.offset });
      caughtUp = true;
      joined();
    });
    await c.subscribe({ topic, fromBeginning: false });
    await c.run({
      autoCommit: false,
      eachMessage: async ({ message }) => {
        try {
          controller.apply(parseControlMessage(JSON.parse(message.value?.toString('utf8') ?? 'null')), 'kafka');
          deps.metrics.controlMessages.inc({ source: 'kafka', outcome: 'applied' });
        } catch (err) {
          deps.metrics.controlMessages.inc({ source: 'kafka', outcome: 'invalid' });
          log.once('invalid', 'warn', 'ignored an invalid control message', {
            error: err instanceof ControlMessageError || err instanceof SyntaxError ? err.message : String(err),
          });
        }
      },
    });
    log.info('consuming the control topic', { topic });
  }

  async function recentOffsets(): Promise<{ partition: number; offset: string }[]> {
    const admin = kafka.admin();
    try {
      await admin.connect();
      const offsets = await admin.fetchTopicOffsets(topic);
      return offsets
        .filter((o) => Number(o.high) > Number(o.low))
        .map((o) => ({ partition: o.partition, offset: String(Math.max(Number(o.low), Number(o.high) - RECENT)) }));
    } catch {
      return []; // no topic yet: nothing to catch up on
    } finally {
      await admin.disconnect().catch(() => {});
    }
  }

  function schedule(): void {
    if (stopped || retry) return;
    retry = setTimeout(() => {
      retry = null;
      void attempt();
    }, 2_000);
    retry.unref();
  }

  async function attempt(): Promise<void> {
    if (stopped) return;
    const previous = consumer;
    consumer = null;
    await previous?.disconnect().catch(() => {});
    running = connect().catch((err) => {
      log.once('connect', 'warn', 'control topic unreachable; retrying in the background', { err });
      schedule();
    });
    await running;
  }

  return {
    groupId,
    /** Starts in the background; resolves at once. */
    start(): void {
      void attempt();
    },
    /** Resolves once the consumer has joined its group: messages produced after that are seen. */
    ready(): Promise<void> {
      return joinedOnce;
    },
    async shutdown(): Promise<void> {
      stopped = true;
      if (retry) clearTimeout(retry);
      await running?.catch(() => {});
      await consumer?.disconnect().catch(() => {});
    },
  };
}
