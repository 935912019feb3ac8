import type { IncomingMessage, ServerResponse } from 'node:http';
import type { LlmProxyConfig } from '../../config/schema';
import type { Api } from '../../model/records';
import type { Metrics } from '../../telemetry/metrics';
import type { CallCapture } from './capture';
import type { Flavor } from './flavor';
import type { ExchangeRoute, UpstreamClient, UpstreamRequest, UpstreamRequestOptions, UpstreamResponse } from './upstream-client';
import type { Replica, UpstreamPool } from './upstream-pool';

/**
 * What every way of serving a call shares: the call, the upstream target, and the engine's side
 * of a call (the `Engine` interface). The plans import this module and never the engine itself,
 * so call-engine.ts can import the plans without an import circle.
 */

/** One admitted call: the agent's request and response, and its capture (null when not recorded). */
export interface Call {
  req: IncomingMessage;
  res: ServerResponse;
  /** The request path with any rollout routing prefix removed. */
  path: string;
  api: Api | null;
  capture: CallCapture | null;
  /** `performance.now()` when the call was admitted. */
  t0: number;
  /** Fields that ask the engine for this call's sampling masks (set once its body was read; src/formats/engines). */
  maskFields?: Record<string, string> | null;
}

/** The model-server replicas (upstream-pool.ts): `host` and `basePath` are the configured URL's. */
export type Upstream = UpstreamPool;

/** `/v1/x` on the proxy → `{upstream}/x`; any other path → the upstream's origin + path. */
export function upstreamPath(basePath: string, path: string): string {
  if (path === '/v1' || path.startsWith('/v1/') || path.startsWith('/v1?')) return basePath + path.slice(3);
  return path;
}

export const POLICY_VERSION = /^[A-Za-z0-9._:+-]{1,64}$/;

/** The error an upstream request is destroyed with when it goes idle past upstream_timeout_ms. */
export class UpstreamTimeout extends Error {
  readonly code = 'UPSTREAM_TIMEOUT';
  constructor() {
    super('upstream timeout');
  }
}

/**
 * Opens an upstream request on the replica routing picks for the call's rollout (moved to another
 * when its replica fails before answering); destroyed with `UpstreamTimeout` after `timeoutMs`
 * without a byte. The replica that served it is noted on the capture.
 */
export function openUpstream(
  upstream: Upstream,
  capture: CallCapture | null,
  request: UpstreamRequestOptions,
  timeoutMs: number,
  on: { response: (ures: UpstreamResponse) => void; error: (err: NodeJS.ErrnoException) => void; timeout?: () => void },
): UpstreamRequest {
  // A rollout id the sidecar made up is never seen again: nothing to keep the call near.
  const key = capture && capture.correlation.source !== 'self' ? capture.correlation.rolloutId : null;
  const route = new Route(upstream, key, capture);
  const r = route.replica.client.request(request);
  r.route = route;
  r.setTimeout(timeoutMs, () => {
    on.timeout?.();
    r.destroy(new UpstreamTimeout());
  });
  r.on('response', on.response);
  r.on('error', on.error);
  return r;
}

/** One exchange's replica: picked, moved on failover, counted out when the exchange is over. */
class Route implements ExchangeRoute {
  replica: Replica;
  private tried: Set<Replica> | null = null;
  private reachedOnce = false;

  constructor(
    private readonly pool: Upstream,
    private readonly key: string | null,
    private readonly capture: CallCapture | null,
  ) {
    this.replica = pool.pick(key);
  }

  reroute(err: Error, reached: boolean): UpstreamClient | null {
    // A server that read the request and then died may have died of the request: it goes to one
    // more replica, not to every one (each would be marked down in turn).
    if (reached && this.reachedOnce) return null;
    this.tried ??= new Set([this.replica]);
    const next = this.pool.failover(this.key, this.replica, this.tried, err);
    if (next === null) return null;
    this.reachedOnce ||= reached;
    this.tried.add(next);
    this.replica = next;
    return next.client;
  }

  answered(): void {
    if (this.capture) this.capture.upstreamReplica = this.replica.id;
  }

  finished(): void {
    this.pool.release(this.replica);
  }
}

/**
 * Writes an answer's bytes to the agent: when the agent's connection is full the upstream answer
 * is paused until it drains (one wait at a time however many writes fill it), so a slow agent
 * holds the model server's bytes in the kernel, not in the sidecar.
 */
export function agentWriter(res: ServerResponse, ures: UpstreamResponse): (bytes: Buffer) => void {
  let paused = false;
  return (bytes) => {
    if (res.write(bytes) || paused) return;
    paused = true;
    ures.pause();
    res.once('drain', () => {
      paused = false;
      ures.resume();
    });
  };
}

/** How an upstream request that got no answer is answered: 504 when it timed out, else 502. */
export interface UpstreamFailure {
  status: 502 | 504;
  code: 'upstream_timeout' | 'upstream_unreachable';
  message: string;
}

export function upstreamFailure(err: NodeJS.ErrnoException, timedOut: boolean, host: string, timeoutMs: number): UpstreamFailure {
  return timedOut
    ? { status: 504, code: 'upstream_timeout', message: `upstream did not answer within ${timeoutMs} ms` }
    : { status: 502, code: 'upstream_unreachable', message: `upstream ${host} unreachable: ${err.code ?? err.message}` };
}

/** How much of a refusal's body is read to find a field name in it. */
export const REFUSAL_READ_LIMIT = 64 * 1024;

/**
 * A refusal of a field the sidecar added: a 400 or 422 whose body names one. The call is then sent
 * once more without the added fields, and the server is known not to take them (flavor.ts).
 */
export function refusal(status: number, text: string, added: readonly string[]): { field: string; detail: string } | null {
  if (status !== 400 && status !== 422) return null;
  const field = added.find((f) => text.includes(f));
  return field === undefined ? null : { field, detail: `${status}: ${text.slice(0, 200)}` };
}

/** The bytes to journal for a request body: redacted when configured; null when that cannot be done (not JSON). */
export function redacted(redact: ((body: unknown) => unknown) | null | undefined, bytes: Buffer): Buffer | null {
  if (!redact) return bytes;
  try {
    return Buffer.from(JSON.stringify(redact(JSON.parse(bytes.toString('utf8')))));
  } catch {
    return null;
  }
}

/** How a call ended, for its record and its metrics. */
export interface CallEnd {
  status: 'ok' | 'error' | 'aborted';
  error: string | null;
  /** The `status_class` label: `2xx`…`5xx`, `client_abort`, `upstream_abort`. */
  statusClass: string;
  /** The agent got an event stream. */
  streamed: boolean;
}

/** What a plan's executor uses of the engine (call-engine.ts implements it). */
export interface Engine {
  readonly config: LlmProxyConfig;
  readonly metrics: Metrics;
  readonly upstream: Upstream;
  /** Journaled request bodies are redacted (a pass-through body is then held whole). */
  readonly redacts: boolean;
  /** What the model server is taken to be now (which fields it takes). */
  flavor(): Flavor;
  /** Fields added beside the flavor's own (SGLang's routing request, the call's sampling-mask request), or null. */
  extraFields(call?: Call): Record<string, string> | null;
  /** The upstream's response head arrived (`at`, after it left at `sentAt`): first-byte time, policy version. */
  responded(call: Call, ures: UpstreamResponse, sentAt: number, at?: number): void;
  /** The server refused a field the sidecar added: stop adding it. */
  refused(field: string, detail: string): void;
  /** The upstream request got no answer (its error, and how the agent is answered). */
  upstreamFailed(err: NodeJS.ErrnoException, failure: UpstreamFailure): void;
  /** A request body as it may be journaled: redacted when configured; null when it cannot be (not JSON). */
  redactedBody(body: Buffer): Buffer | null;
  /** Journals the request as sent upstream, redacted first when configured. */
  journalRequest(capture: CallCapture, body: Buffer): void;
  /** The request bytes journaled so far for a call. */
  journaledRequest(capture: CallCapture): Buffer;
  /** Answers 413 (the body is over max_request_bytes) and ends the call's record. */
  tooLarge(call: Call): void;
  /**
   * Ends the call: its record is journaled and written through, then `deliver` (the agent's last
   * bytes), then metrics. Without `deliver` the caller ends the response as soon as this returns,
   * so the write-through happens at once; with it, it may join the other calls ending in this
   * turn of the event loop.
   */
  settle(call: Call, end: CallEnd, deliver: (() => void) | null): void;
}
