import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { SseEventTooLargeError, SseSplitter, type SseEvent } from '../../../formats/sse';
import { agentWriter, openUpstream, UpstreamTimeout, type Call, type Engine, type Upstream } from '../call';
import { sendProxyError } from '../errors';
import { forwardHeaders } from '../forward-headers';
import type { UpstreamResponse } from '../upstream-client';
import { rootOf } from '../upstream-pool';
import { chatChunk, chatFinish, deltasOf, SampledText } from './answer';
import { canonicalMessage, PrefixDigest, type TokenState, type TokenStates } from './conversation';
import type { LocalRendering } from './local-rendering';
import type { ReasoningStream, ToolStream } from './parser-kit';
import { PROBE_BODY, type GenerateRoute } from './generate-route';
import type { Json } from '../../../formats/json';
import { QWEN_VL_IMAGE_TOKEN_ID } from '../../../model/records';
import { answerUsage, attemptAnswer, mergeAttempts, resumedRequest, type TokenInRoute } from './resume';
import { journaledFeatures, placeFeatures, readRender } from './image-features';
import { completionsBody, generateBody, renderBody, tokenizeBody, VLLM_GENERATE_PATH, VLLM_RENDER_PATH, type TokenInRequest } from './request';
import {
  SGLANG_GENERATE_PATH,
  SglangAnswerReader,
  sglangGenerateBody,
  sglangMaxModelLen,
  sglangRenderBody,
  sglangRenderedIds,
  type ChoicePiece,
} from './sglang-generate';
import { extend } from '../../../model/extend';

/**
 * Serves a chat call token-in (docs/token-in.md): the prompt is sent to `/v1/completions` as ids,
 * the previous call's prompt and sampled ids followed by what the agent appended, rendered by the
 * server's own template (`/tokenize`); the answer is parsed back into a chat completion. Until
 * the server's answer begins nothing is recorded or sent: any failure before that (the server
 * has no `/tokenize`, refuses the completions request, cannot be reached) makes the call go
 * through as chat, as without token-in (`fallback`). Once it has begun, it is the call's answer.
 */

export interface TokenInDeps {
  states: TokenStates;
  /** The rollout attempt's key in `states`. */
  key: string;
  reasoning: (prompt: ArrayLike<number>) => ReasoningStream;
  /** A tool-call parser for a request with these tools (some parsers type arguments by the tools' schemas). */
  tools: ((tools: readonly unknown[] | undefined) => ToolStream) | null;
  /** The server's kind: SGLang is served over its `/generate`, vLLM over completions or its generate route. */
  flavor: 'vllm' | 'sglang';
  /** SGLang: ask for routed experts (only the new rows) and sampling masks with each call. */
  sglangRouting?: boolean;
  samplingMasks?: boolean;
  /** Context lengths by model, as the server's listing said (SGLang). */
  contextLengths?: Map<string, number | null>;
  /** Whether calls go to vLLM's `/inference/v1/generate` (`token_in.route`); null: always `/v1/completions`. */
  generate?: GenerateRoute | null;
  /** The answer's text must keep special tokens for the parsers (gpt-oss's harmony format). */
  keepSpecialTokens?: boolean;
  /** Rendering in the sidecar from the model's tokenizer files (`token_in.tokenizer_dir`); null: always the server's. */
  local: LocalRendering | null;
  /** The image placeholder token (`processors.images.image_token_id`), for calls with images. */
  imageTokenId?: number;
  /** How many times a call the engine aborts is sent again (`token_in.max_resumes`); 0 or unset: never. */
  maxResumes?: number;
  /** What became of an engine's abort: resumed, past the limit, or not resumable. */
  resumed?: (result: 'resumed' | 'limit' | 'failed') => void;
  /** The call goes through as chat instead, for `reason`. */
  fallback: (reason: string) => Promise<void>;
  /** How the call was served: `spliced`, or `rendered:<why not spliced>`. */
  served: (how: string) => void;
}

/**
 * What the previous call's state gives this one: the prompt to send, or why it is rendered afresh.
 * `digest` is fed the messages it compares (a prefix of the call's), so the caller can go on from
 * there for the state it keeps instead of hashing the history again.
 */
export function splice(
  state: TokenState | undefined,
  r: TokenInRequest,
  rendered: number[],
  digest = new PrefixDigest(),
): { prompt: Uint32Array; how: string } {
  const fresh = (why: string) => ({ prompt: Uint32Array.from(rendered), how: `rendered:${why}` });
  const why = unspliceable(state, r, digest);
  if (why !== null) return fresh(why);
  state = state!;
  // The boundary: the turn the model ended is the (n+1)-th end-of-turn token of the server's
  // rendering, n being how many the previous prompt holds. What the template does inside earlier
  // turns (dropping past thinking, re-serializing arguments) does not move it.
  const end = state.sampled[state.sampled.length - 1];
  let n = 0;
  for (const t of state.prompt) if (t === end) n++;
  let at = -1;
  for (let i = 0, seen = 0; i < rendered.length; i++) {
    if (rendered[i] === end && ++seen === n + 1) {
      at = i + 1;
      break;
    }
  }
  if (at < 0 || at >= rendered.length) return fresh('boundary_not_found');
  const prompt = new Uint32Array(state.prompt.length + state.sampled.length + rendered.length - at);
  prompt.set(state.prompt, 0);
  prompt.set(state.sampled, state.prompt.length);
  prompt.set(rendered.slice(at), state.prompt.length + state.sampled.length);
  return { prompt, how: 'spliced' };
}

/**
 * Why a call cannot continue the rollout's previous one (its prompt is then rendered afresh), or
 * null when it can: the previous call ended on the model's end of turn, and this call's messages
 * begin with that call's and the answer returned (`digest` is fed those).
 */
function unspliceable(state: TokenState | undefined, r: TokenInRequest, digest: PrefixDigest): string | null {
  if (!state) return 'first_call';
  if (state.context !== r.context) return 'context_changed';
  if (!state.stopped) return 'previous_cut';
  if (r.canonical.length <= state.messages) return 'edited_history';
  for (let i = 0; i < state.messages; i++) digest.add(r.canonical[i]);
  if (digest.peek() !== state.digest) return 'edited_history';
  return null;
}

/** A JSON POST to the model server, read whole: its status and body, or the error. */
function post(
  engine: Engine,
  call: Call,
  path: string,
  body: Buffer,
  method = 'POST',
): Promise<{ status: number; body: Buffer } | { error: NodeJS.ErrnoException }> {
  return new Promise((resolve) => {
    const ureq = openUpstream(
      engine.upstream,
      call.capture,
      { method, path, headers: upstreamHeaders(engine.upstream, call, body.length, 'application/json') },
      engine.config.upstream_timeout_ms,
      {
        response: (ures) => {
          const parts: Buffer[] = [];
          ures.on('data', (c: Buffer) => parts.push(c));
          ures.on('end', () => resolve({ status: ures.statusCode ?? 502, body: Buffer.concat(parts) }));
          ures.on('error', (err) => resolve({ error: err }));
        },
        error: (err) => resolve({ error: err }),
      },
    );
    ureq.end(body);
  });
}

const DROP = new Set(['expect', 'content-encoding']);

function upstreamHeaders(upstream: Upstream, call: Call, length: number, accept: string): string[] {
  return forwardHeaders(
    call.req.rawHeaders,
    { host: upstream.host, 'content-type': 'application/json', 'content-length': String(length), accept, 'accept-encoding': 'identity' },
    DROP,
  );
}

export async function serveTokenIn(engine: Engine, call: Call, body: Buffer, r: TokenInRequest, deps: TokenInDeps): Promise<void> {
  const state = deps.states.get(deps.key);
  let digest = new PrefixDigest();
  const continues = state !== undefined && unspliceable(state, r, digest) === null;
  if (r.images) {
    // Images go with their features, which only vLLM's generate route takes.
    if (deps.flavor === 'sglang') return deps.fallback('images');
    const route = deps.generate
      ? await deps.generate.use(() => post(engine, call, `${rootOf(engine.upstream.basePath)}${VLLM_GENERATE_PATH}`, PROBE_BODY(r.chat.model)))
      : false;
    if (!route) return deps.fallback('images_need_generate_route');
  }
  // Rendered here when the sidecar has the model's tokenizer files and the call continues its rollout (text only).
  const local = deps.local && continues && !r.images ? deps.local.continued(state, r) : null;
  let prompt: Uint32Array;
  let how: string;
  let maxModelLen: number | null;
  let features: Json | null = null;
  if (local !== null) {
    ({ prompt, maxModelLen } = local);
    how = 'spliced';
  } else {
    const rendered =
      deps.flavor === 'sglang'
        ? await sglangRendering(engine, call, r, deps)
        : r.images
          ? await imageRendering(engine, call, r, deps)
          : await serverRendering(engine, call, r);
    if (typeof rendered === 'string') return deps.fallback(rendered);
    if (!r.images) deps.local?.serverRendered(r, rendered.tokens, rendered.maxModelLen, continues ? state : null);
    maxModelLen = rendered.maxModelLen;
    // The agent went away while the conversation was rendered: nothing is sent.
    if (call.res.destroyed) return agentLeft(engine, call);
    digest = new PrefixDigest();
    ({ prompt, how } = splice(state, r, rendered.tokens, digest));
    const found = 'features' in rendered ? (rendered.features as Json | null) : null;
    if (found !== null) {
      features = placeFeatures(prompt, found, deps.imageTokenId ?? QWEN_VL_IMAGE_TOKEN_ID);
      if (features === null) return deps.fallback('images_layout');
    }
  }
  const root = rootOf(engine.upstream.basePath);
  const sglang = deps.flavor === 'sglang';
  const generate =
    !sglang && deps.generate ? await deps.generate.use(() => post(engine, call, `${root}${VLLM_GENERATE_PATH}`, PROBE_BODY(r.chat.model))) : false;
  if (call.res.destroyed) return agentLeft(engine, call);
  const keep = deps.keepSpecialTokens === true;
  const extras = { routing: deps.sglangRouting === true, masks: deps.samplingMasks === true, keepSpecialTokens: keep };
  if (sglang) {
    // SGLang's default budget is 128 new tokens: without the agent's or the context length, the call goes as chat.
    if (maxModelLen === null && (r.chat.max_completion_tokens ?? r.chat.max_tokens) == null) return deps.fallback('context_length_unknown');
    if (r.chat.logit_bias !== undefined) return deps.fallback('logit_bias_unsupported');
  }
  const build = (req: TokenInRequest, ids: Uint32Array, f = features): Buffer =>
    sglang
      ? sglangGenerateBody(req, ids, maxModelLen, extras, how === 'spliced' ? (state ?? null) : null)
      : generate
        ? generateBody(req, ids, maxModelLen, keep, f)
        : completionsBody(req, ids, maxModelLen, keep);
  const request = build(r, prompt);
  // Images' processed data is not journaled: the record keeps the images themselves (docs/images.md).
  const journaled = features !== null ? build(r, prompt, journaledFeatures(features)) : request;
  const path = sglang ? `${root}${SGLANG_GENERATE_PATH}` : generate ? `${root}${VLLM_GENERATE_PATH}` : `${engine.upstream.basePath}/completions`;
  const sentAt = performance.now();
  const begun = await open(engine, call, request, r.stream, path);
  if ('aborted' in begun) {
    deps.states.delete(deps.key);
    return agentLeft(engine, call);
  }
  if ('fallback' in begun) {
    deps.states.delete(deps.key);
    if (generate && begun.fallback === 'completions_status_404') deps.generate?.gone();
    return deps.fallback(generate || sglang ? begun.fallback.replace('completions_', 'generate_') : begun.fallback);
  }
  if ('timeout' in begun) {
    // The server took the call and went quiet: the chat route would wait as long again.
    deps.states.delete(deps.key);
    deps.served(how);
    if (call.capture) call.capture.responseStatus = 504;
    const message = `upstream did not answer within ${engine.config.upstream_timeout_ms} ms`;
    engine.settle(call, { status: 'error', error: message, statusClass: '5xx', streamed: false }, null);
    sendProxyError(call.res, 504, 'upstream_timeout', message, call.api);
    return;
  }
  deps.served(how);
  engine.responded(call, begun.ures, sentAt);
  const capture = call.capture;
  if (capture) {
    capture.translation = { upstreamApi: sglang ? 'sglang.generate' : generate ? 'generate' : 'completions', notes: [] };
    const agentRequest = engine.redactedBody(body);
    if (agentRequest) capture.agentRequest(agentRequest);
    engine.journalRequest(capture, journaled);
  }
  const text = new SampledText(deps.reasoning(prompt), r.parseTools && deps.tools ? deps.tools(Array.isArray(r.chat.tools) ? r.chat.tools : undefined) : null);
  const resumer: Resumer = {
    max: deps.maxResumes ?? 0,
    route: sglang ? 'sglang.generate' : generate ? 'generate' : 'completions',
    open: (sampled) => {
      const next = resumedRequest(r, sampled.length);
      if (next === null) return null;
      const ids = new Uint32Array(prompt.length + sampled.length);
      ids.set(prompt, 0);
      ids.set(sampled, prompt.length);
      return open(engine, call, build(next, ids), r.stream, path);
    },
    counted: (result) => deps.resumed?.(result),
  };
  const answer = new TokenInAnswer(engine, call, r, text, begun.ures, begun.replay, sglang, sglang || generate, resumer);
  const result = await answer.run();
  if (result === null || !result.sampled || result.sampled.length === 0) {
    deps.states.delete(deps.key);
    return;
  }
  // The messages splice did not hash, then the answer.
  for (let i = digest.count; i < r.canonical.length; i++) digest.add(r.canonical[i]);
  digest.add(canonicalMessage(text.message()));
  deps.states.set(deps.key, {
    digest: digest.peek(),
    messages: r.canonical.length + 1,
    context: r.context,
    prompt,
    sampled: Uint32Array.from(result.sampled),
    stopped: result.stopped,
  });
}

/** The server's rendering of the whole conversation (`/tokenize`), or why the call goes through as chat. */
async function serverRendering(engine: Engine, call: Call, r: TokenInRequest): Promise<{ tokens: number[]; maxModelLen: number | null } | string> {
  const tokenized = await post(engine, call, `${rootOf(engine.upstream.basePath)}/tokenize`, tokenizeBody(r));
  if ('error' in tokenized) return 'tokenize_unreachable';
  if (tokenized.status !== 200) return `tokenize_status_${tokenized.status}`;
  try {
    const t = JSON.parse(tokenized.body.toString('utf8')) as { tokens?: unknown; max_model_len?: unknown };
    if (!Array.isArray(t.tokens) || t.tokens.length === 0 || !t.tokens.every((x) => Number.isInteger(x) && x >= 0)) throw new Error('no tokens');
    return { tokens: t.tokens as number[], maxModelLen: typeof t.max_model_len === 'number' ? t.max_model_len : null };
  } catch {
    return 'tokenize_answer';
  }
}

/**
 * SGLang's rendering of the whole conversation (a one-token chat call that returns its prompt's
 * ids), and its context length (from its model listing, once per model), or why the call goes
 * through as chat.
 */
async function sglangRendering(
  engine: Engine,
  call: Call,
  r: TokenInRequest,
  deps: TokenInDeps,
): Promise<{ tokens: number[]; maxModelLen: number | null } | string> {
  const maxModelLen = await contextLength(engine, call, r, deps);
  const rendered = await post(engine, call, `${engine.upstream.basePath}/chat/completions`, sglangRenderBody(r));
  if ('error' in rendered) return 'render_unreachable';
  if (rendered.status !== 200) return `render_status_${rendered.status}`;
  const tokens = sglangRenderedIds(rendered.body);
  return tokens === null ? 'render_answer' : { tokens, maxModelLen };
}

/**
 * vLLM's rendering of a conversation with images (its render route: the ids with each image
 * expanded, and the images' features) and its context length (from its model listing), or why the
 * call goes through as chat.
 */
async function imageRendering(
  engine: Engine,
  call: Call,
  r: TokenInRequest,
  deps: TokenInDeps,
): Promise<{ tokens: number[]; maxModelLen: number | null; features: Json | null } | string> {
  const maxModelLen = await contextLength(engine, call, r, deps);
  const rendered = await post(engine, call, `${rootOf(engine.upstream.basePath)}${VLLM_RENDER_PATH}`, renderBody(r));
  if ('error' in rendered) return 'render_unreachable';
  if (rendered.status !== 200) return `render_status_${rendered.status}`;
  const read = readRender(rendered.body);
  if (read === null) return 'render_answer';
  // Without a budget of the agent's or the context length, the generate route would stop at its default of 16 tokens.
  if (maxModelLen === null && (r.chat.max_completion_tokens ?? r.chat.max_tokens) == null) return 'context_length_unknown';
  return extend(read, { maxModelLen });
}

/** The model's context length as the server lists it (`max_model_len`), asked once per model; null when it does not say. */
async function contextLength(engine: Engine, call: Call, r: TokenInRequest, deps: TokenInDeps): Promise<number | null> {
  const model = typeof r.chat.model === 'string' ? r.chat.model : '';
  const lengths = deps.contextLengths;
  if (!lengths) return null;
  if (!lengths.has(model)) {
    const listed = await post(engine, call, `${engine.upstream.basePath}/models`, Buffer.alloc(0), 'GET');
    if (!('error' in listed) && listed.status === 200) {
      // Keyed by the names agents send: bounded, the oldest forgotten first.
      if (lengths.size >= MAX_MODELS) lengths.delete(lengths.keys().next().value!);
      lengths.set(model, sglangMaxModelLen(listed.body, r.chat.model));
    }
  }
  return lengths.get(model) ?? null;
}

/** Models whose context length is remembered, by the names agents send. */
const MAX_MODELS = 256;

/** The agent went away before the answer began: the call is recorded aborted, and nothing is sent. */
function agentLeft(engine: Engine, call: Call): void {
  engine.settle(
    call,
    { status: 'aborted', error: 'client closed the connection before the call was sent', statusClass: 'client_abort', streamed: false },
    null,
  );
}

/**
 * Sends the completions request and waits for its answer to begin: a 2xx (its first body bytes
 * may have come), or why the call should go through as chat instead.
 */
function open(engine: Engine, call: Call, request: Buffer, stream: boolean, path: string): Promise<Opened> {
  return new Promise((resolve) => {
    const ureq = openUpstream(
      engine.upstream,
      call.capture,
      {
        method: 'POST',
        path,
        headers: upstreamHeaders(engine.upstream, call, request.length, stream ? 'text/event-stream' : 'application/json'),
      },
      engine.config.upstream_timeout_ms,
      {
        response: (ures) => {
          const status = ures.statusCode ?? 502;
          if (status >= 200 && status < 300) return resolve({ ures, replay: holdEvents(ures) });
          ures.resume();
          resolve({ fallback: `completions_status_${status}` });
        },
        // The agent's leaving destroys the request (below): not a reason to send the call as chat.
        error: (err) =>
          resolve(call.res.destroyed ? { aborted: true } : err instanceof UpstreamTimeout ? { timeout: true } : { fallback: 'completions_unreachable' }),
      },
    );
    call.res.once('close', () => {
      if (!call.res.writableFinished) ureq.destroy();
    });
    ureq.end(request);
  });
}

/**
 * Keeps what the answer emits until its reader is attached (the upstream client emits body bytes
 * as they come, even in the turn the head arrived in); the returned function hands them over.
 */
function holdEvents(ures: UpstreamResponse): () => void {
  const held: [string, unknown][] = [];
  const names = ['data', 'end', 'close', 'error'];
  const keepers = names.map((name) => (arg: unknown) => held.push([name, arg]));
  names.forEach((name, i) => ures.on(name, keepers[i]));
  return () => {
    names.forEach((name, i) => ures.off(name, keepers[i]));
    for (const [name, arg] of held) ures.emit(name, arg);
  };
}

interface AnswerResult {
  sampled: number[] | null;
  /** The model ended its turn itself (its last sampled id is the end-of-turn token). */
  stopped: boolean;
}

/** An attempt's answer has begun, or why it did not. */
type Opened = { ures: UpstreamResponse; replay: () => void } | { fallback: string } | { timeout: true } | { aborted: true };

/** How a call the engine aborts is sent again (docs/token-in.md#aborted-calls). */
export interface Resumer {
  /** How many times one call is sent again (`token_in.max_resumes`). */
  max: number;
  route: TokenInRoute;
  /** Sends the call again, its prompt followed by the ids sampled so far; null when its token budget is spent. */
  open(sampled: readonly number[]): Promise<Opened> | null;
  /** Counts what became of an abort. */
  counted(result: 'resumed' | 'limit' | 'failed'): void;
}

/** The agent's answer from the completions answer: a chat completion, or its event stream. */
class TokenInAnswer {
  private done = false;
  private readonly head: { id: string; created: number; model: unknown };
  private sampled: number[] = [];
  private tokenIds = true;
  private finish: string | null = null;
  /** The server stopped on a stop string or token of the request, not on the model's end of turn. */
  private stopMatched = false;
  private usage: unknown = undefined;
  private resolve!: (r: AnswerResult | null) => void;
  /** The answers of the attempts the engine aborted, in their whole shape (resumed calls only). */
  private readonly attempts: Json[] = [];
  /** What is journaled of the current attempt, kept until it ends for a resumption to merge. */
  private held: Buffer[] = [];
  /** How many times the call was sent again; notes for its record. */
  private resumed = 0;
  private readonly notes: string[] = [];
  /** The stream's state across attempts: the agent's head sent, tool calls so far. */
  private started = false;
  private toolIndex = 0;

  constructor(
    private readonly engine: Engine,
    private readonly call: Call,
    private readonly r: TokenInRequest,
    private readonly text: SampledText,
    private ures: UpstreamResponse,
    private replay: () => void,
    /** SGLang's `/generate` answers, read as completions choices; null: a completions-shaped answer. */
    private readonly sglang: boolean,
    /** The route's answers do not name the stop that ended them (only completions' `stop_reason` does). */
    private readonly stopsUnsaid: boolean,
    private readonly resumer: Resumer,
  ) {
    this.head = { id: `chatcmpl-${randomBytes(12).toString('hex')}`, created: Math.floor(Date.now() / 1000), model: r.chat.model ?? null };
  }

  run(): Promise<AnswerResult | null> {
    return new Promise((resolve) => {
      this.resolve = resolve;
      const { call } = this;
      call.res.on('close', () => {
        if (this.done || call.res.writableFinished) return;
        this.ures.destroy();
        this.end({ status: 'aborted', error: 'client closed the connection before the response ended', statusClass: 'client_abort', ok: false });
      });
      this.attempt();
    });
  }

  /** Reads the current attempt's answer. */
  private attempt(): void {
    this.held = [];
    if (this.r.stream) this.relay();
    else this.whole();
    this.replay();
  }

  /** Journals an attempt's bytes (the first attempt's as they come; a resumed call's merged at its end). */
  private journal(bytes: Buffer): void {
    if (this.attempts.length === 0) this.call.capture?.response(bytes);
    // A whole answer is read from them; a stream's are kept only for a resumption to merge.
    if (!this.r.stream || this.resumer.max > 0) this.held.push(bytes);
  }

  private whole(): void {
    const ures = this.ures;
    const reader = this.sglang ? new SglangAnswerReader() : null;
    ures.on('data', (c: Buffer) => this.journal(c));
    ures.on('end', () => {
      if (this.done) return;
      let choice: CompletionChoice;
      let usage: unknown;
      try {
        const v = JSON.parse(Buffer.concat(this.held).toString('utf8')) as { choices?: CompletionChoice[]; usage?: unknown; model?: unknown } | null;
        if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('not one answer object');
        if (reader !== null) {
          const finished = (v as { meta_info?: { finish_reason?: unknown } }).meta_info?.finish_reason;
          if (typeof finished !== 'object' || finished === null) throw new Error('no meta_info.finish_reason');
          ({ choice, usage } = reader.read(v));
        } else {
          if (!Array.isArray(v.choices) || v.choices.length !== 1 || !isChoice(v.choices[0])) throw new Error('not one choice');
          choice = v.choices[0];
          usage = v.usage;
          if (v.model !== undefined && this.attempts.length === 0) this.head.model = v.model;
        }
      } catch (err) {
        return this.fail(`upstream completions answer cannot be read: ${(err as Error).message}`);
      }
      this.take(choice);
      this.usage = usage;
      this.ended(() => {
        this.text.end();
        const finish = chatFinish(this.finish, this.text.toolCalls);
        const bytes = Buffer.from(
          JSON.stringify({
            id: this.head.id,
            object: 'chat.completion',
            created: this.head.created,
            model: this.head.model,
            choices: [{ index: 0, message: this.text.message(), logprobs: null, finish_reason: finish }],
            usage: this.usage ?? null,
          }),
        );
        this.send(200, bytes, 'application/json');
      });
    });
    this.watchClose(ures);
  }

  private write(s: string): void {
    if (s === '') return;
    const bytes = Buffer.from(s);
    this.noteAgentBytes(bytes);
    this.toAgent(bytes);
  }

  private toAgent: (bytes: Buffer) => void = () => undefined;

  private start(): void {
    if (this.started) return;
    this.started = true;
    const { call } = this;
    if (call.capture) {
      call.capture.streamed = true;
      call.capture.responseStatus = 200;
    }
    call.res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
    call.res.flushHeaders();
    this.write(chatChunk(this.head, { role: 'assistant', content: '' }, null));
  }

  private emit(p: ReturnType<SampledText['push']>): void {
    for (const d of deltasOf(p, this.toolIndex)) this.write(chatChunk(this.head, d, null));
    this.toolIndex += p.calls.length;
  }

  private relay(): void {
    const { call } = this;
    const ures = this.ures;
    const splitter = new SseSplitter();
    const reader = this.sglang ? new SglangAnswerReader() : null;
    this.toAgent = agentWriter(call.res, ures);
    let over = false;
    const finishStream = (): void => {
      if (this.done || over) return;
      over = true;
      this.start();
      this.ended(() => {
        this.emit(this.text.end());
        if (this.finish === null) return this.streamFailed('upstream stream ended before the model finished');
        let tail = chatChunk(this.head, {}, chatFinish(this.finish, this.text.toolCalls));
        if (this.r.includeUsage && this.usage !== undefined) tail += chatChunk(this.head, null, null, this.usage);
        tail += 'data: [DONE]\n\n';
        const bytes = Buffer.from(tail);
        this.noteAgentBytes(bytes);
        this.end({ status: 'ok', error: null, statusClass: '2xx', ok: true, streamed: true });
        call.res.end(bytes);
      });
    };
    const takeEvents = (events: SseEvent[]): void => {
      for (const e of events) {
        if (this.done || over || e.data === '') continue;
        // SGLang's events are journaled as deltas (below); anything else of theirs as it came.
        if (reader !== null && (e.data === '[DONE]' || !e.data.startsWith('{'))) this.journal(Buffer.from(`data: ${e.data}\n\n`));
        if (e.data === '[DONE]') return finishStream();
        let v: { choices?: CompletionChoice[]; usage?: unknown; model?: unknown };
        try {
          v = JSON.parse(e.data) as typeof v;
        } catch {
          return this.streamFailed('upstream sent an event that is not JSON');
        }
        if (typeof v !== 'object' || v === null || Array.isArray(v)) return this.streamFailed('upstream sent an event that is not an object');
        if (reader !== null) {
          const piece = reader.read(v);
          this.journal(Buffer.from(`data: ${JSON.stringify(piece.delta)}\n\n`));
          if (piece.usage !== undefined) this.usage = piece.usage;
          this.start();
          this.emit(this.take(piece.choice));
          continue;
        }
        if (v.usage) this.usage = v.usage;
        if (!Array.isArray(v.choices) || v.choices.length === 0) continue;
        if (!isChoice(v.choices[0])) return this.streamFailed('upstream sent a choice that is not an object');
        this.start();
        this.emit(this.take(v.choices[0]));
      }
    };
    ures.on('data', (chunk: Buffer) => {
      if (this.done || over) return;
      if (reader === null) this.journal(chunk);
      try {
        takeEvents(splitter.push(chunk));
      } catch (err) {
        if (!(err instanceof SseEventTooLargeError)) throw err;
        this.streamFailed(`upstream ${err.message}`);
      }
    });
    ures.on('end', () => {
      if (this.done || over) return;
      takeEvents(splitter.end());
      finishStream();
    });
    this.watchClose(ures);
  }

  /**
   * The current attempt ended (its answer read): `finish` the call, unless the engine aborted it
   * and it is sent again, its answer then continuing this one. A resumed call's record is the
   * attempts' answers merged, journaled before the agent's last bytes.
   */
  private ended(finish: () => void): void {
    const resumer = this.resumer;
    if (this.finish !== 'abort' || this.done) return this.finishWith(finish, true);
    if (!this.tokenIds) {
      resumer.counted('failed');
      return this.finishWith(finish, true, 'resume_failed:no_token_ids');
    }
    if (this.attempts.length >= resumer.max) {
      resumer.counted('limit');
      return this.finishWith(finish, true, `resume_limit:${resumer.max}`);
    }
    const answer = attemptAnswer(resumer.route, this.held, this.r.stream);
    const next = answer === null ? null : resumer.open(this.sampled);
    if (answer === null || next === null) {
      resumer.counted('failed');
      return this.finishWith(finish, true, answer === null ? 'resume_failed:answer_unreadable' : 'resume_failed:budget_spent');
    }
    // From here the record is the attempts' answers merged, journaled when the call ends.
    if (this.attempts.length === 0) this.call.capture?.restart('response');
    this.attempts.push(answer);
    this.held = [];
    void next.then((opened) => {
      if (this.done) {
        if ('ures' in opened) opened.ures.destroy();
        return;
      }
      if ('ures' in opened) {
        resumer.counted('resumed');
        this.resumed++;
        this.finish = null;
        this.stopMatched = false;
        this.ures = opened.ures;
        this.replay = opened.replay;
        return this.attempt();
      }
      if ('aborted' in opened)
        return this.end({ status: 'aborted', error: 'client closed the connection before the response ended', statusClass: 'client_abort', ok: false });
      // The aborted attempt's answer stands: the call ends as the engine ended it.
      resumer.counted('failed');
      this.finishWith(finish, false, `resume_failed:${'timeout' in opened ? 'timeout' : opened.fallback.replace('completions_', '')}`);
    });
  }

  /**
   * Ends the call; when it was sent again, its record is the attempts' answers merged (with the
   * current attempt's when `current`), and the agent's usage counts them all.
   */
  private finishWith(finish: () => void, current: boolean, note?: string): void {
    if (note !== undefined) this.notes.push(note);
    if (this.attempts.length > 0) {
      const last = current ? attemptAnswer(this.resumer.route, this.held, this.r.stream) : null;
      const merged = mergeAttempts(this.resumer.route, last === null ? this.attempts : [...this.attempts, last]);
      this.notes.push(`resumed:${this.resumed}`);
      const usage = answerUsage(this.resumer.route, merged);
      if (usage !== undefined) this.usage = usage;
      const json = JSON.stringify(merged);
      this.call.capture?.response(Buffer.from(this.r.stream ? `data: ${json}\n\ndata: [DONE]\n\n` : json));
    }
    this.held = [];
    finish();
  }

  /** Reads a completions choice (whole, or one stream chunk's): its text, ids and finish reason. */
  private take(choice: CompletionChoice): ReturnType<SampledText['push']> {
    // Appended one by one: a spread of a long answer's ids would exceed the call stack.
    if (Array.isArray(choice.token_ids)) for (const id of choice.token_ids) this.sampled.push(id);
    else if (typeof choice.text === 'string' && choice.text !== '') this.tokenIds = false;
    if (choice.finish_reason) this.finish = choice.finish_reason;
    if (choice.stop_reason !== undefined && choice.stop_reason !== null) this.stopMatched = true;
    return this.text.push(typeof choice.text === 'string' ? choice.text : '');
  }

  private watchClose(ures: UpstreamResponse): void {
    ures.on('close', () => {
      if (this.done || ures.complete || ures !== this.ures) return;
      if (this.r.stream && this.call.res.headersSent) this.streamFailed('upstream closed the stream before its end');
      else this.fail('upstream closed the response before its end');
    });
  }

  /** A stream that broke after it began: an error event, then the end. */
  private streamFailed(message: string): void {
    if (this.done) return;
    const bytes = Buffer.from(
      `data: ${JSON.stringify({ error: { message: `lightning-sidecar: ${message}`, type: 'api_error', code: 'stream_failed' } })}\n\ndata: [DONE]\n\n`,
    );
    if (!this.call.res.headersSent) return this.fail(message);
    this.noteAgentBytes(bytes);
    this.end({ status: 'error', error: message, statusClass: '5xx', ok: false, streamed: true });
    this.call.res.end(bytes);
    this.ures.destroy();
  }

  private fail(message: string): void {
    const bytes = Buffer.from(JSON.stringify({ error: { message: `lightning-sidecar: ${message}`, type: 'api_error', param: null, code: 'upstream_broke' } }));
    this.send(502, bytes, 'application/json', message);
  }

  private send(status: number, bytes: Buffer, type: string, error: string | null = null): void {
    if (this.done) return;
    if (this.call.capture) this.call.capture.responseStatus = status;
    this.noteAgentBytes(bytes);
    this.end({ status: error ? 'error' : 'ok', error, statusClass: `${Math.floor(status / 100)}xx`, ok: error === null });
    this.call.res.writeHead(status, { 'content-type': type, 'content-length': String(bytes.length) });
    this.call.res.end(bytes);
  }

  private noteAgentBytes(bytes: Buffer): void {
    const capture = this.call.capture;
    if (!capture) return;
    if (capture.firstByteAt === null) capture.firstByteAt = performance.now();
    capture.agentResponse(bytes);
  }

  /** Settles the call (its record written through before the agent's last bytes) and the result. */
  private end(o: { status: 'ok' | 'error' | 'aborted'; error: string | null; statusClass: string; ok: boolean; streamed?: boolean }): void {
    if (this.done) return;
    this.done = true;
    const notes = [...this.text.notes, ...this.notes];
    if (this.call.capture && notes.length > 0 && this.call.capture.translation) this.call.capture.translation.notes = notes;
    this.engine.settle(this.call, { status: o.status, error: o.error, statusClass: o.statusClass, streamed: o.streamed ?? this.r.stream }, null);
    // Routes that do not say which stop ended the answer (vLLM's generate, SGLang's matched token):
    // with stops of the agent's own, a stop may be one of them, not the model's end of turn.
    const unsure = this.stopsUnsaid && (hasItems(this.r.chat.stop) || hasItems(this.r.chat.stop_token_ids));
    this.resolve(o.ok ? { sampled: this.tokenIds ? this.sampled : null, stopped: this.finish === 'stop' && !this.stopMatched && !unsure } : null);
  }
}

function hasItems(v: unknown): boolean {
  return (typeof v === 'string' && v !== '') || (Array.isArray(v) && v.length > 0);
}

function isChoice(c: unknown): c is CompletionChoice {
  return typeof c === 'object' && c !== null && !Array.isArray(c);
}

/** A completions choice (whole, or a stream chunk's); `stop_reason` (vLLM): the stop string or token id of the request that ended it, null when the model's own end of turn did. */
type CompletionChoice = ChoicePiece;
