import type { IncomingMessage, ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import type { LlmProxyConfig } from '../../config/schema';
import type { Api } from '../../model/records';
import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import type { CallCapture } from './capture';
import { sendProxyError } from './errors';
import type { UpstreamFlavor } from './flavor';
import { forwardHeaders } from './forward-headers';
import { fieldsFor, injectFields, StreamInjector } from './inject';
import type { ProxyDeps } from './proxy';
import { broughtMembers, nullMemberParts, SseStripper } from './strip';
import { UpstreamClient, type UpstreamRequest, type UpstreamResponse } from './upstream-client';

/**
 * One proxied call, from the agent's body to the end of the answer: the request streams to the
 * model server (fields for token ids added on the way when the server is known to take them),
 * the answer streams back (members the sidecar asked for given back as null), and every byte is
 * teed into the journal through the call's capture. The answer completes for the agent only once
 * the call is written through (docs/capture-path.md).
 */
export interface ForwardContext {
  config: LlmProxyConfig;
  deps: ProxyDeps;
  upstream: Upstream;
  flavors: UpstreamFlavor;
  log: Logger;
  m: Metrics;
  tooLarge: (req: IncomingMessage, res: ServerResponse, api: Api | null, capture: CallCapture | null, t0: number) => void;
  finishCapture: (capture: CallCapture, status: 'ok' | 'error' | 'aborted', error: string | null, t0: number) => boolean;
  /** Whether this is the only call in flight (its end need not wait for others to share the journal's write). */
  alone: () => boolean;
  journalRequest: (capture: CallCapture, body: Buffer) => void;
}

export interface Upstream {
  client: UpstreamClient;
  /** The Host header value. */
  host: string;
  /** Path prefix of the upstream URL (e.g. `/v1`). */
  basePath: string;
}

export function parseUpstream(url: string): Upstream {
  const u = new URL(url);
  const secure = u.protocol === 'https:';
  return {
    client: new UpstreamClient({ hostname: u.hostname.replace(/^\[|\]$/g, ''), port: u.port ? Number(u.port) : secure ? 443 : 80, secure }),
    host: u.host,
    basePath: u.pathname.replace(/\/+$/, ''),
  };
}

/** `/v1/x` on the proxy → `{upstream}/x`; any other path → the upstream's origin + path. */
export function upstreamPath(basePath: string, path: string): string {
  if (path === '/v1' || path.startsWith('/v1/') || path.startsWith('/v1?')) return basePath + path.slice(3);
  return path;
}

export const POLICY_VERSION = /^[A-Za-z0-9._:+-]{1,64}$/;

export function forwardCall(
  ctx: ForwardContext,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  api: Api | null,
  capture: CallCapture | null,
  t0: number,
  /** The agent's whole body when it was read already (a call that could not be translated). */
  preread: Buffer | null = null,
): Promise<void> {
  const { config, deps, upstream, flavors, log, m, tooLarge, finishCapture, alone, journalRequest } = ctx;
  return new Promise<void>((resolve) => {
    const flavor = flavors.current();
    const encoded = !!req.headers['content-encoding'];
    // The body is held whole only to redact it before journaling; fields for the model server
    // are added to the stream as it passes.
    const mustBuffer = capture !== null && !!deps.redact && !encoded;
    const fields = capture !== null && !mustBuffer && !encoded && preread === null ? fieldsFor(flavor, capture.api) : null;
    const injector = fields ? new StreamInjector(fields) : null;
    let settled = false;
    let rejected = false;
    let upstreamT0 = 0;
    let received = 0;
    let ureq: UpstreamRequest | null = null;
    /**
     * Ends the call: its record is journaled and written through (with the other calls ending in
     * this turn of the event loop), then `deliver` (the agent's last bytes), then metrics.
     */
    const settle = (status: 'ok' | 'error' | 'aborted', error: string | null, statusClass: string, deliver?: () => void): void => {
      if (settled) return;
      settled = true;
      const finish = (): void => {
        try {
          deliver?.();
        } finally {
          m.proxyRequests.inc({ api: api ?? 'other', status_class: statusClass });
          m.proxyDuration.observe({ api: api ?? 'other', streamed: capture?.streamed ? 'true' : 'false' }, (performance.now() - t0) / 1000);
          resolve();
        }
      };
      if (!capture || !finishCapture(capture, status, error, t0)) return finish();
      try {
        // The only call in flight writes through at once: no other call could share the write, and
        // the rest of the event loop's turn it would wait for is time the agent waits.
        if (!alone()) return deps.capture.afterWrite(finish);
        deps.capture.flush();
      } catch (err) {
        // Capture never fails the call: the answer goes out unwritten, counted.
        m.captureDrops.inc({ reason: 'capture_error' });
        log.once('capture_write_error', 'error', 'capture could not write a call through; the call itself is served', { err });
      }
      finish();
    };
    const upstreamBroke = (reason: string): void => {
      if (settled) return;
      res.destroy();
      settle('error', reason, 'upstream_abort');
    };

    const dispatch = (headers: string[]): UpstreamRequest => {
      upstreamT0 = performance.now();
      const r = upstream.client.request({ method: req.method ?? 'GET', path: upstreamPath(upstream.basePath, path), headers });
      r.setTimeout(config.upstream_timeout_ms, () => r.destroy(new UpstreamTimeout()));
      r.on('response', (ures) => onResponse(ures));
      r.on('error', (err: NodeJS.ErrnoException) => onUpstreamError(err));
      return r;
    };

    let retried = false;
    /** Sends the agent's own body again, without the added fields (the server refused one). */
    const retryWithout = (field: string, detail: string): boolean => {
      if (retried || !capture || capture.begin() === null || !injector) return false;
      let original: Buffer;
      try {
        capture.flush('request');
        original = injector.original(deps.capture.read(capture.requestFrames));
      } catch {
        return false;
      }
      retried = true;
      flavors.refused(field, detail);
      capture.restart('request');
      capture.request(original);
      capture.injected = [];
      ureq = dispatch(forwardHeaders(req.rawHeaders, { host: upstream.host, 'content-length': String(original.length) }, DROP_WHEN_REWRITTEN));
      ureq.end(original);
      return true;
    };

    const onResponse = (ures: UpstreamResponse): void => {
      const tHead = performance.now();
      const status = ures.statusCode ?? 502;
      const streamed = (ures.headers['content-type'] ?? '').startsWith('text/event-stream');
      const added = capture?.injected ?? [];
      // A refusal of an added field is read whole (small, bounded) to decide on a retry.
      if (added.length > 0 && !retried && (status === 400 || status === 422) && !streamed) return checkRefusal(ures, added);
      const out = forwardHeaders(ures.rawHeaders, streamed && !ures.headers['x-accel-buffering'] ? SSE_EXTRA : NONE);
      if (capture) {
        capture.responseStatus = status;
        capture.streamed = streamed;
        capture.responseEncoding = ures.headers['content-encoding'];
        if (deps.policyHeader) {
          const v = ures.headers[deps.policyHeader];
          if (typeof v === 'string' && POLICY_VERSION.test(v.trim())) capture.policyVersion = v.trim();
        }
      }
      if (api) {
        m.upstreamTtfb.observe({ api }, (tHead - upstreamT0) / 1000);
        m.proxyAdded.observe({ api }, (upstreamT0 - t0 + (performance.now() - tHead)) / 1000);
      }
      // What the sidecar asked for on the agent's behalf stays with the sidecar: those members
      // are given back as null (the journal keeps the server's bytes).
      const strip = config.strip_injected && added.length > 0 && status < 300 && !ures.headers['content-encoding'] ? broughtMembers(added) : [];
      if (strip.length > 0 && !streamed) return relayStrippedJson(ures, status, out, strip);
      const sse = strip.length > 0 ? new SseStripper(strip) : null;
      res.writeHead(status, ures.statusMessage, sse ? withoutLength(out) : out);
      // A stream's headers go out with its first chunk when that arrives in the same turn of the
      // event loop (one write), else on their own right after it (the agent sees them at once).
      let wrote = false;
      if (streamed)
        setImmediate(() => {
          if (!wrote && !res.writableEnded && !res.destroyed) res.flushHeaders();
        });
      // A captured answer is complete for the agent only once its record is in the journal: the
      // chunk that completes a content-length body (or the chunked terminator) is held until then.
      const declared = capture && !sse ? Number(ures.headers['content-length']) : NaN;
      let passed = 0;
      let held: Buffer | undefined;
      const write = (chunk: Buffer): void => {
        wrote = true;
        if (!res.write(chunk)) {
          ures.pause();
          res.once('drain', () => ures.resume());
        }
      };
      ures.on('data', (chunk: Buffer) => {
        if (capture) {
          if (capture.firstByteAt === null) capture.firstByteAt = performance.now();
          passed += chunk.length;
          if (passed >= declared) {
            capture.response(chunk);
            held = chunk;
            return;
          }
        }
        // The agent's bytes go out first; they are teed into the journal right after, in this turn.
        if (sse) for (const part of sse.push(chunk)) write(part);
        else write(chunk);
        capture?.response(chunk);
      });
      ures.on('end', () => {
        if (streamed && api && capture) m.streamedChunks.inc({ api }, capture.chunks);
        const tail = sse ? Buffer.concat(sse.end()) : held;
        settle('ok', null, `${Math.floor(status / 100)}xx`, () => res.end(tail));
      });
      ures.on('close', () => {
        if (!ures.complete) upstreamBroke('upstream closed the response before its end');
      });
    };

    /** A JSON answer with members given back as null: held whole, sent with its new length. */
    const relayStrippedJson = (ures: UpstreamResponse, status: number, out: string[], strip: string[]): void => {
      const parts: Buffer[] = [];
      ures.on('data', (chunk: Buffer) => {
        if (capture!.firstByteAt === null) capture!.firstByteAt = performance.now();
        capture!.response(chunk);
        parts.push(chunk);
      });
      ures.on('end', () => {
        const body = nullMemberParts(parts.length === 1 ? parts[0] : Buffer.concat(parts), strip);
        let length = 0;
        for (const p of body) length += p.length;
        settle('ok', null, `${Math.floor(status / 100)}xx`, () => {
          res.writeHead(status, ures.statusMessage, setLength(out, length));
          // One write for the pieces (they stay pieces of the server's answer, not a copy).
          res.cork();
          for (const p of body.slice(0, -1)) res.write(p);
          res.end(body[body.length - 1]);
          res.uncork();
        });
      });
      ures.on('close', () => {
        if (!ures.complete) upstreamBroke('upstream closed the response before its end');
      });
    };

    /** The server refused the call: if it names a field the sidecar added, send the call again without them. */
    const checkRefusal = (ures: UpstreamResponse, added: string[]): void => {
      const parts: Buffer[] = [];
      let bytes = 0;
      ures.on('data', (chunk: Buffer) => {
        bytes += chunk.length;
        if (bytes <= 64 * 1024) parts.push(chunk);
      });
      ures.on('end', () => {
        const body = Buffer.concat(parts);
        const text = body.toString('utf8');
        const field = added.find((f) => text.includes(f));
        if (field && bytes <= 64 * 1024 && retryWithout(field, `${ures.statusCode}: ${text.slice(0, 200)}`)) return;
        // Not about the added fields: the agent gets the server's answer as it is.
        if (capture) {
          capture.responseStatus = ures.statusCode ?? 502;
          capture.response(body);
        }
        settle('ok', null, `${Math.floor((ures.statusCode ?? 502) / 100)}xx`, () =>
          res.writeHead(ures.statusCode ?? 502, ures.statusMessage, forwardHeaders(ures.rawHeaders, NONE)).end(body),
        );
      });
      ures.on('close', () => {
        if (!ures.complete) upstreamBroke('upstream closed the response before its end');
      });
    };

    const onUpstreamError = (err: NodeJS.ErrnoException): void => {
      if (settled) return;
      const timeout = err instanceof UpstreamTimeout;
      if (res.headersSent) {
        upstreamBroke(timeout ? 'upstream went idle past upstream_timeout_ms' : `upstream failed mid-response: ${err.message}`);
        return;
      }
      const code = timeout ? 504 : 502;
      const message = timeout
        ? `upstream did not answer within ${config.upstream_timeout_ms} ms (receivers.llm_proxy.upstream_timeout_ms)`
        : `upstream ${upstream.host} unreachable: ${err.code ?? err.message}`;
      if (capture) capture.responseStatus = code;
      if (!timeout) flavors.unreachable();
      sendProxyError(res, code, timeout ? 'upstream_timeout' : 'upstream_unreachable', message, api);
      log.once(`upstream:${err.code ?? (timeout ? 'timeout' : 'error')}`, 'warn', 'upstream request failed', {
        code: err.code,
        timeout,
        upstream: upstream.host,
      });
      settle('error', message, `${Math.floor(code / 100)}xx`);
    };

    // A client that goes away before the response ended: abort upstream, keep what arrived.
    res.on('close', () => {
      if (settled || res.writableFinished) return;
      ureq?.destroy();
      settle('aborted', 'client closed the connection before the response ended', 'client_abort');
    });
    // A request body that never completed (the client stalled and was answered 408, or vanished).
    req.once('close', () => {
      if (settled || req.complete) return;
      ureq?.destroy();
      settle('aborted', 'the client stopped sending its request body', 'client_abort');
    });

    const overLimit = (): void => {
      rejected = true;
      ureq?.destroy();
      req.resume();
      if (res.headersSent) {
        upstreamBroke('request body over max_request_bytes');
        return;
      }
      settled = true;
      tooLarge(req, res, api, capture, t0);
      resolve();
    };

    /** Sends a body held whole: fields added (when it is a captured call's) and journaled first. */
    const sendWhole = (whole: Buffer): void => {
      let body = whole;
      if (capture) {
        const injection = encoded ? null : injectFields(flavor, capture.api, body);
        if (injection) {
          body = injection.body;
          capture.injected = injection.injected;
        }
      }
      const headers = forwardHeaders(req.rawHeaders, { host: upstream.host, 'content-length': String(body.length) }, DROP_WHEN_REWRITTEN);
      ureq = dispatch(headers);
      ureq.end(body);
      if (capture) journalRequest(capture, body);
    };

    if (preread !== null) {
      sendWhole(preread);
    } else if (mustBuffer) {
      const parts: Buffer[] = [];
      req.on('data', (chunk: Buffer) => {
        if (rejected) return;
        received += chunk.length;
        if (received > config.max_request_bytes) return overLimit();
        parts.push(chunk);
      });
      req.on('end', () => {
        if (rejected || settled) return;
        sendWhole(Buffer.concat(parts));
      });
    } else {
      // With an injector, the upstream request starts once the body's first bytes show where the
      // fields go (its content-length grows by what is added).
      const open = (): UpstreamRequest => {
        const declared = req.headers['content-length'];
        const extra = injector?.extraBytes ?? 0;
        const headers =
          extra > 0 && declared !== undefined
            ? forwardHeaders(req.rawHeaders, { host: upstream.host, 'content-length': String(Number(declared) + extra) }, DROP_WHEN_REWRITTEN)
            : forwardHeaders(req.rawHeaders, { host: upstream.host }, DROP_ALWAYS);
        ureq = dispatch(headers);
        return ureq;
      };
      let r: UpstreamRequest | null = injector ? null : open();
      const send = (parts: Buffer[]): void => {
        // The pieces of a chunk (fields added between them) go out in one write, before any
        // capture work (the journal takes them by reference; it writes them later in this turn).
        if (!r!.write(parts)) {
          req.pause();
          r!.once('drain', () => req.resume());
        }
        if (capture) for (const part of parts) if (part.length > 0) capture.request(part);
      };
      req.on('data', (chunk: Buffer) => {
        if (rejected) return;
        received += chunk.length;
        if (received > config.max_request_bytes) return overLimit();
        if (!injector) return send([chunk]);
        const out = injector.push(chunk);
        if (r === null && injector.decided) r = open();
        if (r !== null) send(out);
      });
      req.on('end', () => {
        if (rejected) return;
        if (injector) {
          const out = injector.end();
          r ??= open();
          send(out);
          capture!.injected = injector.injected(capture!.requestRepeats());
          const notes = injector.notes();
          if (notes !== null) capture!.noteRequest(notes);
        }
        r!.end();
      });
    }
  });
}

class UpstreamTimeout extends Error {
  readonly code = 'UPSTREAM_TIMEOUT';
  constructor() {
    super('upstream timeout');
  }
}

/** `expect` was answered by this server already (Node sends 100-continue itself). */
const DROP_ALWAYS = new Set(['expect']);
/** When the body is rewritten, its length is set anew. */
const DROP_WHEN_REWRITTEN = new Set(['expect', 'content-length']);
/** Asks buffering reverse proxies in front of us (nginx, ingress) not to hold SSE back. */
const SSE_EXTRA = { 'x-accel-buffering': 'no' };
const NONE = {};

function withoutLength(headers: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < headers.length; i += 2) if (headers[i].toLowerCase() !== 'content-length') out.push(headers[i], headers[i + 1]);
  return out;
}

function setLength(headers: string[], length: number): string[] {
  return [...withoutLength(headers), 'content-length', String(length)];
}
