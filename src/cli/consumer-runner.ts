import type { Consumer, KafkaMessage } from 'kafkajs';
import { ChunkReassembler, type IncompleteRecord, type WholeRecord } from '../trainer/chunk-reassembly';
import type { Position } from '../trainer/groups';
import type { CliIo } from './command';

/** Bytes of chunks a consuming command holds at most while it reassembles records. */
const CHUNK_BYTES = 256 * 1024 * 1024;

/**
 * Makes SIGINT and SIGTERM call `stop` (each at most once) until the returned function is called:
 * how `tail` and `groups` end a run that follows its source, on Kafka or on files.
 */
export function stopOnSignals(stop: () => void): () => void {
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  return () => {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
  };
}

/**
 * The chunk plumbing of a consuming command (`tail --kafka`, `groups`): messages in, whole records
 * out, and a `{command}: …` line on stderr for every record that is invalid, dropped incomplete
 * (timed out, or evicted by the byte cap) or that does not decode.
 */
export class ChunkedMessages {
  readonly chunks: ChunkReassembler;

  constructor(
    private readonly command: string,
    private readonly io: CliIo,
    timeoutMs: number,
    /** What follows `dropped record ` in the line for a record dropped incomplete. */
    private readonly describeDropped: (r: IncompleteRecord) => string,
  ) {
    this.chunks = new ChunkReassembler({ timeoutMs, maxBytes: CHUNK_BYTES });
  }

  /** The message's record when it is whole (unchunked, or its last chunk); null otherwise. */
  add(at: Position, message: KafkaMessage, now: number): WholeRecord | null {
    const outcome = this.chunks.add(at, message.headers, message.value, now);
    if (outcome.kind === 'invalid')
      this.io.err.write(`${this.command}: skipping record ${outcome.recordId ?? '?'} at ${at.topic}/${at.partition}@${message.offset}: ${outcome.reason}\n`);
    return outcome.kind === 'record' ? outcome.record : null;
  }

  /** Reports the records the byte cap evicted since the last report. */
  reportEvicted(): void {
    this.reportDropped(this.chunks.takeEvicted());
  }

  /** Drops the records that timed out, and reports them after those evicted since the last report. */
  tick(now: number): void {
    this.reportDropped([...this.chunks.tick(now), ...this.chunks.takeEvicted()]);
  }

  /** A whole record whose bytes are not a record of its topic. */
  undecodable(topic: string, partition: number, record: WholeRecord): void {
    this.io.err.write(`${this.command}: skipping an undecodable record at ${topic}/${partition}@${record.pos.offset}\n`);
  }

  private reportDropped(records: IncompleteRecord[]): void {
    for (const r of records) this.io.err.write(`${this.command}: dropped record ${this.describeDropped(r)}\n`);
  }
}

/** The one line a Kafka command ends with when the client gives up. */
export function gaveUpMessage(command: string, brokers: string[], err: unknown): string {
  const e = err as Error & { retryCount?: number; cause?: unknown };
  const root = e.name === 'KafkaJSNumberOfRetriesExceeded' && e.cause instanceof Error ? e.cause : e;
  const reason = (root instanceof Error ? root.message : String(root)).replace(/^Connection error: /, '');
  const tries = typeof e.retryCount === 'number' ? ` after ${e.retryCount + 1} tries` : '';
  return `${command}: gave up on Kafka at ${brokers.join(',')}${tries}: ${reason}\n`;
}

/** What a consuming command does in a `ConsumerRun`, in this order. */
export interface ConsumerSteps {
  /** Connects, subscribes and starts the consumer (`consumer.run`). */
  start(): Promise<void>;
  /** Called every `everyMs` from before `start` until the run ends (time-outs); `unref` lets the process exit meanwhile. */
  timer: { everyMs: number; unref?: boolean; tick(now: number): void };
  /** Once the run is finished, while still connected (a last commit); not after a failure. */
  beforeDisconnect?(): Promise<void>;
  /** After the consumer disconnected, failed or not (the command's own producer, files). */
  afterDisconnect?(): Promise<void> | void;
}

/**
 * One run of a Kafka consumer for a command: it lasts until `finish` (the command is done), a
 * signal, or a crash the client does not restart from; then the consumer disconnects. A failure
 * (a crash, or an error connecting or consuming) is the `{command}: gave up on Kafka …` line on
 * stderr and exit code 1; otherwise 0.
 */
export class ConsumerRun {
  private failure: unknown = null;
  private end!: () => void;
  private readonly ended = new Promise<void>((resolve) => (this.end = resolve));

  constructor(
    private readonly command: string,
    private readonly io: CliIo,
    private readonly consumer: Consumer,
    private readonly brokers: string[],
  ) {}

  /** Ends the run (any number of times). */
  readonly finish = (): void => this.end();

  async run(steps: ConsumerSteps): Promise<number> {
    const release = stopOnSignals(this.finish);
    this.consumer.on(this.consumer.events.CRASH, (e) => {
      if (e.payload.restart) return;
      this.failure = e.payload.error;
      this.finish();
    });
    const timer = setInterval(() => steps.timer.tick(Date.now()), steps.timer.everyMs);
    if (steps.timer.unref) timer.unref();
    try {
      await steps.start();
      await this.ended;
      await steps.beforeDisconnect?.();
    } catch (err) {
      this.failure = err;
    } finally {
      clearInterval(timer);
      release();
      await this.consumer.disconnect().catch(() => {});
      await steps.afterDisconnect?.();
    }
    if (this.failure !== null) {
      this.io.err.write(gaveUpMessage(this.command, this.brokers, this.failure));
      return 1;
    }
    return 0;
  }
}
