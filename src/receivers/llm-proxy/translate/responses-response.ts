import { readChatAnswer, usageOrCounts, type ChatToolCall, type ChatUsage } from './chat-answer';
import type { ResponsesContext } from './responses-request';
import { isObject, num, objects, str, type Json } from '../../../formats/json';
import { idBase } from './ids';

export type ResponsesAnswerTranslation = { ok: true; response: Json; notes: string[] } | { ok: false; reason: string };

/** Ids derived from the chat completion id, so translating the same answer twice gives the same ids. */
export function responsesIds(upstreamId: unknown, seed: string) {
  const base = idBase(upstreamId, seed);
  return {
    response: `resp_${base}`,
    message: (outputIndex: number) => `msg_${base}_${outputIndex}`,
    reasoning: (outputIndex: number) => `rs_${base}_${outputIndex}`,
    functionCall: (outputIndex: number) => `fc_${base}_${outputIndex}`,
    /** Used only when the server gave a tool call no id; otherwise `call_id` is the chat tool call's id. */
    callId: (toolIndex: number) => `call_${base}_${toolIndex}`,
  };
}

export interface ResponseShell {
  id: string;
  createdAt: number;
  model: string | null;
  status: 'in_progress' | 'completed' | 'incomplete' | 'failed';
  output: Json[];
  usage: ChatUsage | null;
  incompleteReason?: string | null;
  error?: { code: string; message: string } | null;
}

/** The Responses `response` object, echoing the request's parameters as OpenAI does. */
export function responseObject(shell: ResponseShell, ctx: ResponsesContext): Json {
  return {
    id: shell.id,
    object: 'response',
    created_at: shell.createdAt,
    status: shell.status,
    background: false,
    error: shell.error ?? null,
    incomplete_details: shell.incompleteReason ? { reason: shell.incompleteReason } : null,
    instructions: ctx.instructions,
    max_output_tokens: ctx.maxOutputTokens,
    metadata: ctx.metadata,
    model: shell.model ?? ctx.model ?? '',
    output: shell.output,
    parallel_tool_calls: ctx.parallelToolCalls,
    previous_response_id: null,
    reasoning: ctx.reasoning,
    service_tier: 'default',
    store: ctx.store,
    temperature: ctx.temperature,
    text: ctx.text,
    tool_choice: ctx.toolChoice,
    tools: ctx.tools,
    top_logprobs: ctx.topLogprobs,
    top_p: ctx.topP,
    truncation: 'disabled',
    usage: shell.usage ? usageObject(shell.usage) : null,
    user: ctx.user,
  };
}

export function usageObject(u: ChatUsage): Json {
  return {
    input_tokens: u.promptTokens,
    input_tokens_details: { cached_tokens: u.cachedTokens },
    output_tokens: u.completionTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u.promptTokens + u.completionTokens,
  };
}

/** `length` → incomplete (max_output_tokens), `content_filter` → incomplete, anything else → completed. */
export function statusOf(finishReason: string | null): { status: 'completed' | 'incomplete'; incompleteReason: string | null } {
  if (finishReason === 'length') return { status: 'incomplete', incompleteReason: 'max_output_tokens' };
  if (finishReason === 'content_filter') return { status: 'incomplete', incompleteReason: 'content_filter' };
  return { status: 'completed', incompleteReason: null };
}

/** Chat `logprobs.content` entries as Responses `output_text.logprobs`. */
export function logprobsOf(entries: Json[]): Json[] {
  return entries.map((e) => ({
    token: str(e.token) ?? '',
    logprob: num(e.logprob) ?? 0,
    bytes: Array.isArray(e.bytes) ? e.bytes : [],
    top_logprobs: objects(e.top_logprobs).map((t) => ({
      token: str(t.token) ?? '',
      logprob: num(t.logprob) ?? 0,
      bytes: Array.isArray(t.bytes) ? t.bytes : [],
    })),
  }));
}

export function reasoningItem(id: string, text: string, status: 'in_progress' | 'completed'): Json {
  return { type: 'reasoning', id, summary: [], content: status === 'completed' ? [{ type: 'reasoning_text', text }] : [], status };
}

export function messageItem(id: string, text: string, logprobs: Json[] | null, status: 'in_progress' | 'completed'): Json {
  return { type: 'message', id, status, role: 'assistant', content: status === 'completed' ? [outputTextPart(text, logprobs)] : [] };
}

export function outputTextPart(text: string, logprobs: Json[] | null): Json {
  return { type: 'output_text', text, annotations: [], ...(logprobs ? { logprobs } : {}) };
}

export function functionCallItem(id: string, call: ChatToolCall, callId: string, status: 'in_progress' | 'completed'): Json {
  return { type: 'function_call', id, call_id: callId, name: call.name, arguments: status === 'completed' ? call.arguments : '', status };
}

/**
 * Translates a chat completion into a Responses API `response`: reasoning (when the server
 * separated it) as a `reasoning` item, the text as a `message` item, each tool call as a
 * `function_call` item whose `call_id` is the chat tool call's id, so the agent's next
 * `function_call_output` maps back to it. Malformed tool arguments pass through as the string
 * the model wrote (Responses carries arguments as text) and are noted.
 */
export function chatToResponsesResponse(chat: unknown, ctx: ResponsesContext): ResponsesAnswerTranslation {
  const a = readChatAnswer(chat);
  if (!a) return { ok: false, reason: 'upstream_not_chat_completion' };
  const ids = responsesIds(a.id, ctx.idSeed);
  const notes: string[] = [];
  const output: Json[] = [];
  if (a.reasoning !== '') output.push(reasoningItem(ids.reasoning(output.length), a.reasoning, 'completed'));
  if (a.content !== '' || a.toolCalls.length === 0) {
    output.push(messageItem(ids.message(output.length), a.content, ctx.includeLogprobs ? logprobsOf(a.logprobs ?? []) : null, 'completed'));
  }
  a.toolCalls.forEach((call, i) => {
    if (!validJson(call.arguments)) notes.push(`malformed_tool_arguments:${call.id ?? i}`);
    output.push(functionCallItem(ids.functionCall(output.length), call, call.id ?? ids.callId(i), 'completed'));
  });
  const { status, incompleteReason } = statusOf(a.finishReason);
  const response = responseObject(
    { id: ids.response, createdAt: a.created ?? 0, model: a.model, status, output, usage: usageOrCounts(a), incompleteReason },
    ctx,
  );
  return { ok: true, response, notes };
}

export function validJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/**
 * An upstream error answer (vLLM's `{"error": {...}}` or older `{"object": "error", ...}`, or
 * any text) in the OpenAI error shape the Responses SDK reads, keeping the upstream status.
 */
export function chatErrorToResponsesError(status: number, body: Buffer | string): { status: number; body: Json } {
  const e = upstreamError(body);
  return {
    status,
    body: { error: { message: e.message || `upstream answered ${status}`, type: e.type ?? openAiErrorType(status), param: e.param, code: e.code ?? null } },
  };
}

export function upstreamError(body: Buffer | string): { message: string; type: string | null; param: string | null; code: string | null } {
  const text = typeof body === 'string' ? body : body.toString('utf8');
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  const o = isObject(parsed) ? (isObject(parsed.error) ? parsed.error : parsed) : null;
  if (!o) return { message: text.slice(0, 2000).trim(), type: null, param: null, code: null };
  const code = typeof o.code === 'string' ? o.code : null;
  const message = str(o.message) ?? (typeof o.detail === 'string' ? o.detail : JSON.stringify(parsed).slice(0, 2000));
  return { message, type: str(o.type), param: str(o.param), code };
}

function openAiErrorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 429) return 'rate_limit_error';
  if (status >= 400 && status < 500) return 'invalid_request_error';
  return 'server_error';
}
