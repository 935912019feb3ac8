import { createHash } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { calculatorScript, type ReceivedRequest } from './fake-model-server';
import { buildCompletions, type Generation } from './fake-responses';
import { IM_END, logprobOf, pieces, renderAssistant, renderPrompt, tokenId, tokenize } from './fake-tokenizer';

/**
 * A model server that speaks only what vLLM speaks, for translation and detection tests:
 * `GET /v1/models` (`owned_by: "vllm"`), `GET /version`, `/v1/chat/completions` and
 * `/v1/completions` with `return_token_ids` (top-level `prompt_token_ids`, per-choice
 * `token_ids`; streamed: prompt ids in the first chunk, token ids per delta), logprobs, and
 * `message.reasoning` when the script reasons. `/v1/responses` and `/v1/messages` answer 404
 * unless switched on (real vLLM serves both, without token ids; off by default so that a test
 * proves the sidecar translated rather than passed through).
 *
 * `openaiLike: true` turns it into a plain OpenAI-compatible server: no `owned_by: vllm`, no
 * `/version`, and a 400 for any request field OpenAI does not know (as OpenAI answers
 * `Unrecognized request argument supplied: return_token_ids`).
 */
export interface VllmTurn {
  content?: string | null;
  /** Separated thinking, as vLLM returns it with a reasoning parser (`message.reasoning`). */
  reasoning?: string;
  /** `arguments` as an object is serialized; as a string it is sent verbatim (malformed JSON included). */
  toolCalls?: { name: string; arguments: Record<string, unknown> | string; id?: string }[];
  finishReason?: 'stop' | 'length' | 'tool_calls';
  /** vLLM's `stop_reason`: the stop string that ended generation. */
  stopReason?: string | null;
}

export type VllmFault =
  | { kind: 'status'; status: number; body: string; contentType?: string }
  /** A 200 answer whose body is not what the route promises. */
  | { kind: 'non-json'; body: string }
  /** Streams `afterChunks` chunks, then vLLM's in-stream error object and `[DONE]`. */
  | { kind: 'stream-error'; afterChunks: number; message: string }
  /** Streams `afterChunks` chunks, then drops the connection. */
  | { kind: 'reset-mid-stream'; afterChunks: number };

export interface VllmLikeServerOptions {
  openaiLike?: boolean;
  /** Serve `/v1/responses` or `/v1/messages` with a canned answer instead of 404. */
  routes?: { responses?: boolean; messages?: boolean };
  /** Decides the next turn; default: the calculator agent script. */
  script?: (req: ReceivedRequest) => VllmTurn;
  fault?: (req: ReceivedRequest) => VllmFault | null;
  model?: string;
  version?: string;
}

export interface VllmLikeServer {
  /** Base URL with `/v1`, as agents are configured. */
  url: string;
  origin: string;
  port: number;
  requests: ReceivedRequest[];
  close(): Promise<void>;
}

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

export async function startVllmLikeServer(options: VllmLikeServerOptions = {}): Promise<VllmLikeServer> {
  const requests: ReceivedRequest[] = [];
  const sockets = new Set<Socket>();
  const model = options.model ?? 'fake-model';
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
      requests.push(received);
      void answer(received, req, res).catch(() => res.destroy());
    });
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });

  async function answer(r: ReceivedRequest, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = r.path.split('?')[0];
    const fault = options.fault?.(r) ?? null;
    if (fault?.kind === 'status') return send(res, fault.status, fault.body, fault.contentType ?? 'application/json');
    if (fault?.kind === 'non-json') return send(res, 200, fault.body, 'text/html');
    if (r.method === 'GET' && path === '/v1/models') {
      const card = options.openaiLike
        ? { id: model, object: 'model', created: CREATED, owned_by: 'system' }
        : { id: model, object: 'model', created: CREATED, owned_by: 'vllm', root: model, parent: null, max_model_len: 32768, permission: [] };
      return sendJson(res, 200, { object: 'list', data: [card] });
    }
    if (r.method === 'GET' && path === '/version' && !options.openaiLike) return sendJson(res, 200, { version: options.version ?? '0.11.0' });
    const routed =
      r.method === 'POST' &&
      (path === '/v1/chat/completions' ||
        path === '/v1/completions' ||
        (path === '/v1/responses' && options.routes?.responses) ||
        (path === '/v1/messages' && options.routes?.messages));
    if (!routed) return sendJson(res, 404, notFound());
    if (!r.json) return sendJson(res, 400, errorBody('request body is not a JSON object', 'BadRequestError', 400));
    if (options.openaiLike) {
      const known = path === '/v1/completions' ? OPENAI_COMPLETION_FIELDS : OPENAI_CHAT_FIELDS;
      const unknown = Object.keys(r.json).find((k) => !known.has(k));
      if (unknown) {
        return sendJson(res, 400, {
          error: { message: `Unrecognized request argument supplied: ${unknown}`, type: 'invalid_request_error', param: null, code: null },
        });
      }
    }
    if (path === '/v1/responses' || path === '/v1/messages') return sendJson(res, 200, cannedNative(path, r.json));
    const turn = (options.script ?? (calculatorScript as (r: ReceivedRequest) => VllmTurn))(r);
    const g = generate(r, turn);
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
      if (!stream) return sendJson(res, 200, built.body);
      return streamEvents(req, res, built.events, fault);
    }
    if (!stream) return sendJson(res, 200, chatBody(g));
    return streamEvents(req, res, chatEvents(g), fault);
  }

  function generate(r: ReceivedRequest, turn: VllmTurn): Gen {
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
      withIds: !options.openaiLike && body.return_token_ids === true,
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
      includeUsage: body.stream !== true || (body.stream_options as { include_usage?: unknown } | undefined)?.include_usage === true,
    };
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    origin: `http://127.0.0.1:${port}`,
    port,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

interface Gen {
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

function usage(g: Gen) {
  return {
    prompt_tokens: g.promptIds.length,
    completion_tokens: g.tokens.length,
    total_tokens: g.promptIds.length + g.tokens.length,
    prompt_tokens_details: null,
  };
}

function lp(g: Gen, position: number) {
  const id = g.tokens[position];
  const token = g.asTokenIds ? `token_id:${id}` : g.tokenPieces[position];
  return { token, logprob: logprobOf(id, position), bytes: [...Buffer.from(token)], top_logprobs: [] };
}

function chatBody(g: Gen) {
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
function chatEvents(g: Gen): string[] {
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

async function streamEvents(req: IncomingMessage, res: ServerResponse, events: string[], fault: VllmFault | null): Promise<void> {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
  let n = 0;
  for (const event of events) {
    if (fault?.kind === 'reset-mid-stream' && n === fault.afterChunks) {
      req.socket.destroy();
      return;
    }
    if (fault?.kind === 'stream-error' && n === fault.afterChunks) {
      res.write(`data: ${JSON.stringify(errorBody(fault.message, 'InternalServerError', 500))}\n\n`);
      res.end('data: [DONE]\n\n');
      return;
    }
    // Waits until each event is handed to the socket, so a fault after it cannot discard it.
    await new Promise<void>((r) => res.write(event, () => r()));
    n++;
  }
  res.end();
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

/** FastAPI's answer for a route it does not have. */
function notFound() {
  return { detail: 'Not Found' };
}

function sendJson(res: ServerResponse, status: number, value: unknown): void {
  send(res, status, JSON.stringify(value), 'application/json');
}

function send(res: ServerResponse, status: number, text: string, contentType: string): void {
  const bytes = Buffer.from(text);
  res.writeHead(status, { 'content-type': contentType, 'content-length': bytes.length });
  res.end(bytes);
}
