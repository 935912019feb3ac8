import { createHash } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import { gzipSync } from 'node:zlib';
import type { AddressInfo, Socket } from 'node:net';
import { calculatorScript } from './calculator';
import { buildAnthropic, buildChat, buildCompletions, buildResponses, type Generation } from './fake-responses';
import { assistantTokens, IM_END, logprobOf, pieces, renderAssistant, renderPrompt, tokenId, tokenize } from './fake-tokenizer';

/**
 * The suite's scripted model server. Its answers come from a script (default: the calculator agent,
 * test/support/calculator.ts), with token ids and logprobs when asked, streamed and not. Two
 * personalities:
 *
 * - lenient (the default): answers like vLLM, SGLang or plain OpenAI (`flavor`) on
 *   `/v1/chat/completions`, `/v1/completions`, `/v1/responses` and Anthropic `/v1/messages`.
 * - `strict: true`: speaks only what vLLM speaks, for translation and detection tests:
 *   `GET /v1/models` (`owned_by: "vllm"`), `GET /version`, `/v1/chat/completions` and
 *   `/v1/completions` with `return_token_ids` (top-level `prompt_token_ids`, per-choice
 *   `token_ids`; streamed: prompt ids in the first chunk, token ids per delta), logprobs,
 *   `message.reasoning` when the script reasons, and vLLM's `stop_reason`. `/v1/responses` and
 *   `/v1/messages` answer 404 unless switched on (`routes`; real vLLM serves both, without token
 *   ids; off by default so that a test proves the sidecar translated rather than passed through).
 *   With `flavor: 'openai'` it is a plain OpenAI-compatible server instead: no `owned_by: vllm`,
 *   no `/version`, and a 400 for any request field OpenAI does not know (as OpenAI answers
 *   `Unrecognized request argument supplied: return_token_ids`).
 */
/** The default script, also here for the examples that start this server. */
export { calculatorScript };

export interface ReceivedRequest {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  body: Buffer;
  json: Record<string, unknown> | null;
}

/** What the script says the model does next. */
export interface Turn {
  content?: string | null;
  /** Separated thinking, as vLLM returns it with a reasoning parser (`message.reasoning`; strict server). */
  reasoning?: string;
  /** `arguments` as an object is serialized; as a string it is sent verbatim (malformed JSON included). */
  toolCalls?: { name: string; arguments: Record<string, unknown> | string; id?: string }[];
  /** Strict server: the finish reason (default `tool_calls` with tool calls, else `stop`). */
  finishReason?: 'stop' | 'length' | 'tool_calls';
  /** Strict server: vLLM's `stop_reason`, the stop string that ended generation. */
  stopReason?: string | null;
}

/** Overrides the normal answer to one request. */
export type Fault =
  | { kind: 'status'; status: number; body: string; contentType?: string }
  /** A 200 answer whose body is not what the route promises. */
  | { kind: 'non-json'; body: string }
  | { kind: 'hang' }
  | { kind: 'reset' }
  | { kind: 'delay'; ms: number }
  /** Streams `afterEvents` events, then drops the connection. */
  | { kind: 'reset-mid-stream'; afterEvents: number }
  /** Streams `afterEvents` events, then vLLM's in-stream error object and `[DONE]`. */
  | { kind: 'stream-error'; afterEvents: number; message: string };

export interface FakeModelServerOptions {
  /** Lenient server: whose answers it imitates. Strict server: `vllm` (default) or `openai`. */
  flavor?: 'vllm' | 'sglang' | 'openai';
  /** Only what vLLM (or, with flavor `openai`, OpenAI) speaks; see above. */
  strict?: boolean;
  /** Strict server: serve `/v1/responses` or `/v1/messages` with a canned answer instead of 404. */
  routes?: { responses?: boolean; messages?: boolean };
  /** Strict server: what `GET /version` says. */
  version?: string;
  /** Decides the next turn from the request; default: the calculator agent script. */
  script?: (req: ReceivedRequest) => Turn;
  /** Milliseconds between stream events. */
  chunkDelayMs?: number;
  /** Fixed delay before answering, like a model's prefill. */
  delayMs?: number;
  /** When set, a stream pauses after its first event until this resolves. */
  holdAfterFirstEvent?: () => Promise<void>;
  /** Per-request fault (return null for a normal answer). */
  fault?: (req: ReceivedRequest) => Fault | null;
  model?: string;
  /** gzip JSON bodies when the client accepts it (like OpenAI's API does). */
  gzip?: boolean;
  /** Listen on this port (a replica brought back where it was); any free one by default. */
  port?: number;
  /**
   * Lenient SGLang: a non-streamed chat call with `return_routed_experts: true` gets
   * `sglext.routed_experts`, base64 of raw little-endian int32 `[prompt + output - 1 - start, layers,
   * topK]` (`start`: the request's `routed_experts_start_len`), expert = (position × 31 + layer × 7 + k
   * × 3 + token) mod 200.
   */
  sglangRouting?: { layers: number; topK: number };
  /** Lenient SGLang: non-streamed chat answers carry `sglext.weight_version` (the server's label). */
  sglangWeightVersion?: string;
  /**
   * Lenient SGLang with mask support: a non-streamed chat call with `return_meta_info` and
   * `return_sampling_mask` gets `choices[].meta_info.output_token_sampling_mask`, one row per output
   * token: the sampled id and `keep - 1` others (see `sglangStandInMask`). `dropSampledFrom`: the
   * rows of that call (by request index) leave the sampled id out (a faulty sampler).
   * Without it (a build without mask support) `return_sampling_mask` is ignored.
   */
  sglangMasks?: { keep: number; dropSampledFrom?: number };
}

export interface FakeModelServer {
  /** Base URL with `/v1`, as agents are configured. */
  url: string;
  /** `http://127.0.0.1:PORT` */
  origin: string;
  port: number;
  requests: ReceivedRequest[];
  /** Bytes of each response body as written, by request index. */
  responses: Buffer[];
  close(): Promise<void>;
}

export async function startFakeModelServer(options: FakeModelServerOptions = {}): Promise<FakeModelServer> {
  const requests: ReceivedRequest[] = [];
  const responses: Buffer[] = [];
  const sockets = new Set<Socket>();
  const flavor = options.flavor ?? 'vllm';
  const model = options.model ?? 'fake-model';
  const script = options.script ?? ((r: ReceivedRequest) => calculatorScript(r));
  const server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const body = Buffer.concat(parts);
      let json: Record<string, unknown> | null = null;
      try {
        const v: unknown = JSON.parse(body.toString('utf8'));
        json = typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
      } catch {
        json = null;
      }
      const received: ReceivedRequest = { method: req.method ?? '', path: req.url ?? '', headers: req.headers, rawHeaders: req.rawHeaders, body, json };
      const index = requests.push(received) - 1;
      void answer(received, req, res, index).catch(() => res.destroy());
    });
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });

  async function answer(r: ReceivedRequest, req: IncomingMessage, res: ServerResponse, index: number): Promise<void> {
    const fault = options.fault?.(r) ?? null;
    if (fault?.kind === 'hang') return;
    if (fault?.kind === 'reset') {
      req.socket.destroy();
      return;
    }
    if (fault?.kind === 'delay') await sleep(fault.ms);
    if (options.delayMs) await sleep(options.delayMs);
    if (fault?.kind === 'status') return send(res, index, fault.status, Buffer.from(fault.body), fault.contentType ?? 'application/json');
    if (fault?.kind === 'non-json') return send(res, index, 200, Buffer.from(fault.body), 'text/html');
    const path = r.path.split('?')[0];
    const turnAnswer = options.strict ? strictAnswer(r, path) : lenientAnswer(r, path);
    if ('status' in turnAnswer) return sendJson(res, index, turnAnswer.body, turnAnswer.status);
    if (!turnAnswer.stream) return sendJson(res, index, turnAnswer.body);
    res.writeHead(200, { 'content-type': turnAnswer.contentType, 'cache-control': 'no-cache', 'x-fake-upstream': 'yes' });
    res.flushHeaders();
    await streamEvents(req, res, index, turnAnswer.events, fault);
  }

  type Answer = { status: number; body: unknown } | { stream: false; body: unknown } | { stream: true; events: string[]; contentType: string };

  /** Every API, as vLLM, SGLang or OpenAI would answer it. */
  function lenientAnswer(r: ReceivedRequest, path: string): Answer {
    if (r.method === 'GET' && path === '/v1/models') {
      return { stream: false, body: { object: 'list', data: [{ id: model, object: 'model', owned_by: 'lightning-sidecar-tests' }] } };
    }
    if (r.method !== 'POST' || !r.json)
      return { status: 404, body: { error: { message: `fake model server: no route ${r.method} ${path}`, type: 'not_found' } } };
    const gen = generate(r, path);
    if (!gen) return { status: 404, body: { error: { message: `fake model server: no route ${path}`, type: 'not_found' } } };
    const stream = r.json.stream === true;
    const out =
      path === '/v1/chat/completions'
        ? buildChat(gen, stream)
        : path === '/v1/completions'
          ? buildCompletions(gen, stream)
          : path === '/v1/responses'
            ? buildResponses(gen, stream)
            : buildAnthropic(gen, stream);
    if (!stream && path === '/v1/chat/completions' && flavor === 'sglang') {
      const ext: Record<string, unknown> = {};
      if (options.sglangRouting && r.json.return_routed_experts === true)
        ext.routed_experts = sglangRows(options.sglangRouting, gen, r.json.routed_experts_start_len);
      if (options.sglangWeightVersion !== undefined) ext.weight_version = options.sglangWeightVersion;
      if (Object.keys(ext).length > 0) (out.body as Record<string, unknown>).sglext = ext;
      if (r.json.return_meta_info === true)
        (out.body as { choices: Record<string, unknown>[] }).choices.forEach((c, i) => {
          const tokens = gen.choices[i].tokens;
          const meta: Record<string, unknown> = { finish_reason: { type: 'stop' }, prompt_tokens: gen.promptIds.length, completion_tokens: tokens.length };
          if (options.sglangMasks && r.json!.return_sampling_mask === true) {
            const drop = options.sglangMasks.dropSampledFrom === requests.length - 1;
            meta.output_token_sampling_mask = tokens.map((id, p) => sglangStandInMask(id, p, options.sglangMasks!.keep).filter((k) => !drop || k !== id));
            meta.output_token_sampling_mask_length = tokens.length;
          }
          c.meta_info = meta;
        });
    }
    // SGLang refuses `return_meta_info` on a streamed chat call.
    if (stream && path === '/v1/chat/completions' && flavor === 'sglang' && r.json.return_meta_info === true)
      return {
        status: 400,
        body: { object: 'error', message: 'return_meta_info is not supported for streaming requests', type: 'BadRequestError', param: null, code: 400 },
      };
    return stream ? { stream: true, events: out.events, contentType: 'text/event-stream' } : { stream: false, body: out.body };
  }

  /** Only what vLLM (or OpenAI) serves. */
  function strictAnswer(r: ReceivedRequest, path: string): Answer {
    const openaiLike = flavor === 'openai';
    if (r.method === 'GET' && path === '/v1/models') {
      const card = openaiLike
        ? { id: model, object: 'model', created: CREATED, owned_by: 'system' }
        : { id: model, object: 'model', created: CREATED, owned_by: 'vllm', root: model, parent: null, max_model_len: 32768, permission: [] };
      return { stream: false, body: { object: 'list', data: [card] } };
    }
    if (r.method === 'GET' && path === '/version' && !openaiLike) return { stream: false, body: { version: options.version ?? '0.11.0' } };
    const routed =
      r.method === 'POST' &&
      (path === '/v1/chat/completions' ||
        path === '/v1/completions' ||
        (path === '/v1/responses' && options.routes?.responses) ||
        (path === '/v1/messages' && options.routes?.messages));
    // FastAPI's answer for a route it does not have.
    if (!routed) return { status: 404, body: { detail: 'Not Found' } };
    if (!r.json) return { status: 400, body: errorBody('request body is not a JSON object', 'BadRequestError', 400) };
    if (openaiLike) {
      const known = path === '/v1/completions' ? OPENAI_COMPLETION_FIELDS : OPENAI_CHAT_FIELDS;
      const unknown = Object.keys(r.json).find((k) => !known.has(k));
      if (unknown) {
        return {
          status: 400,
          body: { error: { message: `Unrecognized request argument supplied: ${unknown}`, type: 'invalid_request_error', param: null, code: null } },
        };
      }
    }
    if (path === '/v1/responses' || path === '/v1/messages') return { stream: false, body: cannedNative(path, r.json) };
    const turn = script(r);
    const g = generateVllm(r, turn, !openaiLike);
    const stream = r.json.stream === true;
    if (path === '/v1/completions') {
      const gen: Generation = {
        serial: g.serial,
        model: g.model,
        flavor: 'vllm',
        withIds: g.withIds,
        withLogprobs: g.withLogprobs,
        promptIds: tokenize(String(r.json.prompt ?? '')),
        choices: [{ index: 0, content: turn.content ?? '', toolCalls: [], tokens: tokenize(turn.content ?? '') }],
        includeUsage: g.includeUsage,
      };
      const built = buildCompletions(gen, stream);
      return stream ? { stream: true, events: built.events, contentType: 'text/event-stream; charset=utf-8' } : { stream: false, body: built.body };
    }
    return stream ? { stream: true, events: chatEvents(g), contentType: 'text/event-stream; charset=utf-8' } : { stream: false, body: chatBody(g) };
  }

  function generate(r: ReceivedRequest, path: string): Generation | null {
    const body = r.json!;
    // Distinct for distinct requests (frameworks key messages by id), equal for equal ones (tests compare direct and proxied bytes).
    const serial = createHash('sha1').update(r.body).digest().readUInt32BE(0);
    const turn = script(r);
    const n = typeof body.n === 'number' && body.n > 1 ? body.n : 1;
    const withIds = flavor !== 'openai' && (body.return_token_ids === true || flavor === 'sglang');
    const withLogprobs = body.logprobs === true || typeof body.logprobs === 'number';
    let promptIds: number[];
    if (path === '/v1/chat/completions') promptIds = renderPrompt((body.messages as never[]) ?? []);
    else if (path === '/v1/completions') promptIds = tokenize(String(body.prompt ?? ''));
    else if (path === '/v1/responses') promptIds = renderPrompt(responsesInputAsMessages(body.input));
    else if (path === '/v1/messages') promptIds = renderPrompt((body.messages as never[]) ?? []);
    else return null;
    const choices = Array.from({ length: n }, (_, i) => {
      const content = n > 1 && turn.content ? `${turn.content} (sample ${i})` : (turn.content ?? null);
      const toolCalls = (turn.toolCalls ?? []).map((tc, j) => ({
        id: tc.id ?? `call_${serial}_${i}_${j}`,
        name: tc.name,
        arguments: typeof tc.arguments === 'string' ? tc.arguments : JSON.stringify(tc.arguments),
      }));
      const tokens = path === '/v1/completions' ? tokenize(content ?? '') : assistantTokens(content, toolCalls);
      return { index: i, content, toolCalls, tokens };
    });
    return {
      serial,
      model: typeof body.model === 'string' ? body.model : model,
      flavor,
      withIds,
      withLogprobs,
      promptIds,
      choices,
      includeUsage: includeUsage(body),
    };
  }

  function generateVllm(r: ReceivedRequest, turn: Turn, tokenIds: boolean): VllmGeneration {
    const body = r.json!;
    const serial = createHash('sha1').update(r.body).digest().readUInt32BE(0);
    const toolCalls = (turn.toolCalls ?? []).map((tc, j) => ({
      id: tc.id ?? `chatcmpl-tool-${serial.toString(16)}${j}`,
      name: tc.name,
      arguments: typeof tc.arguments === 'string' ? tc.arguments : JSON.stringify(tc.arguments),
    }));
    const content = turn.content ?? (toolCalls.length > 0 ? null : '');
    const reasoning = turn.reasoning ?? null;
    // Thinking is generated before the answer, so its tokens come first in token_ids.
    const text = (reasoning ? `<think>${reasoning}</think>` : '') + renderAssistant(content, toolCalls);
    const tokenPieces = [...pieces(text), '<|im_end|>'];
    const tokens = tokenPieces.map((p, i) => (i === tokenPieces.length - 1 ? IM_END : tokenId(p)));
    return {
      serial,
      id: `chatcmpl-${serial.toString(16).padStart(8, '0')}`,
      model: typeof body.model === 'string' ? body.model : model,
      withIds: tokenIds && body.return_token_ids === true,
      withLogprobs: body.logprobs === true || typeof body.logprobs === 'number',
      asTokenIds: body.return_tokens_as_token_ids === true,
      promptIds: renderPrompt((body.messages as never[]) ?? []),
      content,
      reasoning,
      toolCalls,
      tokens,
      tokenPieces,
      finishReason: turn.finishReason ?? (toolCalls.length > 0 ? 'tool_calls' : 'stop'),
      stopReason: turn.stopReason ?? null,
      includeUsage: includeUsage(body),
    };
  }

  async function streamEvents(req: IncomingMessage, res: ServerResponse, index: number, events: string[], fault: Fault | null): Promise<void> {
    const written: Buffer[] = [];
    const write = (bytes: Buffer) => {
      written.push(bytes);
      // Waits until each event is handed to the socket, so a fault after it cannot discard it.
      return new Promise<void>((r) => res.write(bytes, () => r()));
    };
    let n = 0;
    for (const event of events) {
      if (fault?.kind === 'reset-mid-stream' && n === fault.afterEvents) {
        responses[index] = Buffer.concat(written);
        req.socket.destroy();
        return;
      }
      if (fault?.kind === 'stream-error' && n === fault.afterEvents) {
        await write(Buffer.from(`data: ${JSON.stringify(errorBody(fault.message, 'InternalServerError', 500))}\n\n`));
        written.push(Buffer.from('data: [DONE]\n\n'));
        responses[index] = Buffer.concat(written);
        res.end('data: [DONE]\n\n');
        return;
      }
      await write(Buffer.from(event));
      n++;
      if (n === 1 && options.holdAfterFirstEvent) await options.holdAfterFirstEvent();
      else if (options.chunkDelayMs) await sleep(options.chunkDelayMs);
      if (res.destroyed) return;
    }
    responses[index] = Buffer.concat(written);
    res.end();
  }

  function sendJson(res: ServerResponse, index: number, value: unknown, status = 200): void {
    let bytes = Buffer.from(JSON.stringify(value));
    const gzip = options.gzip === true && /gzip/.test(String(res.req.headers['accept-encoding'] ?? ''));
    if (gzip) bytes = gzipSync(bytes);
    send(res, index, status, bytes, 'application/json', gzip ? { 'content-encoding': 'gzip' } : {});
  }

  function send(res: ServerResponse, index: number, status: number, bytes: Buffer, contentType: string, headers: Record<string, string> = {}): void {
    responses[index] = bytes;
    res.writeHead(status, { 'content-type': contentType, 'content-length': bytes.length, 'x-fake-upstream': 'yes', ...headers });
    res.end(bytes);
  }

  await new Promise<void>((resolve) => server.listen(options.port ?? 0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    origin: `http://127.0.0.1:${port}`,
    port,
    requests,
    responses,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

function includeUsage(body: Record<string, unknown>): boolean {
  const so = body.stream_options as { include_usage?: unknown } | undefined;
  return body.stream !== true || so?.include_usage === true;
}

function responsesInputAsMessages(input: unknown): { role: string; content: unknown }[] {
  if (typeof input === 'string') return [{ role: 'user', content: input }];
  if (!Array.isArray(input)) return [];
  return input.map((item: { role?: string; content?: unknown; type?: string; output?: unknown; arguments?: unknown }) => {
    if (item.type === 'function_call_output') return { role: 'tool', content: String(item.output ?? '') };
    if (item.type === 'function_call') return { role: 'assistant', content: String(item.arguments ?? '') };
    return { role: item.role ?? 'user', content: item.content };
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/* The strict (vLLM / OpenAI) personality's answers. */

/** Chat-completions request fields OpenAI accepts; anything else is a 400 in `openaiLike` mode. */
const OPENAI_CHAT_FIELDS = new Set([
  'model',
  'messages',
  'audio',
  'frequency_penalty',
  'function_call',
  'functions',
  'logit_bias',
  'logprobs',
  'max_completion_tokens',
  'max_tokens',
  'metadata',
  'modalities',
  'n',
  'parallel_tool_calls',
  'prediction',
  'presence_penalty',
  'prompt_cache_key',
  'prompt_cache_retention',
  'reasoning_effort',
  'response_format',
  'safety_identifier',
  'seed',
  'service_tier',
  'stop',
  'store',
  'stream',
  'stream_options',
  'temperature',
  'tool_choice',
  'tools',
  'top_logprobs',
  'top_p',
  'user',
  'verbosity',
  'web_search_options',
]);
const OPENAI_COMPLETION_FIELDS = new Set([
  'model',
  'prompt',
  'best_of',
  'echo',
  'frequency_penalty',
  'logit_bias',
  'logprobs',
  'max_tokens',
  'n',
  'presence_penalty',
  'seed',
  'stop',
  'stream',
  'stream_options',
  'suffix',
  'temperature',
  'top_p',
  'user',
]);

const CREATED = 1_760_000_000;

interface VllmGeneration {
  serial: number;
  id: string;
  model: string;
  withIds: boolean;
  withLogprobs: boolean;
  asTokenIds: boolean;
  promptIds: number[];
  content: string | null;
  reasoning: string | null;
  toolCalls: { id: string; name: string; arguments: string }[];
  tokens: number[];
  tokenPieces: string[];
  finishReason: string;
  stopReason: string | null;
  includeUsage: boolean;
}

function usage(g: VllmGeneration) {
  return {
    prompt_tokens: g.promptIds.length,
    completion_tokens: g.tokens.length,
    total_tokens: g.promptIds.length + g.tokens.length,
    prompt_tokens_details: null,
  };
}

function lp(g: VllmGeneration, position: number) {
  const id = g.tokens[position];
  const token = g.asTokenIds ? `token_id:${id}` : g.tokenPieces[position];
  return { token, logprob: logprobOf(id, position), bytes: [...Buffer.from(token)], top_logprobs: [] };
}

function chatBody(g: VllmGeneration) {
  const message: Record<string, unknown> = {
    role: 'assistant',
    content: g.content,
    refusal: null,
    annotations: null,
    audio: null,
    function_call: null,
    reasoning: g.reasoning,
  };
  if (g.toolCalls.length > 0) message.tool_calls = g.toolCalls.map((t) => ({ id: t.id, type: 'function', function: { name: t.name, arguments: t.arguments } }));
  const choice: Record<string, unknown> = {
    index: 0,
    message,
    logprobs: g.withLogprobs ? { content: g.tokens.map((_, i) => lp(g, i)) } : null,
    finish_reason: g.finishReason,
    stop_reason: g.stopReason,
  };
  if (g.withIds) choice.token_ids = g.tokens;
  const body: Record<string, unknown> = {
    id: g.id,
    object: 'chat.completion',
    created: CREATED,
    model: g.model,
    choices: [choice],
    service_tier: null,
    system_fingerprint: null,
    usage: usage(g),
    prompt_logprobs: null,
    kv_transfer_params: null,
  };
  if (g.withIds) body.prompt_token_ids = g.promptIds;
  return body;
}

/** vLLM's stream: a role chunk (with prompt ids), one delta per token group, a finish chunk, the usage chunk, `[DONE]`. */
function chatEvents(g: VllmGeneration): string[] {
  const deltas: Record<string, unknown>[] = [{ role: 'assistant', content: '' }];
  if (g.reasoning) for (const w of pieces(g.reasoning)) deltas.push({ reasoning: w });
  for (const w of pieces(g.content ?? '')) deltas.push({ content: w });
  g.toolCalls.forEach((t, j) => {
    const half = Math.ceil(t.arguments.length / 2);
    deltas.push({ tool_calls: [{ index: j, id: t.id, type: 'function', function: { name: t.name, arguments: '' } }] });
    deltas.push({ tool_calls: [{ index: j, function: { arguments: t.arguments.slice(0, half) } }] });
    deltas.push({ tool_calls: [{ index: j, function: { arguments: t.arguments.slice(half) } }] });
  });
  deltas.push({});
  // Token ids spread over the deltas after the role chunk; the finish chunk takes the rest.
  let next = 0;
  const events = deltas.map((delta, k) => {
    const last = k === deltas.length - 1;
    const take = k === 0 ? 0 : last ? g.tokens.length - next : Math.min(1, Math.max(0, g.tokens.length - 1 - next));
    const from = next;
    next += take;
    const choice: Record<string, unknown> = {
      index: 0,
      delta,
      logprobs: g.withLogprobs && take > 0 ? { content: Array.from({ length: take }, (_, i) => lp(g, from + i)) } : null,
      finish_reason: last ? g.finishReason : null,
      ...(last ? { stop_reason: g.stopReason } : {}),
    };
    if (g.withIds) choice.token_ids = g.tokens.slice(from, from + take);
    const chunk: Record<string, unknown> = { id: g.id, object: 'chat.completion.chunk', created: CREATED, model: g.model, choices: [choice] };
    if (k === 0 && g.withIds) chunk.prompt_token_ids = g.promptIds;
    return `data: ${JSON.stringify(chunk)}\n\n`;
  });
  if (g.includeUsage)
    events.push(`data: ${JSON.stringify({ id: g.id, object: 'chat.completion.chunk', created: CREATED, model: g.model, choices: [], usage: usage(g) })}\n\n`);
  events.push('data: [DONE]\n\n');
  return events;
}

function cannedNative(path: string, body: Record<string, unknown>) {
  const m = typeof body.model === 'string' ? body.model : 'fake-model';
  if (path === '/v1/messages') {
    return {
      id: 'msg_native',
      type: 'message',
      role: 'assistant',
      model: m,
      content: [{ type: 'text', text: 'native answer' }],
      stop_reason: 'end_turn',
      stop_sequence: null,
      usage: { input_tokens: 1, output_tokens: 2 },
    };
  }
  return {
    id: 'resp_native',
    object: 'response',
    created_at: CREATED,
    status: 'completed',
    model: m,
    output: [
      { type: 'message', id: 'msg_native', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'native answer', annotations: [] }] },
    ],
    usage: { input_tokens: 1, output_tokens: 2, total_tokens: 3, input_tokens_details: { cached_tokens: 0 }, output_tokens_details: { reasoning_tokens: 0 } },
  };
}

/** vLLM's error body: `{"error": {message, type, param, code}}` with the HTTP status as `code`. */
export function errorBody(message: string, type: string, code: number) {
  return { error: { message, type, param: null, code } };
}

/** The kept ids the lenient SGLang server reports for output token `p` (`id`): it first, then `keep - 1` others. */
export function sglangStandInMask(id: number, p: number, keep: number): number[] {
  const row = [id];
  for (let k = 1; k < keep; k++) row.push((id + 1000 * k + p) % 151_000);
  return row;
}

/** The expert the lenient SGLang server reports (see `sglangRouting`). */
export function sglangStandInExpert(position: number, token: number, layer: number, k: number): number {
  return (position * 31 + layer * 7 + k * 3 + token) % 200;
}

/** SGLang's routed experts for the first choice of `gen`: raw little-endian int32, base64. */
function sglangRows(shape: { layers: number; topK: number }, gen: Generation, startLen: unknown): string {
  const ids = [...gen.promptIds, ...gen.choices[0].tokens];
  const start = typeof startLen === 'number' ? startLen : 0;
  const rows = Math.max(0, ids.length - 1 - start);
  const out = Buffer.alloc(rows * shape.layers * shape.topK * 4);
  let at = 0;
  for (let p = start; p < start + rows; p++)
    for (let l = 0; l < shape.layers; l++)
      for (let k = 0; k < shape.topK; k++) {
        out.writeInt32LE(sglangStandInExpert(p, ids[p], l, k), at);
        at += 4;
      }
  return out.toString('base64');
}
