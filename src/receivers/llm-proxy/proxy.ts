import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { splitAddress } from '../../config/address';
import type { LlmProxyConfig } from '../../config/schema';
import type { CaptureSink, GateHold } from '../../model/component';
import type { Api } from '../../model/records';
import type { SequenceCounter } from '../../model/sequence';
import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { recordedApi } from '../../formats/adapters';
import { CallCapture } from './capture';
import { CorrelationError, ID_PATTERN, parseTraceparent, resolveCorrelation, routePath } from './correlation';
import { sendProxyError } from './errors';
import { UpstreamFlavor } from './flavor';
import { forwardCall, parseUpstream, POLICY_VERSION, type ForwardContext } from './forward';
import { fieldsFor } from './inject';
import { planTranslation, serveTranslated, type TranslatedApi } from './translated-call';

export interface ProxyDeps {
  logger: Logger;
  metrics: Metrics;
  sequences: SequenceCounter;
  capture: CaptureSink;
  /** Routes served by the sidecar itself on this port (rollout API); true when handled. */
  localRoutes?: (req: IncomingMessage, res: ServerResponse) => boolean;
  now?: () => number;
  /** The trainer's pause: null = go now; else wait for the hold's answer. */
  gate?: () => GateHold | null;
  /** The policy version new calls are made with (control channel or config). */
  policyVersion?: () => string | null;
  /** Upstream response header naming the policy that answered (lower case). */
  policyHeader?: string;
  /** Removes configured secret fields from a parsed request body before it is journaled. */
  redact?: ((body: unknown) => unknown) | null;
  /** What the model server is (configured or detected); made from the config when absent. */
  flavor?: UpstreamFlavor;
}

export function createLlmProxy(config: LlmProxyConfig, deps: ProxyDeps) {
  const log = deps.logger.child('llm_proxy');
  const m = deps.metrics;
  const upstream = parseUpstream(config.upstream_url);
  const now = deps.now ?? Date.now;
  const flavors = deps.flavor ?? new UpstreamFlavor(config.upstream_flavor, config.upstream_url, { logger: deps.logger, metrics: m });
  const ctx: ForwardContext = { config, deps, upstream, flavors, log, m, tooLarge, finishCapture, alone: () => inFlight.size <= 1, journalRequest };
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
  const inFlight = new Set<Promise<void>>();

  function handle(req: IncomingMessage, res: ServerResponse): void {
    const url = req.url ?? '/';
    if (deps.localRoutes?.(req, res)) return;
    const routed = routePath(url);
    const api = recordedApi(req.method, routed.path);
    const held = api ? (deps.gate?.() ?? null) : null;
    if (held === null) {
      admit(req, res, routed, api);
      return;
    }
    // Paused for a weight sync: the body waits in the socket; the call goes (or gets 429) later.
    // A client that gives up while held (its own timeout, a retry) gives its place back, and its
    // call never reaches the model server: no one would read the answer.
    const gone = (): void => held.abandon();
    res.once('close', gone);
    const waiting = held.result.then((r) => {
      res.off('close', gone);
      if (res.destroyed) return;
      if (r.go) return admit(req, res, routed, api);
      m.proxyRequests.inc({ api: api ?? 'other', status_class: '4xx' });
      req.resume();
      sendProxyError(res, 429, 'policy_update', `${r.reason}; retry after ${r.retryAfterS} s`, api, {
        'retry-after': String(r.retryAfterS),
        'x-lightning-paused': 'true',
      });
    });
    inFlight.add(waiting);
    void waiting.finally(() => inFlight.delete(waiting));
  }

  /** Abandons a request whose body stops arriving for client_body_idle_timeout_ms: 408, connection closed. */
  function guardBody(req: IncomingMessage, res: ServerResponse, api: Api | null): void {
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

  function admit(req: IncomingMessage, res: ServerResponse, routed: ReturnType<typeof routePath>, api: Api | null): void {
    const t0 = performance.now();
    guardBody(req, res, api);
    const trace = api ? parseTraceparent(req.headers.traceparent as string | undefined) : null;
    let capture: CallCapture | null = null;
    try {
      if (api) {
        const correlation = resolveCorrelation(routed, req.headers, trace);
        // A rollout id the sidecar made up for an uncorrelated call is never seen again: seq 0, nothing kept.
        const seq = correlation.source === 'self' ? 0 : deps.sequences.take(correlation.rolloutId, correlation.attemptId);
        if (correlation.parentRolloutId !== undefined) {
          const parentSeq = deps.sequences.last(correlation.parentRolloutId, correlation.parentAttemptId!);
          if (parentSeq !== null) correlation.parentSeq = parentSeq;
        }
        capture = new CallCapture(api, correlation, seq, trace?.traceId ?? null, trace?.spanId ?? null, now(), config.max_capture_bytes, deps.capture);
        capture.policyVersion = deps.policyVersion?.() ?? null;
      } else if (routed.rolloutId !== null && (!ID_PATTERN.test(routed.rolloutId) || !ID_PATTERN.test(routed.attemptId ?? '0'))) {
        throw new CorrelationError('rollout id', routed.rolloutId);
      }
    } catch (err) {
      if (!(err instanceof CorrelationError)) throw err;
      m.proxyRequests.inc({ api: api ?? 'other', status_class: '4xx' });
      req.resume();
      sendProxyError(res, 400, 'invalid_rollout_id', err.message, api);
      return;
    }
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > config.max_request_bytes) {
      tooLarge(req, res, api, capture, t0);
      return;
    }
    const done =
      capture && translatable(capture.api, req)
        ? translate(req, res, routed.path, capture, t0).catch((err: unknown) => {
            log.once('translate_error', 'error', 'a translated call failed inside the sidecar', { err });
            if (!res.headersSent) sendProxyError(res, 500, 'translation_failed', 'the sidecar could not translate this call', api);
            else res.destroy();
            finishCapture(capture, 'error', `translation failed: ${(err as Error).message}`, t0);
          })
        : forwardCall(ctx, req, res, routed.path, api, capture, t0);
    inFlight.add(done);
    void done.finally(() => inFlight.delete(done));
  }

  function tooLarge(req: IncomingMessage, res: ServerResponse, api: Api | null, capture: CallCapture | null, t0: number): void {
    m.proxyRequests.inc({ api: api ?? 'other', status_class: '4xx' });
    res.shouldKeepAlive = false;
    sendProxyError(res, 413, 'request_too_large', `request body exceeds ${config.max_request_bytes} bytes (receivers.llm_proxy.max_request_bytes)`, api, {
      connection: 'close',
    });
    req.resume();
    if (capture) {
      capture.responseStatus = 413;
      finishCapture(capture, 'error', 'request body over max_request_bytes', t0);
    }
  }

  /** Responses / Anthropic calls go over chat completions (for token ids) when the server is vLLM or SGLang. */
  function translatable(api: Api, req: IncomingMessage): api is TranslatedApi {
    return (
      (api === 'responses' || api === 'anthropic.messages') &&
      config.translate.includes(api) &&
      flavors.current() !== 'openai' &&
      !req.headers['content-encoding']
    );
  }

  /** Reads the agent's body, then serves the call translated, or passes it through with the reason. */
  async function translate(req: IncomingMessage, res: ServerResponse, path: string, capture: CallCapture, t0: number): Promise<void> {
    const api = capture.api as TranslatedApi;
    const body = await readWhole(req, config.max_request_bytes);
    if (body === 'too_large') return tooLarge(req, res, api, capture, t0);
    if (body === 'aborted') {
      finishCapture(capture, 'aborted', 'the client stopped sending its request body', t0);
      return;
    }
    const planned = planTranslation(api, body);
    if (!planned.ok) {
      m.translatedCalls.inc({ api, result: 'passed_through' });
      capture.tokenIdsMissing = `not translated: ${planned.reason}`;
      return forwardCall(ctx, req, res, path, api, capture, t0, body);
    }
    m.translatedCalls.inc({ api, result: 'translated' });
    const upstreamT0 = performance.now();
    await serveTranslated(res, planned, {
      body,
      agentHeaders: req.rawHeaders,
      upstream,
      fields: fieldsFor(flavors.current(), 'chat.completions'),
      timeoutMs: config.upstream_timeout_ms,
      capture,
      redact: deps.redact,
      upstreamResponded: (ures) => {
        m.upstreamTtfb.observe({ api }, (performance.now() - upstreamT0) / 1000);
        const v = deps.policyHeader ? ures.headers[deps.policyHeader] : undefined;
        if (typeof v === 'string' && POLICY_VERSION.test(v.trim())) capture.policyVersion = v.trim();
      },
      refused: (field, detail) => flavors.refused(field, detail),
      // Before the agent's last bytes: the call is written through first, as on every path.
      settled: (o) => {
        if (o.failure === 'upstream_unreachable') flavors.unreachable();
        const statusClass = o.status === 'aborted' ? 'client_abort' : `${Math.floor((o.httpStatus ?? 502) / 100)}xx`;
        m.proxyRequests.inc({ api, status_class: statusClass });
        m.proxyDuration.observe({ api, streamed: o.streamed ? 'true' : 'false' }, (performance.now() - t0) / 1000);
        finishCapture(capture, o.status, o.error, t0);
        deps.capture.flush();
      },
    });
  }

  /** The request as sent upstream, redacted first when fields are configured to be. */
  function journalRequest(capture: CallCapture, body: Buffer): void {
    if (!deps.redact) {
      capture.request(body);
      return;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch {
      // Not JSON: it is recorded as null, so nothing of it is journaled.
      return;
    }
    capture.request(Buffer.from(JSON.stringify(deps.redact(parsed))));
  }

  /**
   * Journals the call's end record; false when it could not be (nothing to write through). Where
   * the agent's answer is still to complete, the caller writes the journal through first
   * (`capture.flush` or `capture.afterWrite`).
   */
  function finishCapture(capture: CallCapture, status: 'ok' | 'error' | 'aborted', error: string | null, t0: number): boolean {
    if (capture.begin() === null) {
      if (capture.startError !== null) {
        m.captureDrops.inc({ reason: 'capture_error' });
        log.once('capture_start_error', 'error', 'capture could not register a call; the call itself is served', { err: capture.startError });
      }
      return false;
    }
    try {
      const record = capture.finish({ status, error, endedAt: now(), endedMono: performance.now() }, t0);
      // Bytes the journal refused were counted as it refused them (journal_full, journal_unwritable).
      if (capture.capped) m.captureDrops.inc({ reason: 'capture_cap' });
      deps.capture.callEnded(record);
      return true;
    } catch (err) {
      m.captureDrops.inc({ reason: 'capture_error' });
      log.once('capture_error', 'error', 'capture of a proxied call failed; the call itself was served', { err });
      return false;
    }
  }

  let started = false;
  const shutdownOnce = { p: undefined as Promise<void> | undefined };
  return {
    server,
    async start(): Promise<void> {
      const [host, port] = splitAddress(config.endpoint);
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          resolve();
        });
      });
      started = true;
      await flavors.start();
      log.info('listening', { address: `${host}:${this.port()}`, upstream: `${upstream.host}${upstream.basePath}` });
    },
    port(): number {
      const a = server.address();
      return typeof a === 'object' && a ? a.port : 0;
    },
    inFlight(): number {
      return inFlight.size;
    },
    /** What is known about the model server. */
    upstream: () => flavors.state(),
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
        upstream.client.close();
      })();
      return shutdownOnce.p;
    },
  };
}

export type LlmProxy = ReturnType<typeof createLlmProxy>;

/** The whole body, or why not: over `limit` bytes, or the client went away first. */
function readWhole(req: IncomingMessage, limit: number): Promise<Buffer | 'too_large' | 'aborted'> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    let bytes = 0;
    req.on('data', (c: Buffer) => {
      bytes += c.length;
      if (bytes > limit) {
        req.removeAllListeners('data');
        req.resume();
        resolve('too_large');
        return;
      }
      parts.push(c);
    });
    req.once('end', () => resolve(Buffer.concat(parts)));
    req.once('close', () => {
      if (!req.complete) resolve('aborted');
    });
  });
}
