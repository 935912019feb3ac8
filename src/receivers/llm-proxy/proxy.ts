import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { LISTENERS } from '../../config/listeners';
import { boundAddress } from '../../config/address';
import { upstreamUrls, type LlmProxyConfig } from '../../config/schema';
import type { GateHold } from '../../model/component';
import type { Api } from '../../model/records';
import type { SequenceCounter } from '../../model/sequence';
import type { Logger } from '../../telemetry/logger';
import { boundPort, listen } from '../../telemetry/listen';
import { recordedApi } from '../../formats/adapters';
import type { Call } from './call';
import { CallEngine, type EngineDeps } from './call-engine';
import { CallCapture } from './capture';
import { CorrelationError, ID_PATTERN, parseTraceparent, resolveCorrelation, routePath } from './correlation';
import { sendProxyError } from './errors';
import { UpstreamFlavor } from './flavor';
import { upstreamPathWarning } from './path-hints';

/**
 * The LLM proxy's server: it admits each call (the trainer's pause, correlation, the capture that
 * records it, the request's size and pace) and hands it to the call engine (call-engine.ts), which
 * serves it. It also owns the listening socket and the drain on shutdown.
 */
export interface ProxyDeps extends EngineDeps {
  sequences: SequenceCounter;
  /** Routes served by the sidecar itself on this port (rollout API); true when handled. */
  localRoutes?: (req: IncomingMessage, res: ServerResponse) => boolean;
  /** The trainer's pause: null = go now; else wait for the hold's answer. */
  gate?: () => GateHold | null;
  /** The policy version new calls are made with (control channel or config). */
  policyVersion?: () => string | null;
  /** What the model server is (configured or detected); made from the config when absent. */
  flavor?: UpstreamFlavor;
}

export function createLlmProxy(config: LlmProxyConfig, deps: ProxyDeps) {
  const log = deps.logger.child('llm_proxy');
  const m = deps.metrics;
  const now = deps.now ?? Date.now;
  const flavors =
    deps.flavor ??
    new UpstreamFlavor(config.upstream_flavor, upstreamUrls(config.upstream_url), { logger: deps.logger, metrics: m, identifyWaitMs: config.identify_wait_ms });
  const inFlight = new Set<Promise<void>>();
  const engine = new CallEngine(config, deps, flavors, log, () => inFlight.size);
  const upstream = engine.upstream;
  const { server, sockets } = proxyServer(config, log, handle);

  /** Keeps a call (or a held one) counted until it ends: shutdown waits for these. */
  function track(p: Promise<void>): void {
    inFlight.add(p);
    void p.finally(() => inFlight.delete(p));
  }

  function handle(req: IncomingMessage, res: ServerResponse): void {
    const url = req.url ?? '/';
    if (deps.localRoutes?.(req, res)) return;
    const routed = routePath(url);
    const api = recordedApi(req.method, routed.path);
    const held = api ? (deps.gate?.() ?? null) : null;
    if (held === null) {
      // A recorded call made while the model server is being identified (the sidecar just
      // started, or no replica had answered) waits for that, boundedly, so that it is asked for
      // token ids like every later call; its body waits in the socket meanwhile.
      const identifying = api ? flavors.identified() : null;
      // (admit tracks the call it serves.)
      if (identifying === null) void admit(req, res, routed, api);
      // Tracked until the call itself ends (admit's promise), so a shutdown waits for it too.
      else
        track(
          identifying.then(() => {
            if (res.destroyed) req.resume();
            else return admit(req, res, routed, api);
          }),
        );
      return;
    }
    // Paused for a weight sync: the body waits in the socket; the call goes (or gets 429) later.
    // A client that gives up while held (its own timeout, a retry) gives its place back, and its
    // call never reaches the model server: no one would read the answer.
    const gone = (): void => held.abandon();
    res.once('close', gone);
    track(
      held.result.then((r) => {
        res.off('close', gone);
        if (res.destroyed) return;
        if (r.go) return admit(req, res, routed, api);
        m.proxyRequests.inc({ api: api ?? 'other', status_class: '4xx' });
        req.resume();
        sendProxyError(res, 429, 'policy_update', `${r.reason}; retry after ${r.retryAfterS} s`, api, {
          'retry-after': String(r.retryAfterS),
          'x-lightning-paused': 'true',
        });
      }),
    );
  }

  /** Admits a call; its promise (already tracked) when it is served, undefined when it was answered at once. */
  function admit(req: IncomingMessage, res: ServerResponse, routed: ReturnType<typeof routePath>, api: Api | null): Promise<void> | undefined {
    const t0 = performance.now();
    guardBody(config, log, req, res, api);
    let capture: CallCapture | null;
    try {
      capture = openCapture(routed, api, req);
    } catch (err) {
      if (!(err instanceof CorrelationError)) throw err;
      m.proxyRequests.inc({ api: api ?? 'other', status_class: '4xx' });
      req.resume();
      sendProxyError(res, 400, 'invalid_rollout_id', err.message, api);
      return;
    }
    const call: Call = { req, res, path: routed.path, api, capture, t0 };
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > config.max_request_bytes) {
      engine.tooLarge(call);
      return;
    }
    const running = engine.run(call);
    track(running);
    return running;
  }

  /** The capture that records a call of a recorded API (null for any other); throws CorrelationError on a bad id. */
  function openCapture(routed: ReturnType<typeof routePath>, api: Api | null, req: IncomingMessage): CallCapture | null {
    if (!api) {
      if (routed.rolloutId !== null && (!ID_PATTERN.test(routed.rolloutId) || !ID_PATTERN.test(routed.attemptId ?? '0')))
        throw new CorrelationError('rollout id', routed.rolloutId);
      return null;
    }
    const trace = parseTraceparent(req.headers.traceparent as string | undefined);
    const correlation = resolveCorrelation(routed, req.headers, trace);
    // A rollout id the sidecar made up for an uncorrelated call is never seen again: seq 0, nothing kept.
    const seq = correlation.source === 'self' ? 0 : deps.sequences.take(correlation.rolloutId, correlation.attemptId);
    if (correlation.parentRolloutId !== undefined) {
      const parentSeq = deps.sequences.last(correlation.parentRolloutId, correlation.parentAttemptId!);
      if (parentSeq !== null) correlation.parentSeq = parentSeq;
    }
    const capture = new CallCapture(api, correlation, seq, trace?.traceId ?? null, trace?.spanId ?? null, now(), config.max_capture_bytes, deps.capture);
    capture.policyVersion = deps.policyVersion?.() ?? null;
    return capture;
  }

  let started = false;
  const shutdownOnce = { p: undefined as Promise<void> | undefined };
  return {
    server,
    async start(): Promise<void> {
      const host = await listen(server, config.endpoint, LISTENERS.proxy);
      started = true;
      engine.endpoint = boundAddress(config.endpoint, boundPort(server));
      await Promise.all([flavors.start(), upstream.start()]);
      log.info('listening', { address: `${host}:${this.port()}`, upstream: `${upstream.host}${upstream.basePath}` });
      const noPath = upstreamPathWarning(upstream.basePath);
      if (noPath) log.warn(noPath, { upstream: upstream.host });
    },
    port: (): number => boundPort(server),
    inFlight(): number {
      return inFlight.size;
    },
    /** What is known about the model server. */
    upstream: () => flavors.state(),
    /** The flavor whose fields are added now (`openai`: none). */
    flavor: () => flavors.current(),
    /** The replicas and where rollouts are placed. */
    routing: () => upstream.state(),
    /** Stops accepting; lets in-flight calls finish until the deadline, then cuts them. */
    shutdown(deadlineMs = 25_000): Promise<void> {
      shutdownOnce.p ??= (async () => {
        if (!started) return;
        flavors.shutdown();
        server.close();
        server.closeIdleConnections();
        const deadline = new Promise<void>((r) => setTimeout(r, deadlineMs).unref());
        await Promise.race([Promise.allSettled([...inFlight]), deadline]);
        for (const s of sockets) s.destroy();
        upstream.close();
      })();
      return shutdownOnce.p;
    },
  };
}

/** The proxy's HTTP server and the sockets it has open (cut at the shutdown deadline). */
function proxyServer(config: LlmProxyConfig, log: Logger, handle: (req: IncomingMessage, res: ServerResponse) => void) {
  // requestTimeout 0: a whole request may take long (big bodies on slow links); slow or stalled
  // clients are cut by the header timeout and by the body idle timeout (guardBody) instead.
  const server = http.createServer(
    {
      keepAlive: true,
      requestTimeout: 0,
      headersTimeout: config.client_header_timeout_ms,
      connectionsCheckingInterval: Math.max(100, Math.min(1000, config.client_header_timeout_ms / 2)),
    },
    handle,
  );
  server.keepAliveTimeout = 65_000;
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Socket) => {
    const status = err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? '408 Request Timeout' : '400 Bad Request';
    if (socket.writable && !socket.destroyed) socket.end(`HTTP/1.1 ${status}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
    else socket.destroy();
    log.once(`client_error:${err.code ?? 'unknown'}`, 'warn', 'malformed request from a client', { err });
  });
  return { server, sockets };
}

/** Abandons a request whose body stops arriving for client_body_idle_timeout_ms: 408, connection closed. */
function guardBody(config: LlmProxyConfig, log: Logger, req: IncomingMessage, res: ServerResponse, api: Api | null): void {
  if (req.complete) return;
  const timer = setTimeout(() => {
    log.once('body_idle', 'warn', 'a client stopped sending its request body; abandoned', { timeout_ms: config.client_body_idle_timeout_ms });
    if (!res.headersSent) {
      res.shouldKeepAlive = false;
      sendProxyError(
        res,
        408,
        'request_timeout',
        `request body idle for ${config.client_body_idle_timeout_ms} ms (receivers.llm_proxy.client_body_idle_timeout_ms)`,
        api,
        { connection: 'close' },
      );
    }
    req.destroy();
  }, config.client_body_idle_timeout_ms);
  const stop = () => clearTimeout(timer);
  req.on('data', () => timer.refresh());
  req.once('end', stop);
  req.once('close', stop);
}

export type LlmProxy = ReturnType<typeof createLlmProxy>;
