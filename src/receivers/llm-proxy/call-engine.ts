import type { IncomingMessage } from 'node:http';
import { performance } from 'node:perf_hooks';
import { upstreamUrls, type LlmProxyConfig } from '../../config/schema';
import type { CaptureSink } from '../../model/component';
import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { POLICY_VERSION, redacted, type Call, type CallEnd, type Engine, type Upstream, type UpstreamFailure } from './call';
import type { CallCapture } from './capture';
import { sendProxyError } from './errors';
import type { Flavor, UpstreamFlavor } from './flavor';
import { ENGINE } from '../../formats/engines';
import { topLevelMembers } from '../../formats/json-scan';
import { fieldsFor } from './inject';
import { passThrough } from './pass-through';
import { pinSampling, type Pins } from './pin';
import { HintLog, missingV1Hint } from './path-hints';
import { TokenStates } from './token-in/conversation';
import { loadLocalRenderer, TokenizerFilesError, type LocalRenderer } from './token-in/local-render';
import { GenerateRoute } from './token-in/generate-route';
import { LocalRendering } from './token-in/local-rendering';
import { READS_SPECIAL_TOKENS, REASONING_PARSERS, TOOL_CALL_PARSERS } from './token-in/parsers';
import { readTokenInRequest, type TokenInRequest } from './token-in/request';
import { serveTokenIn } from './token-in/token-in-call';
import { planTranslation, serveTranslated, type TranslatedApi, type TranslationPlan } from './translated-call';
import type { UpstreamResponse } from './upstream-client';
import { UpstreamPool } from './upstream-pool';
import { extend } from '../../model/extend';

/**
 * The call engine: every admitted call is planned (how to call the model server for it), then
 * executed. The engine owns what all plans share: the upstream target, the bookkeeping of a
 * refused added field, the side of an upstream failure beyond the agent's answer, journaling the
 * request, settling the call (its record written through before the agent's last bytes) and the
 * call metrics. A plan's executor owns only its bytes (pass-through.ts, translated-call.ts).
 *
 * A new way to call the model server (e.g. token-in) is one more `Plan` kind: chosen in `run` /
 * `planTranslated`, executed in `execute`, its executor a module that takes the `Engine` (call.ts).
 */
export type Plan =
  /** The agent's call as it is (`body`: read already, when planning had to read it). */
  | { kind: 'pass-through'; body: Buffer | null }
  /** A Responses / Anthropic call served over chat completions. */
  | { kind: 'translated'; body: Buffer; translation: TranslationPlan }
  /** A chat call served over completions with token ids (docs/token-in.md). */
  | { kind: 'token-in'; body: Buffer; request: TokenInRequest };

/** What the engine needs of the proxy's dependencies. */
export interface EngineDeps {
  logger: Logger;
  metrics: Metrics;
  capture: CaptureSink;
  now?: () => number;
  /** Upstream response header naming the policy that answered (lower case). */
  policyHeader?: string;
  /** Removes configured secret fields from a parsed request body before it is journaled. */
  redact?: ((body: unknown) => unknown) | null;
  /** Resolves an upstream host name to its addresses (tests replace DNS). */
  resolve?: (hostname: string) => Promise<string[]>;
  /** Ask an SGLang server for routed experts (`processors.routed_experts.sglang` is set). */
  sglangRouting?: boolean;
  /** Training values of sampling parameters (`processors.sampling.pin`); null or empty: none. */
  pins?: Pins | null;
  /** Ask the engine for sampling masks where it gives them (`processors.sampling.masks`). */
  samplingMasks?: boolean;
  /** The image placeholder token (`processors.images.image_token_id`), for token-in calls with images. */
  imageTokenId?: number;
}

export class CallEngine implements Engine {
  readonly upstream: Upstream;
  readonly metrics: Metrics;
  readonly redacts: boolean;
  private readonly now: () => number;
  /** The last call of each rollout attempt, under token-in. */
  private readonly tokenStates: TokenStates | null;
  /** Token-in's rendering from the model's tokenizer files (`token_in.tokenizer_dir`). */
  private readonly local: LocalRendering | null;
  /** Whether token-in calls go to vLLM's `/inference/v1/generate` (`token_in.route`). */
  private readonly generate: GenerateRoute | null;
  /** SGLang's context length by model, as its listing said (token-in's budget when the agent sets none). */
  private readonly contextLengths = new Map<string, number | null>();
  /** Pinned sampling parameters; null when none are. */
  private readonly pins: Pins | null;
  /** Warnings about a `/v1` missing from a base URL, rate-limited. */
  private readonly hints: HintLog;
  /** Where agents reach the proxy (`host:port`, the port bound once listening), for those warnings. */
  endpoint: string;

  constructor(
    readonly config: LlmProxyConfig,
    private readonly deps: EngineDeps,
    private readonly flavors: UpstreamFlavor,
    private readonly log: Logger,
    /** How many calls are in flight (a call alone writes through at once). */
    private readonly inFlight: () => number,
  ) {
    this.upstream = new UpstreamPool(upstreamUrls(config.upstream_url), config.routing, {
      logger: deps.logger,
      metrics: deps.metrics,
      resolve: deps.resolve,
      now: deps.now,
    });
    this.metrics = deps.metrics;
    this.redacts = !!deps.redact;
    this.now = deps.now ?? Date.now;
    const t = config.token_in;
    this.tokenStates = t.enabled ? new TokenStates(t.max_rollouts, t.max_held_tokens) : null;
    this.generate = t.enabled && t.route !== 'completions' ? new GenerateRoute(t.route, deps.logger) : null;
    this.local =
      t.enabled && t.tokenizer_dir !== undefined ? new LocalRendering(loadRenderer(t.tokenizer_dir), t.verify_fraction, deps.metrics, deps.logger) : null;
    this.pins = deps.pins && Object.keys(deps.pins).length > 0 ? deps.pins : null;
    this.hints = new HintLog(log, this.now);
    this.endpoint = config.endpoint;
  }

  /** Serves one admitted call; resolves once it has ended. */
  run(call: Call): Promise<void> {
    const capture = call.capture;
    if (capture && (this.pinned(call) || this.masked(call))) return this.planned(call, this.planRead(call));
    if (capture && this.tokenInFor(call)) return this.planned(call, this.planTokenIn(call));
    // A call that is not translated starts at once: its body streams upstream as it arrives.
    if (!capture || !this.translatable(capture.api, call.req)) return this.execute(call, { kind: 'pass-through', body: null });
    return this.planned(call, this.planTranslated(call, capture.api));
  }

  private planned(call: Call, plan: Promise<Plan | null>): Promise<void> {
    const capture = call.capture!;
    return plan
      .then((p) => (p ? this.execute(call, p) : undefined))
      .catch((err: unknown) => {
        this.log.once('translate_error', 'error', 'a translated call failed inside the sidecar', { err });
        if (!call.res.headersSent) sendProxyError(call.res, 500, 'translation_failed', 'the sidecar could not translate this call', call.api);
        else call.res.destroy();
        this.finishCapture(capture, 'error', `translation failed: ${(err as Error).message}`, call.t0);
      });
  }

  private execute(call: Call, plan: Plan): Promise<void> {
    switch (plan.kind) {
      case 'pass-through':
        return passThrough(this, call, plan.body);
      case 'translated':
        return this.serveTranslated(call, plan.body, plan.translation);
      case 'token-in':
        return this.serveTokenIn(call, plan.body, plan.request);
    }
  }

  /** Token-in serves chat calls of a rollout to a vLLM or SGLang server (others: as chat). */
  private tokenInFor(call: Call): boolean {
    const c = call.capture!;
    if (!this.tokenStates || c.api !== 'chat.completions' || call.req.headers['content-encoding']) return false;
    if (this.flavors.current() === 'openai') {
      this.tokenIn('fallback', 'server_not_vllm_or_sglang', c);
      return false;
    }
    return true;
  }

  private tokenIn(result: 'spliced' | 'rendered' | 'fallback', reason: string, capture: CallCapture): void {
    this.metrics.tokenInCalls.inc({ result, reason });
    capture.tokenIn = result === 'spliced' ? 'spliced' : `${result}:${reason}`;
  }

  /** Chat and completions calls get the training values of pinned sampling parameters (their body is read whole for that). */
  private pinned(call: Call): boolean {
    const api = call.capture!.api;
    return this.pins !== null && (api === 'chat.completions' || api === 'completions') && !call.req.headers['content-encoding'];
  }

  /**
   * Sampling masks are asked of an engine that gives them for this API (src/formats/engines); the body is
   * read whole first, as the request for them depends on whether the call streams (SGLang refuses
   * them on streams).
   */
  private masked(call: Call): boolean {
    const flavor = this.flavors.current();
    const api = call.capture!.api;
    return (
      this.deps.samplingMasks === true &&
      flavor !== 'openai' &&
      (ENGINE[flavor].maskFields(api, false) !== null || ENGINE[flavor].maskFields(api, true) !== null) &&
      !call.req.headers['content-encoding']
    );
  }

  /**
   * Reads the body, pins its sampling parameters (or refuses the call), notes the fields that ask
   * for its sampling masks, then plans it as a call whose body streams.
   */
  private async planRead(call: Call): Promise<Plan | null> {
    const read = await this.readBody(call);
    if (read === null) return null;
    if (this.masked(call)) call.maskFields = ENGINE[this.flavors.current() as 'vllm' | 'sglang'].maskFields(call.capture!.api, streams(read));
    if (this.pins === null) return this.tokenInFor(call) ? this.planTokenIn(call, read) : { kind: 'pass-through', body: read };
    const pinned = pinSampling(read, this.pins);
    if ('refused' in pinned) {
      this.metrics.samplingPinned.inc({ param: pinned.refused, action: 'refused' });
      this.refuse(call, pinned.refused, pinned.message);
      return null;
    }
    for (const param of pinned.set) this.metrics.samplingPinned.inc({ param, action: 'set' });
    for (const param of pinned.overridden) this.metrics.samplingPinned.inc({ param, action: 'overridden' });
    if (this.tokenInFor(call)) return this.planTokenIn(call, pinned.body);
    return { kind: 'pass-through', body: pinned.body };
  }

  /** A call refused for a pinned sampling parameter: a 400 naming it, recorded as an error; the model server never sees it. */
  private refuse(call: Call, param: string, message: string): void {
    const { res, api, capture, t0 } = call;
    this.metrics.proxyRequests.inc({ api: api ?? 'other', status_class: '4xx' });
    sendProxyError(res, 400, 'sampling_pinned', message, api, {}, param);
    if (capture) {
      capture.responseStatus = 400;
      this.finishCapture(capture, 'error', message, t0);
    }
  }

  private async planTokenIn(call: Call, preread: Buffer | null = null): Promise<Plan | null> {
    const capture = call.capture!;
    const body = preread ?? (await this.readBody(call));
    if (body === null) return null;
    const request = readTokenInRequest(body);
    if ('reason' in request) {
      this.tokenIn('fallback', request.reason, capture);
      return { kind: 'pass-through', body };
    }
    return { kind: 'token-in', body, request };
  }

  private serveTokenIn(call: Call, body: Buffer, request: TokenInRequest): Promise<void> {
    const capture = call.capture!;
    const t = this.config.token_in;
    return serveTokenIn(this, call, body, request, {
      states: this.tokenStates!,
      key: `${capture.correlation.rolloutId}\u0000${capture.correlation.attemptId}`,
      reasoning: REASONING_PARSERS[t.reasoning_parser],
      tools: TOOL_CALL_PARSERS[t.tool_call_parser],
      local: this.local,
      keepSpecialTokens: READS_SPECIAL_TOKENS.has(t.reasoning_parser),
      flavor: this.flavors.current() === 'sglang' ? 'sglang' : 'vllm',
      sglangRouting: this.deps.sglangRouting,
      samplingMasks: this.deps.samplingMasks,
      imageTokenId: this.deps.imageTokenId,
      contextLengths: this.contextLengths,
      generate: this.generate,
      maxResumes: t.max_resumes,
      resumed: (result) => this.metrics.tokenInResumes.inc({ result }),
      served: (how) => {
        const [result, reason] = how.split(':');
        this.tokenIn(result as 'spliced' | 'rendered', reason ?? 'continued', capture);
      },
      fallback: (reason) => {
        this.tokenIn('fallback', reason, capture);
        return passThrough(this, call, body);
      },
    });
  }

  /** Responses / Anthropic calls go over chat completions (for token ids) when the server is vLLM or SGLang. */
  private translatable(api: Call['api'], req: IncomingMessage): api is TranslatedApi {
    return (
      (api === 'responses' || api === 'anthropic.messages') &&
      this.config.translate.includes(api) &&
      this.flavors.current() !== 'openai' &&
      !req.headers['content-encoding']
    );
  }

  /** The agent's whole body; null when the call ended instead (too large, or the agent went away). */
  private async readBody(call: Call): Promise<Buffer | null> {
    const body = await readWhole(call.req, this.config.max_request_bytes);
    if (body === 'too_large') {
      this.tooLarge(call);
      return null;
    }
    if (body === 'aborted') {
      this.finishCapture(call.capture!, 'aborted', 'the client stopped sending its request body', call.t0);
      return null;
    }
    return body;
  }

  /** Reads the agent's body and plans it translated, or passed through with the reason; null when the call ended. */
  private async planTranslated(call: Call, api: TranslatedApi): Promise<Plan | null> {
    const capture = call.capture!;
    const body = await this.readBody(call);
    if (body === null) return null;
    const planned = planTranslation(api, body);
    if (!planned.ok) {
      this.metrics.translatedCalls.inc({ api, result: 'passed_through' });
      capture.tokenIdsMissing = `not translated: ${planned.reason}`;
      return { kind: 'pass-through', body };
    }
    this.metrics.translatedCalls.inc({ api, result: 'translated' });
    return { kind: 'translated', body, translation: planned };
  }

  private async serveTranslated(call: Call, body: Buffer, translation: TranslationPlan): Promise<void> {
    const sentAt = performance.now();
    // Sent as chat completions: masks are asked for as for a chat call that streams as this one does.
    const flavor = this.flavors.current();
    if (this.deps.samplingMasks === true && flavor !== 'openai')
      call.maskFields = ENGINE[flavor].maskFields('chat.completions', translation.chat.stream === true);
    await serveTranslated(call.res, translation, {
      body,
      agentHeaders: call.req.rawHeaders,
      upstream: this.upstream,
      fields: fieldsFor(flavor, 'chat.completions', this.extraFields(call)),
      timeoutMs: this.config.upstream_timeout_ms,
      capture: call.capture,
      redact: this.deps.redact,
      upstreamResponded: (ures) => this.responded(call, ures, sentAt),
      refused: (field, detail) => this.refused(field, detail),
      // Before the agent's last bytes: the call is written through first, as on every path.
      settled: (o) => {
        if (o.failure === 'upstream_unreachable') this.flavors.unreachable();
        const statusClass = o.status === 'aborted' ? 'client_abort' : `${Math.floor((o.httpStatus ?? 502) / 100)}xx`;
        this.settle(call, { status: o.status, error: o.error, statusClass, streamed: o.streamed }, null);
      },
    });
  }

  // ---- the Engine side of a call (call.ts) ----

  flavor(): Flavor {
    return this.flavors.current();
  }

  extraFields(call?: Call): Record<string, string> | null {
    const routing = this.deps.sglangRouting && this.flavors.current() === 'sglang' ? ENGINE.sglang.routingFields : null;
    const masks = call?.maskFields ?? null;
    return routing && masks ? extend(routing, masks) : (routing ?? masks);
  }

  responded(call: Call, ures: UpstreamResponse, sentAt: number, at = performance.now()): void {
    const { capture, api } = call;
    if (capture && this.deps.policyHeader) {
      const v = ures.headers[this.deps.policyHeader];
      if (typeof v === 'string' && POLICY_VERSION.test(v.trim())) capture.policyVersion = v.trim();
    }
    if (api) this.metrics.upstreamTtfb.observe({ api }, (at - sentAt) / 1000);
    if (ures.statusCode === 404) {
      const hint = missingV1Hint(call.path, this.upstream.basePath, 404, this.endpoint);
      if (hint) this.hints.warn(hint);
    }
  }

  refused(field: string, detail: string): void {
    this.flavors.refused(field, detail);
  }

  upstreamFailed(err: NodeJS.ErrnoException, failure: UpstreamFailure): void {
    const timeout = failure.code === 'upstream_timeout';
    if (!timeout) this.flavors.unreachable();
    this.log.once(`upstream:${err.code ?? (timeout ? 'timeout' : 'error')}`, 'warn', 'upstream request failed', {
      code: err.code,
      timeout,
      upstream: this.upstream.host,
    });
  }

  redactedBody(body: Buffer): Buffer | null {
    return redacted(this.deps.redact, body);
  }

  journalRequest(capture: CallCapture, body: Buffer): void {
    // A body that is not JSON cannot be redacted: it is recorded as null, so nothing of it is journaled.
    const bytes = this.redactedBody(body);
    if (bytes) capture.request(bytes);
  }

  journaledRequest(capture: CallCapture): Buffer {
    return this.deps.capture.read(capture.requestFrames);
  }

  tooLarge(call: Call): void {
    const { req, res, api, capture, t0 } = call;
    this.metrics.proxyRequests.inc({ api: api ?? 'other', status_class: '4xx' });
    res.shouldKeepAlive = false;
    const max = this.config.max_request_bytes;
    sendProxyError(res, 413, 'request_too_large', `request body exceeds ${max} bytes (receivers.llm_proxy.max_request_bytes)`, api, {
      connection: 'close',
    });
    req.resume();
    if (capture) {
      capture.responseStatus = 413;
      this.finishCapture(capture, 'error', 'request body over max_request_bytes', t0);
    }
  }

  settle(call: Call, end: CallEnd, deliver: (() => void) | null): void {
    const { api, capture, t0 } = call;
    const finish = (): void => {
      try {
        deliver?.();
      } finally {
        this.metrics.proxyRequests.inc({ api: api ?? 'other', status_class: end.statusClass });
        this.metrics.proxyDuration.observe({ api: api ?? 'other', streamed: end.streamed ? 'true' : 'false' }, (performance.now() - t0) / 1000);
      }
    };
    if (!capture || !this.finishCapture(capture, end.status, end.error, t0)) return finish();
    try {
      // The only call in flight writes through at once: no other call could share the write, and
      // the rest of the event loop's turn it would wait for is time the agent waits.
      if (deliver && this.inFlight() > 1) return this.deps.capture.afterWrite(finish);
      this.deps.capture.flush();
    } catch (err) {
      // Capture never fails the call: the answer goes out unwritten, counted.
      this.metrics.captureDrops.inc({ reason: 'capture_error' });
      this.log.once('capture_write_error', 'error', 'capture could not write a call through; the call itself is served', { err });
    }
    finish();
  }

  /**
   * Journals the call's end record; false when it could not be (nothing to write through). Where
   * the agent's answer is still to complete, the caller writes the journal through first.
   */
  finishCapture(capture: CallCapture, status: CallEnd['status'], error: string | null, t0: number): boolean {
    if (capture.begin() === null) {
      if (capture.startError !== null) {
        this.metrics.captureDrops.inc({ reason: 'capture_error' });
        this.log.once('capture_start_error', 'error', 'capture could not register a call; the call itself is served', { err: capture.startError });
      }
      return false;
    }
    try {
      const record = capture.finish({ status, error, endedAt: this.now(), endedMono: performance.now() }, t0);
      // Bytes the journal refused were counted as it refused them (journal_full, journal_unwritable).
      if (capture.capped) this.metrics.captureDrops.inc({ reason: 'capture_cap' });
      this.deps.capture.callEnded(record);
      return true;
    } catch (err) {
      this.metrics.captureDrops.inc({ reason: 'capture_error' });
      this.log.once('capture_error', 'error', 'capture of a proxied call failed; the call itself was served', { err });
      return false;
    }
  }
}

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

/** Whether a request body asks for a stream (its top-level `stream` is `true`). */
function streams(body: Buffer): boolean {
  const at = topLevelMembers(body)?.get('stream');
  return at !== undefined && body.toString('latin1', at[0], at[1]) === 'true';
}

/** The renderer of `token_in.tokenizer_dir`; its files' faults named by the setting (a start-up error). */
function loadRenderer(dir: string): LocalRenderer {
  try {
    return loadLocalRenderer(dir);
  } catch (err) {
    const why = err instanceof TokenizerFilesError ? err.message : `cannot be read: ${(err as Error).message}`;
    throw new Error(`receivers.llm_proxy.token_in.tokenizer_dir: ${why}`);
  }
}
