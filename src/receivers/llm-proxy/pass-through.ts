import { performance } from 'node:perf_hooks';
import { agentWriter, openUpstream, REFUSAL_READ_LIMIT, refusal, upstreamFailure, upstreamPath, UpstreamTimeout, type Call, type Engine } from './call';
import { sendProxyError } from './errors';
import type { Flavor } from './flavor';
import { forwardHeaders } from './forward-headers';
import { fieldsFor, injectFields, StreamInjector } from './inject';
import { broughtMembers, nullMemberParts, SseStripper } from './strip';
import type { UpstreamRequest, UpstreamResponse } from './upstream-client';

/**
 * The pass-through plan: the agent's call goes to the model server as it is, from the agent's
 * body to the end of the answer. The request streams upstream (fields for token ids added on the
 * way when the server is known to take them), the answer streams back (members the sidecar asked
 * for given back as null), and every byte is teed into the journal through the call's capture.
 * The answer completes for the agent only once the call is written through (docs/capture-path.md).
 *
 * `preread` is the agent's whole body when it was read already (a call that could not be
 * translated). The promise resolves once the call has ended, and never rejects.
 */
export function passThrough(engine: Engine, call: Call, preread: Buffer | null): Promise<void> {
  return new Promise<void>((resolve) => new PassThrough(engine, call, preread, resolve).start());
}

class PassThrough {
  private readonly flavor: Flavor;
  private readonly encoded: boolean;
  /** The body is held whole only to redact it before journaling; fields are added to the stream as it passes. */
  private readonly mustBuffer: boolean;
  private readonly injector: StreamInjector | null;
  private settled = false;
  /** The body went over max_request_bytes: what still arrives is dropped. */
  private rejected = false;
  private retried = false;
  private sentAt = 0;
  private received = 0;
  private ureq: UpstreamRequest | null = null;

  constructor(
    private readonly engine: Engine,
    private readonly call: Call,
    private readonly preread: Buffer | null,
    private readonly resolve: () => void,
  ) {
    const { req, capture } = call;
    this.flavor = engine.flavor();
    this.encoded = !!req.headers['content-encoding'];
    this.mustBuffer = capture !== null && engine.redacts && !this.encoded;
    const fields =
      capture !== null && !this.mustBuffer && !this.encoded && preread === null ? fieldsFor(this.flavor, capture.api, engine.extraFields(call)) : null;
    this.injector = fields ? new StreamInjector(fields) : null;
  }

  start(): void {
    const { req, res } = this.call;
    // A client that goes away before the response ended: abort upstream, keep what arrived.
    res.on('close', () => {
      // The agent's connection is gone: an upstream request still waiting for its body never gets it.
      if (!req.complete) this.ureq?.destroy();
      if (this.settled || res.writableFinished) return;
      this.ureq?.destroy();
      this.settle('aborted', 'client closed the connection before the response ended', 'client_abort');
    });
    // A request body that never completed (the client stalled and was answered 408, or vanished).
    req.once('close', () => {
      if (req.complete) return;
      // Even when the answer came first (an early 401): the upstream request never ended, so it is cut.
      this.ureq?.destroy();
      this.settle('aborted', 'the client stopped sending its request body', 'client_abort');
    });
    if (this.preread !== null) this.sendWhole(this.preread);
    else if (this.mustBuffer) this.bufferBody();
    else this.streamBody();
  }

  /** Ends the call through the engine (record, write-through, `deliver`, metrics), once. */
  private settle(status: 'ok' | 'error' | 'aborted', error: string | null, statusClass: string, deliver?: () => void): void {
    if (this.settled) return;
    this.settled = true;
    const end = { status, error, statusClass, streamed: this.call.capture?.streamed ?? false };
    this.engine.settle(this.call, end, () => {
      try {
        deliver?.();
      } finally {
        this.resolve();
      }
    });
  }

  private upstreamBroke(reason: string): void {
    if (this.settled) return;
    this.call.res.destroy();
    this.settle('error', reason, 'upstream_abort');
  }

  private dispatch(headers: string[]): UpstreamRequest {
    const { upstream, config } = this.engine;
    this.sentAt = performance.now();
    const request = { method: this.call.req.method ?? 'GET', path: upstreamPath(upstream.basePath, this.call.path), headers };
    return openUpstream(upstream, this.call.capture, request, config.upstream_timeout_ms, {
      response: (ures) => this.onResponse(ures),
      error: (err) => this.onUpstreamError(err),
    });
  }

  /** Headers for a body whose length is set anew (held whole, or grown by added fields). */
  private rewrittenHeaders(length: number): string[] {
    return forwardHeaders(this.call.req.rawHeaders, { host: this.engine.upstream.host, 'content-length': String(length) }, DROP_WHEN_REWRITTEN);
  }

  // ---- the request ----

  /** Sends a body held whole: fields added (when it is a captured call's) and journaled first. */
  private sendWhole(whole: Buffer): void {
    const { capture } = this.call;
    let body = whole;
    if (capture) {
      const injection = this.encoded ? null : injectFields(this.flavor, capture.api, body, this.engine.extraFields(this.call));
      if (injection) {
        body = injection.body;
        capture.injected = injection.injected;
      }
    }
    this.ureq = this.dispatch(this.rewrittenHeaders(body.length));
    this.ureq.end(body);
    if (capture) this.engine.journalRequest(capture, body);
  }

  private bufferBody(): void {
    const { req } = this.call;
    const parts: Buffer[] = [];
    req.on('data', (chunk: Buffer) => {
      if (this.rejected) return;
      this.received += chunk.length;
      if (this.received > this.engine.config.max_request_bytes) return this.overLimit();
      parts.push(chunk);
    });
    req.on('end', () => {
      if (this.rejected || this.settled) return;
      this.sendWhole(Buffer.concat(parts));
    });
  }

  private streamBody(): void {
    const { req, capture } = this.call;
    const injector = this.injector;
    // With an injector, the upstream request starts once the body's first bytes show where the
    // fields go (its content-length grows by what is added).
    const open = (): UpstreamRequest => {
      const declared = req.headers['content-length'];
      const extra = injector?.extraBytes ?? 0;
      const headers =
        extra > 0 && declared !== undefined
          ? this.rewrittenHeaders(Number(declared) + extra)
          : forwardHeaders(req.rawHeaders, { host: this.engine.upstream.host }, DROP_ALWAYS);
      this.ureq = this.dispatch(headers);
      return this.ureq;
    };
    let r: UpstreamRequest | null = injector ? null : open();
    const send = (parts: Buffer[]): void => {
      // The pieces of a chunk (fields added between them) go out in one write, before any
      // capture work (the journal takes them by reference; it writes them later in this turn).
      if (!r!.write(parts)) {
        req.pause();
        r!.once('drain', () => req.resume());
      }
      capture?.requestParts(parts);
    };
    req.on('data', (chunk: Buffer) => {
      if (this.rejected) return;
      this.received += chunk.length;
      if (this.received > this.engine.config.max_request_bytes) return this.overLimit();
      if (!injector) return send([chunk]);
      const out = injector.push(chunk);
      if (r === null && injector.decided) r = open();
      if (r !== null) send(out);
    });
    req.on('end', () => {
      if (this.rejected) return;
      if (injector) {
        const out = injector.end();
        r ??= open();
        send(out);
        capture!.injected = injector.injected(capture!.requestRepeats());
        capture!.namesImage = injector.namesImage();
        const notes = injector.notes();
        if (notes !== null) capture!.noteRequest(notes);
      }
      r!.end();
    });
  }

  private overLimit(): void {
    this.rejected = true;
    this.ureq?.destroy();
    this.call.req.resume();
    if (this.call.res.headersSent) {
      this.upstreamBroke('request body over max_request_bytes');
      return;
    }
    this.settled = true;
    this.engine.tooLarge(this.call);
    this.resolve();
  }

  /** Sends the agent's own body again, without the added fields (the server refused one). */
  private retryWithout(field: string, detail: string): boolean {
    const { capture, req } = this.call;
    if (this.retried || !capture || capture.begin() === null || !this.injector) return false;
    let original: Buffer;
    try {
      capture.flush('request');
      original = this.injector.original(this.engine.journaledRequest(capture));
    } catch {
      return false;
    }
    this.retried = true;
    this.engine.refused(field, detail);
    capture.restart('request');
    capture.request(original);
    capture.injected = [];
    this.ureq = this.dispatch(
      forwardHeaders(req.rawHeaders, { host: this.engine.upstream.host, 'content-length': String(original.length) }, DROP_WHEN_REWRITTEN),
    );
    this.ureq.end(original);
    return true;
  }

  // ---- the answer ----

  private onResponse(ures: UpstreamResponse): void {
    const { res, capture, api, t0 } = this.call;
    const tHead = performance.now();
    const status = ures.statusCode ?? 502;
    const streamed = (ures.headers['content-type'] ?? '').startsWith('text/event-stream');
    const added = capture?.injected ?? [];
    // A refusal of an added field is read whole (small, bounded) to decide on a retry.
    if (added.length > 0 && !this.retried && (status === 400 || status === 422) && !streamed) return this.checkRefusal(ures, added);
    const out = forwardHeaders(ures.rawHeaders, streamed && !ures.headers['x-accel-buffering'] ? SSE_EXTRA : NONE);
    if (capture) {
      capture.responseStatus = status;
      capture.streamed = streamed;
      capture.responseEncoding = ures.headers['content-encoding'];
    }
    this.engine.responded(this.call, ures, this.sentAt, tHead);
    if (api) this.engine.metrics.proxyAdded.observe({ api }, (this.sentAt - t0 + (performance.now() - tHead)) / 1000);
    // What the sidecar asked for on the agent's behalf stays with the sidecar: those members
    // are given back as null (the journal keeps the server's bytes).
    const strip = this.engine.config.strip_injected && added.length > 0 && status < 300 && !ures.headers['content-encoding'] ? broughtMembers(added) : [];
    if (strip.length > 0 && !streamed) return this.relayStrippedJson(ures, status, out, strip);
    const sse = strip.length > 0 ? new SseStripper(strip) : null;
    res.writeHead(status, ures.statusMessage, sse ? withoutLength(out) : out);
    this.relay(ures, status, streamed, sse);
  }

  /** Streams the answer's body to the agent, teeing it into the journal. */
  private relay(ures: UpstreamResponse, status: number, streamed: boolean, sse: SseStripper | null): void {
    const { res, capture, api } = this.call;
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
    const toAgent = agentWriter(res, ures);
    const write = (chunk: Buffer): void => {
      wrote = true;
      toAgent(chunk);
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
      if (streamed && api && capture) this.engine.metrics.streamedChunks.inc({ api }, capture.chunks);
      const tail = sse ? Buffer.concat(sse.end()) : held;
      this.settle('ok', null, `${Math.floor(status / 100)}xx`, () => res.end(tail));
    });
    this.watchCut(ures);
  }

  /** A JSON answer with members given back as null: held whole, sent with its new length. */
  private relayStrippedJson(ures: UpstreamResponse, status: number, out: string[], strip: readonly string[]): void {
    const { res } = this.call;
    const capture = this.call.capture!;
    const parts: Buffer[] = [];
    ures.on('data', (chunk: Buffer) => {
      if (capture.firstByteAt === null) capture.firstByteAt = performance.now();
      capture.response(chunk);
      parts.push(chunk);
    });
    ures.on('end', () => {
      const body = nullMemberParts(parts.length === 1 ? parts[0] : Buffer.concat(parts), strip);
      let length = 0;
      for (const p of body) length += p.length;
      this.settle('ok', null, `${Math.floor(status / 100)}xx`, () => {
        res.writeHead(status, ures.statusMessage, setLength(out, length));
        // A small answer goes out as one buffer (a copy costs less than a write call a piece); a
        // large one as its pieces in one write, not copied.
        if (body.length === 1 || length <= JOIN_UP_TO) return void res.end(body.length === 1 ? body[0] : Buffer.concat(body, length));
        res.cork();
        for (const p of body.slice(0, -1)) res.write(p);
        res.end(body[body.length - 1]);
        res.uncork();
      });
    });
    this.watchCut(ures);
  }

  /** The server refused the call: if it names a field the sidecar added, send the call again without them. */
  private checkRefusal(ures: UpstreamResponse, added: string[]): void {
    const { res, capture } = this.call;
    const parts: Buffer[] = [];
    let bytes = 0;
    ures.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes <= REFUSAL_READ_LIMIT) parts.push(chunk);
    });
    ures.on('end', () => {
      const status = ures.statusCode ?? 502;
      const body = Buffer.concat(parts);
      const refused = bytes <= REFUSAL_READ_LIMIT ? refusal(status, body.toString('utf8'), added) : null;
      if (refused && this.retryWithout(refused.field, refused.detail)) return;
      // Not about the added fields: the agent gets the server's answer as it is.
      if (capture) {
        capture.responseStatus = status;
        capture.response(body);
      }
      this.settle('ok', null, `${Math.floor(status / 100)}xx`, () =>
        res.writeHead(status, ures.statusMessage, forwardHeaders(ures.rawHeaders, NONE)).end(body),
      );
    });
    this.watchCut(ures);
  }

  /** An answer that closes before its end breaks the agent's response too. */
  private watchCut(ures: UpstreamResponse): void {
    ures.on('close', () => {
      if (!ures.complete) this.upstreamBroke('upstream closed the response before its end');
    });
  }

  private onUpstreamError(err: NodeJS.ErrnoException): void {
    if (this.settled) return;
    const { res, capture, api } = this.call;
    const timeout = err instanceof UpstreamTimeout;
    if (res.headersSent) {
      this.upstreamBroke(timeout ? 'upstream went idle past upstream_timeout_ms' : `upstream failed mid-response: ${err.message}`);
      return;
    }
    const { upstream, config } = this.engine;
    const failure = upstreamFailure(err, timeout, upstream.host, config.upstream_timeout_ms);
    // This path's message names the setting (a translated call's does not: its bytes are kept as they were).
    const message = timeout ? `${failure.message} (receivers.llm_proxy.upstream_timeout_ms)` : failure.message;
    if (capture) capture.responseStatus = failure.status;
    this.engine.upstreamFailed(err, failure);
    sendProxyError(res, failure.status, failure.code, message, api);
    this.settle('error', message, `${Math.floor(failure.status / 100)}xx`);
  }
}

/** `expect` was answered by this server already (Node sends 100-continue itself). */
const DROP_ALWAYS = new Set(['expect']);
/** When the body is rewritten, its length is set anew. */
const DROP_WHEN_REWRITTEN = new Set(['expect', 'content-length']);
/** Asks buffering reverse proxies in front of us (nginx, ingress) not to hold SSE back. */
const SSE_EXTRA = { 'x-accel-buffering': 'no' };
const NONE = {};

/** A stripped answer up to this size is joined into one buffer before it is written. */
const JOIN_UP_TO = 64 * 1024;

function withoutLength(headers: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < headers.length; i += 2) if (headers[i].toLowerCase() !== 'content-length') out.push(headers[i], headers[i + 1]);
  return out;
}

function setLength(headers: string[], length: number): string[] {
  return [...withoutLength(headers), 'content-length', String(length)];
}
