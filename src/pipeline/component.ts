import type { CallRecord, CallStartRecord, EndRecord, RewardRecord } from './records';

/**
 * The lifecycle every component follows (after the OpenTelemetry Collector's): `start` returns
 * once the component serves; `shutdown` is idempotent (the same promise on a second call), safe
 * before `start`, stops intake, flushes, and honours the deadline it is given.
 */
export interface Component {
  start(): Promise<void>;
  shutdown(deadlineMs?: number): Promise<void>;
}

/** Raised when the pipeline cannot take a record now; receivers answer 503 + Retry-After. */
export class RefusedError extends Error {
  readonly retryable = true;
  constructor(
    readonly code: string,
    message: string,
    readonly retryAfterMs: number,
  ) {
    super(message);
  }
}

/** The data-plane interface from receivers into the pipeline. */
export interface RecordSink {
  /** Resolves once the record is durably journaled; rejects with RefusedError. */
  submit(record: RewardRecord | EndRecord): Promise<unknown>;
}

/** What the proxy reports about recorded calls. Never throws into the hot path. */
export interface CaptureSink {
  callStarted(record: CallStartRecord): void;
  callEnded(record: CallRecord): void;
}

/** Runs `fn` once; later calls get the first call's promise (shutdown idempotence). */
export function once<T>(fn: () => Promise<T>): () => Promise<T> {
  let p: Promise<T> | undefined;
  return () => (p ??= fn());
}
