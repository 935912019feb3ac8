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

/**
 * Raised when a record can never reach an episode: a reward, end or tool span for an episode that
 * already closed (`episode_closed`), or a reward or end for a rollout attempt the sidecar has no
 * episode of (`unknown_rollout`). Not retryable: the rollout API answers 409 / 404, the OTLP
 * receiver rejects the span in a partial success.
 */
export class RejectedError extends Error {
  readonly retryable = false;
  constructor(
    readonly code: 'episode_closed' | 'unknown_rollout',
    message: string,
  ) {
    super(message);
  }

  get status(): 404 | 409 {
    return this.code === 'episode_closed' ? 409 : 404;
  }
}

/** The data-plane interface from receivers into the pipeline. */
export interface RecordSink {
  /** Resolves once the record is durably journaled; rejects with RefusedError or RejectedError. */
  submit(record: RewardRecord | EndRecord): Promise<unknown>;
}

/**
 * What the proxy reports about recorded calls. Never throws into the hot path. Bodies go to the
 * journal as they pass; `flush` puts what is queued into the kernel, which the proxy does before
 * an agent can see its answer complete (so a killed process cannot lose an answered call).
 */
export interface CaptureSink {
  /** Registers a call; returns its id (for its body frames), or null when it cannot be recorded. */
  callStarted(record: CallStartRecord): number | null;
  /**
   * Appends request or response bytes (one buffer, or consecutive pieces), pushing the offsets
   * of the frames that hold them onto `frames` (a body's frames, in order, read back as its
   * bytes); false when refused.
   */
  body(callId: number, kind: 'request' | 'response' | 'agent_request' | 'agent_response', bytes: Buffer | readonly Buffer[], frames: number[]): boolean;
  /**
   * Writes what the sink holds of one body (bytes that may repeat an earlier call's, kept until
   * that is known), pushing the frames onto `frames`: before the agent gets those bytes, and when
   * the body is complete. False when refused.
   */
  bodyFlush(callId: number, kind: 'request' | 'response', frames: number[]): boolean;
  /** What was written of one body is dropped from the call (it is sent again, changed). */
  restartBody(callId: number, kind: 'request' | 'response'): void;
  /**
   * How many of the call's first request bytes (as given so far) equal its rollout's previous
   * request, and what was noted about that request (`noteRequest`); null when nothing is known.
   */
  requestRepeats?(callId: number): { shared: number; notes: unknown } | null;
  /** Notes about the call's request, kept with it for the next call of its rollout. */
  noteRequest?(callId: number, notes: unknown): void;
  callEnded(record: CallRecord): void;
  /** Writes what is queued now (the bytes are in the kernel when it returns). */
  flush(): void;
  /**
   * Runs `then` once what is queued now is written: with the other calls ending in this turn of
   * the event loop, in one write. The proxy gives the agent an answer's last bytes from here.
   */
  afterWrite(then: () => void): void;
  /** Writes what is queued at the end of this turn of the event loop: a streamed answer has begun. */
  writeSoon(): void;
  /**
   * Runs `then` right before the next write (within 20 ms, sooner when something calls for a
   * write): a streamed answer's chunks are handed over then, together.
   */
  beforeWrite(then: () => void): void;
  /** Reads journaled body frames back (written through first); throws when they are gone. */
  read(frames: readonly number[]): Buffer;
}

/** Runs `fn` once; later calls get the first call's promise (shutdown idempotence). */
export function once<T>(fn: () => Promise<T>): () => Promise<T> {
  let p: Promise<T> | undefined;
  return () => (p ??= fn());
}

/** The trainer's pause, as the proxy sees it: go now, or an answer to give instead (429). */
export type GateResult = { go: true } | { go: false; retryAfterS: number; reason: string };

/**
 * A call held by the pause: `result` settles when it may go (or must be refused); `abandon()`
 * gives up its place when its client has gone (the result is then a refusal no one reads).
 */
export interface GateHold {
  result: Promise<GateResult>;
  abandon(): void;
}
