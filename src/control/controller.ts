import type { Logger } from '../telemetry/logger';
import type { Metrics } from '../telemetry/metrics';
import type { GateHold, GateResult } from '../model/component';

/** A control message (JSON on the control topic or `POST /lightning/v1/control`). */
export type ControlMessage = { type: 'policy'; version: string } | { type: 'pause'; reason: string; until_ms: number | null } | { type: 'resume' };

export class ControlMessageError extends Error {
  constructor(
    readonly field: string,
    message: string,
  ) {
    super(`${field}: ${message}`);
  }
}

const VERSION = /^[A-Za-z0-9._:+-]{1,64}$/;

/** Validates a parsed control message; throws ControlMessageError naming the field. */
export function parseControlMessage(value: unknown): ControlMessage {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new ControlMessageError('body', 'must be a JSON object');
  const v = value as Record<string, unknown>;
  switch (v.type) {
    case 'policy': {
      const version = typeof v.version === 'number' && Number.isSafeInteger(v.version) ? String(v.version) : v.version;
      if (typeof version !== 'string' || !VERSION.test(version)) throw new ControlMessageError('version', 'must be 1-64 characters of [A-Za-z0-9._:+-]');
      return { type: 'policy', version };
    }
    case 'pause': {
      const reason = v.reason === undefined ? 'unspecified' : v.reason;
      if (typeof reason !== 'string' || reason.length > 256) throw new ControlMessageError('reason', 'must be a string of at most 256 characters');
      const until = v.until_ms ?? null;
      if (until !== null && (typeof until !== 'number' || !Number.isFinite(until) || until <= 0))
        throw new ControlMessageError('until_ms', 'must be a Unix time in milliseconds');
      return { type: 'pause', reason, until_ms: until };
    }
    case 'resume':
      return { type: 'resume' };
    default:
      throw new ControlMessageError('type', `${JSON.stringify(v.type)} is not one of "policy", "pause", "resume"`);
  }
}

export interface ControllerOptions {
  /** Calls held at once while paused; beyond it new calls get 429 at once. */
  maxHeldCalls: number;
  /** How long one call may be held before it gets 429. */
  maxHoldMs: number;
  /** Static policy version (config), used until the control channel names one. */
  staticVersion: string | null;
}

interface Held {
  resolve: (r: GateResult) => void;
  timer: NodeJS.Timeout;
}

/**
 * The sidecar's side of the trainer loop: the current policy version and the pause state.
 * While paused, new model calls are held (bounded in count and time) and released on resume;
 * calls already upstream are never touched.
 */
export class Controller {
  private version: string | null;
  private paused: { reason: string; since: number; until: number | null; timer: NodeJS.Timeout | null } | null = null;
  private held = new Set<Held>();
  /** Called when the control channel names a new policy version (journaled by the pipeline). */
  onPolicy: ((version: string) => void) | null = null;

  constructor(
    private readonly options: ControllerOptions,
    private readonly deps: { logger: Logger; metrics: Metrics; now?: () => number },
  ) {
    this.version = options.staticVersion;
  }

  private now(): number {
    return (this.deps.now ?? Date.now)();
  }

  /** The policy version new calls are made with (control channel, else static config). */
  policyVersion(): string | null {
    return this.version;
  }

  state(): {
    paused: boolean;
    reason: string | null;
    paused_since_ms: number | null;
    until_ms: number | null;
    held_calls: number;
    policy_version: string | null;
  } {
    return {
      paused: this.paused !== null,
      reason: this.paused?.reason ?? null,
      paused_since_ms: this.paused?.since ?? null,
      until_ms: this.paused?.until ?? null,
      held_calls: this.held.size,
      policy_version: this.version,
    };
  }

  apply(msg: ControlMessage, source: 'kafka' | 'http'): void {
    const log = this.deps.logger;
    if (msg.type === 'policy') {
      if (msg.version === this.version) return;
      this.version = msg.version;
      log.info('policy version', { version: msg.version, source });
      this.onPolicy?.(msg.version);
    } else if (msg.type === 'pause') {
      if (msg.until_ms !== null && msg.until_ms <= this.now()) return;
      if (this.paused?.timer) clearTimeout(this.paused.timer);
      const timer = msg.until_ms === null ? null : setTimeout(() => this.resume('until_ms reached'), msg.until_ms - this.now());
      timer?.unref();
      this.paused = { reason: msg.reason, since: this.paused?.since ?? this.now(), until: msg.until_ms, timer };
      this.deps.metrics.paused.set(1);
      log.info('paused: new model calls are held', { reason: msg.reason, until_ms: msg.until_ms, source });
    } else {
      this.resume(`resume (${source})`);
    }
  }

  private resume(why: string): void {
    if (!this.paused) return;
    if (this.paused.timer) clearTimeout(this.paused.timer);
    this.deps.metrics.pausedSeconds.inc((this.now() - this.paused.since) / 1000);
    this.deps.metrics.paused.set(0);
    this.paused = null;
    const n = this.held.size;
    for (const h of this.held) this.settle(h, { go: true }, 'released');
    this.deps.logger.info('resumed: held calls released', { held: n, why });
  }

  /**
   * Null when the call may go now (the hot path: no promise, no allocation); otherwise a hold
   * whose result resolves when it may go, or with a 429 answer when the hold limit is reached.
   * A hold whose client has gone is abandoned: its place goes to the next call, and it is never
   * released to the model server.
   */
  gate(): GateHold | null {
    if (!this.paused) return null;
    const retryAfterS = this.retryAfterS();
    if (this.held.size >= this.options.maxHeldCalls) {
      this.deps.metrics.heldCalls.inc({ outcome: 'rejected' });
      const result = Promise.resolve<GateResult>({
        go: false,
        retryAfterS,
        reason: `the policy is being updated (${this.paused.reason}) and ${this.options.maxHeldCalls} calls are already waiting`,
      });
      return { result, abandon: () => {} };
    }
    let resolve!: (r: GateResult) => void;
    const result = new Promise<GateResult>((r) => (resolve = r));
    const h: Held = {
      resolve,
      timer: setTimeout(
        () =>
          this.settle(
            h,
            {
              go: false,
              retryAfterS: this.retryAfterS(),
              reason: `the policy is being updated (${this.paused?.reason ?? 'pause'}); held for ${this.options.maxHoldMs} ms`,
            },
            'timed_out',
          ),
        this.options.maxHoldMs,
      ),
    };
    this.held.add(h);
    this.deps.metrics.heldNow.set(this.held.size);
    return { result, abandon: () => this.settle(h, { go: false, retryAfterS, reason: 'the client went away while held' }, 'abandoned') };
  }

  private settle(h: Held, result: GateResult, outcome: 'released' | 'timed_out' | 'shutdown' | 'abandoned'): void {
    if (!this.held.delete(h)) return;
    clearTimeout(h.timer);
    this.deps.metrics.heldCalls.inc({ outcome });
    this.deps.metrics.heldNow.set(this.held.size);
    h.resolve(result);
  }

  private retryAfterS(): number {
    const until = this.paused?.until;
    if (until) return Math.max(1, Math.ceil((until - this.now()) / 1000));
    return Math.max(1, Math.ceil(this.options.maxHoldMs / 1000));
  }

  /** Shutdown: held calls are answered (429) so they can retry against another replica. */
  close(): void {
    for (const h of this.held) this.settle(h, { go: false, retryAfterS: 1, reason: 'the sidecar is shutting down' }, 'shutdown');
    if (this.paused?.timer) clearTimeout(this.paused.timer);
  }
}
