import type { ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import type { SseEvent } from '../../formats/sse';
import { agentWriter, openUpstream, redacted, refusal, REFUSAL_READ_LIMIT, upstreamFailure, type Upstream } from './call';
import type { CallCapture } from './capture';
import { forwardHeaders, rawHeader } from './forward-headers';
import { SseEventTooLargeError, SseSplitter } from '../../formats/sse';
import type { UpstreamRequest, UpstreamResponse } from './upstream-client';
import {
  anthropicToChatRequest,
  ChatStreamToAnthropicEvents,
  ChatStreamToResponsesEvents,
  chatErrorToAnthropicError,
  chatErrorToResponsesError,
  chatToAnthropicResponse,
  chatToResponsesResponse,
  responsesToChatRequest,
  type AnthropicContext,
  type ResponsesContext,
} from './translate';
import { extend } from '../../model/extend';

/** The agent-facing APIs served over chat completions. */
export type TranslatedApi = 'responses' | 'anthropic.messages';

/** A request that maps onto chat completions: the chat request and what the answer's translation needs. */
export type TranslationPlan =
  | { ok: true; api: 'responses'; chat: Record<string, unknown>; context: ResponsesContext }
  | { ok: true; api: 'anthropic.messages'; chat: Record<string, unknown>; context: AnthropicContext };

export type PlanResult = TranslationPlan | { ok: false; reason: string };

export interface TranslatedCallOptions {
  /** The agent's whole request body (already read). */
  body: Buffer;
  /** `rawHeaders` of the agent's request. */
  agentHeaders: readonly string[];
  /** Chat completions go to `${basePath}/chat/completions`. */
  upstream: Upstream;
  /** Model-server fields added to the chat request (name → JSON text); a field the request already has keeps its value. */
  fields: Readonly<Record<string, string>> | null;
  /** Upstream idle timeout: no byte for this long ends the call. */
  timeoutMs: number;
  capture: CallCapture | null;
  /** Makes a copy of a parsed request body without secret fields; journaled bodies go through it when set. */
  redact?: ((body: unknown) => unknown) | null;
  /** Called with the upstream's response head (e.g. to read a policy-version header, or time the first byte). */
  upstreamResponded?: (ures: UpstreamResponse) => void;
  /**
   * Called once with the outcome before the agent's response completes (before its last bytes
   * are written), so the call's record can be journaled first; for an abort, when it is seen.
   */
  settled?: (outcome: TranslatedOutcome) => void;
  /**
   * The model server refused the call over a field the sidecar added (a 400/422 naming it): the
   * call is sent once more without the added fields, and this is told so it stops adding them.
   */
  refused?: (field: string, detail: string) => void;
}

/** Why a call did not end normally; null when it did (an upstream error status is passed on, and is not one of these). */
export type TranslatedFailure = 'upstream_unreachable' | 'upstream_timeout' | 'upstream_broke' | 'untranslatable_answer' | 'stream_failed' | 'client_abort';

/**
 * How a translated call ended. `status` describes the sidecar's part, as on the pass-through path:
 * an upstream error status handed on in the agent's error shape is `ok` with that `httpStatus`.
 */
export interface TranslatedOutcome {
  status: 'ok' | 'error' | 'aborted';
  error: string | null;
  /** The status the agent got (null when it got none). */
  httpStatus: number | null;
  /** The agent got an event stream. */
  streamed: boolean;
  failure: TranslatedFailure | null;
}

/**
 * Reads the agent's request and translates it to a chat completion, or says why it cannot be
 * (`not_json`, or the translator's reason); the caller then passes it through untouched.
 */
export function planTranslation(api: TranslatedApi, body: Buffer): PlanResult {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return { ok: false, reason: 'not_json' };
  }
  try {
    if (api === 'responses') {
      const t = responsesToChatRequest(parsed);
      return t.ok ? { ok: true, api, chat: t.chat, context: t.context } : t;
    }
    const t = anthropicToChatRequest(parsed);
    return t.ok ? { ok: true, api, chat: t.chat, context: t.context } : t;
  } catch {
    // A request the translator cannot even read is safer passed through than failed.
    return { ok: false, reason: 'translation_error' };
  }
}

/**
 * Serves one translated call: sends the plan's chat request (with `fields` added) upstream and
 * answers the agent in the API it called, JSON or event stream. Streams are translated event by
 * event as they arrive. Every path ends the agent's response; the promise resolves once it has
 * (or once the agent went away), and never rejects.
 */
export function serveTranslated(res: ServerResponse, plan: TranslationPlan, options: TranslatedCallOptions): Promise<TranslatedOutcome> {
  return new Promise((resolve) => new TranslatedCall(res, plan, options, resolve).start());
}

/** Agent headers that describe the agent's body or belong to Anthropic's API, not to the chat request. */
const DROP = new Set(['expect', 'content-encoding', 'x-api-key']);
const OUT_OF_BAND = /^anthropic-/i;

type StreamTranslator = ChatStreamToResponsesEvents | ChatStreamToAnthropicEvents;

class TranslatedCall {
  private ureq: UpstreamRequest | null = null;
  private ures: UpstreamResponse | null = null;
  private done = false;
  private timedOut = false;
  /** Writes to the agent with the upstream answer paused while the agent is full (set when a stream is relayed). */
  private toAgent: ((bytes: Buffer) => void) | null = null;
  private agentStatus: number | null = null;
  private agentStreamed = false;
  private readonly capture: CallCapture | null;

  constructor(
    private readonly res: ServerResponse,
    private readonly plan: TranslationPlan,
    private readonly o: TranslatedCallOptions,
    private readonly resolve: (outcome: TranslatedOutcome) => void,
  ) {
    this.capture = o.capture;
  }

  private added: string[] = [];
  private retried = false;

  start(): void {
    const { plan, o, capture } = this;
    const fields = o.fields ?? {};
    const added = Object.keys(fields).filter((name) => !Object.hasOwn(plan.chat, name));
    this.added = added;
    const chatBytes = withFields(plan.chat, added, fields);
    if (capture) {
      capture.translation = { upstreamApi: 'chat.completions', notes: [] };
      capture.injected = added;
      const agentRequest = this.journaled(o.body);
      if (agentRequest) capture.agentRequest(agentRequest);
      const request = this.journaled(chatBytes);
      if (request) capture.request(request);
    }
    this.res.on('close', () => {
      if (this.done || this.res.writableFinished) return;
      this.ureq?.destroy();
      this.settle({ status: 'aborted', error: 'client closed the connection before the response ended', failure: 'client_abort' });
    });
    if (this.res.destroyed) {
      this.settle({ status: 'aborted', error: 'client closed the connection before the call was sent', failure: 'client_abort' });
      return;
    }
    this.send(chatBytes);
  }

  private send(chatBytes: Buffer): void {
    const { o } = this;
    const request = { method: 'POST', path: `${o.upstream.basePath}/chat/completions`, headers: this.upstreamHeaders(chatBytes.length) };
    const ureq = openUpstream(o.upstream, o.capture ?? null, request, o.timeoutMs, {
      response: (ures) => this.onResponse(ures),
      error: (err) => this.onUpstreamError(err),
      // Noted for an answer that has begun: its 'close' tells a timeout from a broken answer.
      timeout: () => {
        this.timedOut = true;
      },
    });
    this.ureq = ureq;
    ureq.end(chatBytes);
  }

  /** The agent's headers minus what the chat request replaces; an Anthropic key becomes a bearer token. */
  private upstreamHeaders(length: number): string[] {
    const raw = this.o.agentHeaders;
    const kept: string[] = [];
    for (let i = 0; i < raw.length; i += 2) if (!OUT_OF_BAND.test(raw[i])) kept.push(raw[i], raw[i + 1]);
    const replace: Record<string, string> = {
      host: this.o.upstream.host,
      'content-type': 'application/json',
      'content-length': String(length),
      accept: this.plan.context.stream ? 'text/event-stream' : 'application/json',
      // The answer is read and translated here, so it must come unencoded.
      'accept-encoding': 'identity',
    };
    const apiKey = rawHeader(this.o.agentHeaders, 'x-api-key');
    if (apiKey !== undefined && rawHeader(this.o.agentHeaders, 'authorization') === undefined) replace.authorization = `Bearer ${apiKey}`;
    return forwardHeaders(kept, replace, DROP);
  }

  /** The bytes to journal for a request body: redacted when configured; nothing when that cannot be done. */
  private journaled(bytes: Buffer): Buffer | null {
    return redacted(this.o.redact, bytes);
  }

  private onResponse(ures: UpstreamResponse): void {
    this.ures = ures;
    this.o.upstreamResponded?.(ures);
    const status = ures.statusCode ?? 502;
    const sse = /^text\/event-stream/i.test(ures.headers['content-type'] ?? '');
    ures.on('error', () => {
      // Seen through 'close' with the response incomplete.
    });
    if (status < 200 || status >= 300) {
      this.collect(ures, (body) => {
        if (this.retryWithout(status, body)) return;
        const e = this.plan.api === 'responses' ? chatErrorToResponsesError(status, body) : chatErrorToAnthropicError(status, body);
        this.sendJson(e.status, e.body, { status: 'ok', error: null, failure: null });
      });
      return;
    }
    if (this.plan.context.stream) {
      if (sse) {
        this.relayStream(ures);
        return;
      }
      const type = ures.headers['content-type'] ?? 'no content-type';
      this.collect(ures, () => this.sendFailure(502, 'untranslatable_answer', `upstream answered a streamed request with ${type}`));
      return;
    }
    this.collect(ures, (body) => this.sendTranslatedJson(body));
  }

  private sendTranslatedJson(body: Buffer): void {
    let parsed: unknown = null;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch {
      this.sendFailure(502, 'untranslatable_answer', 'upstream answer is not JSON');
      return;
    }
    const out = this.plan.api === 'responses' ? chatToResponsesResponse(parsed, this.plan.context) : chatToAnthropicResponse(parsed, this.plan.context);
    if (!out.ok) {
      this.sendFailure(502, 'untranslatable_answer', `upstream answer cannot be translated: ${out.reason}`);
      return;
    }
    if (this.capture?.translation) this.capture.translation.notes = out.notes;
    this.sendJson(200, 'response' in out ? out.response : out.message, { status: 'ok', error: null, failure: null });
  }

  /** A refusal that names an added field: the chat request goes once more, without the added fields. */
  private retryWithout(status: number, body: Buffer): boolean {
    if (this.retried || this.added.length === 0) return false;
    const refused = refusal(status, body.toString('utf8', 0, Math.min(body.length, REFUSAL_READ_LIMIT)), this.added);
    if (refused === null) return false;
    this.retried = true;
    this.o.refused?.(refused.field, refused.detail);
    const chatBytes = withFields(this.plan.chat, [], {});
    if (this.capture) {
      this.capture.injected = [];
      // What reaches the model server now is the call without the fields: that is what is recorded.
      this.capture.restart('request');
      this.capture.restart('response');
      const request = this.journaled(chatBytes);
      if (request) this.capture.request(request);
    }
    this.send(chatBytes);
    return true;
  }

  /** Reads a whole upstream answer (captured as it comes); an answer cut short ends the call instead. */
  private collect(ures: UpstreamResponse, then: (body: Buffer) => void): void {
    const parts: Buffer[] = [];
    ures.on('data', (chunk: Buffer) => {
      if (this.done) return;
      this.capture?.response(chunk);
      parts.push(chunk);
    });
    ures.on('end', () => {
      if (!this.done) then(Buffer.concat(parts));
    });
    ures.on('close', () => {
      if (this.done || ures.complete) return;
      if (this.timedOut) this.sendFailure(504, 'upstream_timeout', `upstream went idle for ${this.o.timeoutMs} ms`);
      else this.sendFailure(502, 'upstream_broke', 'upstream closed the response before its end');
    });
  }

  private relayStream(ures: UpstreamResponse): void {
    const t: StreamTranslator =
      this.plan.api === 'responses' ? new ChatStreamToResponsesEvents(this.plan.context) : new ChatStreamToAnthropicEvents(this.plan.context);
    const splitter = new SseSplitter();
    this.agentStatus = 200;
    this.agentStreamed = true;
    if (this.capture) {
      this.capture.streamed = true;
      this.capture.responseStatus = 200;
    }
    this.res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
    this.res.flushHeaders();
    this.toAgent = agentWriter(this.res, ures);
    const take = (events: SseEvent[]): boolean => {
      for (const e of events) {
        if (e.data === '') continue;
        if (e.data === '[DONE]') return this.endStream(t, t.end());
        let chunk: unknown;
        try {
          chunk = JSON.parse(e.data);
        } catch {
          chunk = null;
        }
        if (typeof chunk !== 'object' || chunk === null || Array.isArray(chunk))
          return this.endStream(t, t.fail('upstream sent an event that is not a JSON object'), true);
        const out = t.push(chunk as Record<string, unknown>);
        if (t.done) return this.endStream(t, out);
        this.write(out);
      }
      return false;
    };
    ures.on('data', (chunk: Buffer) => {
      if (this.done) return;
      this.capture?.response(chunk);
      let events: SseEvent[];
      try {
        events = splitter.push(chunk);
      } catch (err) {
        if (!(err instanceof SseEventTooLargeError)) throw err;
        this.endStream(t, t.fail(`upstream ${err.message}`), true);
        return;
      }
      take(events);
    });
    ures.on('end', () => {
      if (this.done) return;
      if (!take(splitter.end())) this.endStream(t, t.end());
    });
    ures.on('close', () => {
      if (this.done || ures.complete) return;
      const message = this.timedOut ? `upstream went idle for ${this.o.timeoutMs} ms` : 'upstream closed the stream before its end';
      this.endStream(t, t.fail(message));
    });
  }

  /** Writes the terminal event and ends the stream; true (so callers can return it). */
  private endStream(t: StreamTranslator, tail: string, abandonUpstream = false): true {
    if (this.done) return true;
    if (this.capture?.translation) this.capture.translation.notes = [...t.notes];
    const failure = failureOf(tail);
    const bytes = Buffer.from(tail);
    this.noteAgentBytes(bytes);
    this.settle(failure === null ? { status: 'ok', error: null, failure: null } : { status: 'error', error: failure, failure: 'stream_failed' });
    this.res.end(bytes);
    // Whatever the upstream still sends ([DONE] after an error chunk) is drained, not kept; a
    // stream that broke its format is not read further.
    if (abandonUpstream) this.ureq?.destroy();
    else if (this.ures && !this.ures.complete) this.ures.resume();
    return true;
  }

  private write(text: string): void {
    if (text === '') return;
    const bytes = Buffer.from(text);
    this.noteAgentBytes(bytes);
    this.toAgent!(bytes);
  }

  private noteAgentBytes(bytes: Buffer): void {
    if (!this.capture) return;
    if (this.capture.firstByteAt === null) this.capture.firstByteAt = performance.now();
    this.capture.agentResponse(bytes);
  }

  private onUpstreamError(err: NodeJS.ErrnoException): void {
    if (this.done) return;
    // Once the answer has begun, its 'close' handler ends the call (with the timeout noted).
    if (this.ures) {
      if (!this.ures.destroyed) this.ures.destroy();
      return;
    }
    const f = upstreamFailure(err, this.timedOut, this.o.upstream.host, this.o.timeoutMs);
    this.sendFailure(f.status, f.code, f.message);
  }

  /** A sidecar-made error in the agent's API shape (`lightning-sidecar: …`, as the proxy's own errors). */
  private sendFailure(status: number, failure: TranslatedFailure, message: string): void {
    const text = JSON.stringify({ error: { message: `lightning-sidecar: ${message}`, type: 'api_error', param: null, code: failure } });
    const e = this.plan.api === 'responses' ? chatErrorToResponsesError(status, text) : chatErrorToAnthropicError(status, text);
    if (!this.ures?.complete) this.ureq?.destroy();
    this.sendJson(status, e.body, { status: 'error', error: message, failure }, { 'x-lightning-sidecar-error': failure });
  }

  private sendJson(status: number, body: unknown, outcome: Omit<TranslatedOutcome, 'httpStatus' | 'streamed'>, extra: Record<string, string> = {}): void {
    if (this.done) return;
    const bytes = Buffer.from(JSON.stringify(body));
    this.agentStatus = status;
    if (this.capture) this.capture.responseStatus = status;
    this.noteAgentBytes(bytes);
    this.settle(outcome);
    this.res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(bytes.length), ...extra });
    this.res.end(bytes);
  }

  private settle(o: Omit<TranslatedOutcome, 'httpStatus' | 'streamed'>): void {
    if (this.done) return;
    this.done = true;
    const outcome: TranslatedOutcome = extend(o, { httpStatus: this.agentStatus, streamed: this.agentStreamed });
    this.o.settled?.(outcome);
    this.resolve(outcome);
  }
}

/**
 * The chat request's JSON with the model-server fields the request lacks written first, as JSON
 * text given (the request's own values are never replaced).
 */
function withFields(chat: Record<string, unknown>, names: readonly string[], fields: Readonly<Record<string, string>>): Buffer {
  const json = JSON.stringify(chat);
  if (names.length === 0) return Buffer.from(json);
  const members = names.map((name) => `${JSON.stringify(name)}:${fields[name]}`).join(',');
  return Buffer.from(`{${members}${json === '{}' ? '' : ','}${json.slice(1)}`);
}

/** The message of the error event that ends a translated stream, or null when it ended well. */
function failureOf(tail: string): string | null {
  const at = tail.lastIndexOf('event: error\ndata: ');
  if (at < 0) return null;
  try {
    const v = JSON.parse(tail.slice(at + 19).trim()) as { message?: unknown; error?: { message?: unknown } };
    const message = typeof v.message === 'string' ? v.message : v.error?.message;
    return typeof message === 'string' ? message : 'stream ended with an error event';
  } catch {
    return 'stream ended with an error event';
  }
}
