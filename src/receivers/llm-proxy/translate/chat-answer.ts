import { isObject, num, objects, str, type Json } from '../../../formats/json';

/** A tool call as the model made it; `arguments` is the raw text, valid JSON or not. */
export interface ChatToolCall {
  id: string | null;
  name: string;
  arguments: string;
}

export interface ChatUsage {
  promptTokens: number;
  completionTokens: number;
  cachedTokens: number;
}

/** The first choice of a chat completion, read defensively. */
export interface ChatAnswer {
  id: string | null;
  model: string | null;
  created: number | null;
  content: string;
  /** vLLM's `reasoning` (older: `reasoning_content`), SGLang's `reasoning_content`. */
  reasoning: string;
  toolCalls: ChatToolCall[];
  finishReason: string | null;
  /** vLLM: the stop string or token id that ended generation. */
  stopReason: string | number | null;
  usage: ChatUsage | null;
  /** `logprobs.content` entries, as the server sent them. */
  logprobs: Json[] | null;
  promptTokenCount: number | null;
  completionTokenCount: number | null;
}

/** Reads a chat completion body; null when it is not one (no `choices[0]`). */
export function readChatAnswer(body: unknown): ChatAnswer | null {
  if (!isObject(body)) return null;
  const choice = objects(body.choices).find((c) => (num(c.index) ?? 0) === 0);
  if (!choice) return null;
  const message = isObject(choice.message) ? choice.message : {};
  const promptIds = Array.isArray(body.prompt_token_ids) ? body.prompt_token_ids : Array.isArray(choice.prompt_token_ids) ? choice.prompt_token_ids : null;
  return {
    id: str(body.id),
    model: str(body.model),
    created: num(body.created),
    content: textOf(message.content),
    reasoning: str(message.reasoning) ?? str(message.reasoning_content) ?? '',
    toolCalls: objects(message.tool_calls).map((tc) => {
      const fn = isObject(tc.function) ? tc.function : {};
      return { id: str(tc.id) || null, name: str(fn.name) ?? '', arguments: argumentsText(fn.arguments) };
    }),
    finishReason: str(choice.finish_reason),
    stopReason: typeof choice.stop_reason === 'string' || typeof choice.stop_reason === 'number' ? choice.stop_reason : null,
    usage: readUsage(body.usage),
    logprobs: isObject(choice.logprobs) && Array.isArray(choice.logprobs.content) ? objects(choice.logprobs.content) : null,
    promptTokenCount: promptIds ? promptIds.length : null,
    completionTokenCount: Array.isArray(choice.token_ids) ? choice.token_ids.length : null,
  };
}

export function readUsage(v: unknown): ChatUsage | null {
  if (!isObject(v)) return null;
  const details = isObject(v.prompt_tokens_details) ? v.prompt_tokens_details : {};
  return { promptTokens: num(v.prompt_tokens) ?? 0, completionTokens: num(v.completion_tokens) ?? 0, cachedTokens: num(details.cached_tokens) ?? 0 };
}

/** Usage from the server, else counted from the token ids the sidecar asked for, else zeros. */
export function usageOrCounts(a: Pick<ChatAnswer, 'usage' | 'promptTokenCount' | 'completionTokenCount'>): ChatUsage {
  return a.usage ?? { promptTokens: a.promptTokenCount ?? 0, completionTokens: a.completionTokenCount ?? 0, cachedTokens: 0 };
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content))
    return objects(content)
      .map((p) => str(p.text) ?? '')
      .join('');
  return '';
}

/** Some servers send arguments as an object rather than a JSON string. */
function argumentsText(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === undefined || v === null) return '';
  return JSON.stringify(v);
}

/**
 * Parses tool arguments for APIs that need an object (Anthropic's `input`). Malformed JSON, or
 * JSON that is not an object, gives `{}` and `malformed: true`: the agent's SDK gets a valid
 * block, and the raw text stays in the recorded upstream answer.
 */
export function argumentsObject(raw: string): { input: Json; malformed: boolean } {
  if (raw.trim() === '') return { input: {}, malformed: false };
  try {
    const v: unknown = JSON.parse(raw);
    return isObject(v) ? { input: v, malformed: false } : { input: {}, malformed: true };
  } catch {
    return { input: {}, malformed: true };
  }
}

/** One streamed chat chunk, first choice only (Responses and Anthropic have no `n`). */
export interface ChatDelta {
  id: string | null;
  model: string | null;
  created: number | null;
  content: string;
  reasoning: string;
  toolCalls: { index: number; id: string | null; name: string | null; arguments: string }[];
  finishReason: string | null;
  stopReason: string | number | null;
  usage: ChatUsage | null;
  logprobs: Json[];
  promptTokenCount: number | null;
  tokenCount: number;
  /** An error object sent in the stream (vLLM, SGLang: `{"error": {...}}` or `{"object": "error", ...}`). */
  error: { message: string; type: string | null; code: unknown } | null;
}

export function readChatChunk(chunk: Json): ChatDelta {
  const error = streamError(chunk);
  const choice = objects(chunk.choices).find((c) => (num(c.index) ?? 0) === 0) ?? null;
  const delta = choice && isObject(choice.delta) ? choice.delta : {};
  const promptIds = Array.isArray(chunk.prompt_token_ids)
    ? chunk.prompt_token_ids
    : choice && Array.isArray(choice.prompt_token_ids)
      ? choice.prompt_token_ids
      : null;
  return {
    id: str(chunk.id),
    model: str(chunk.model),
    created: num(chunk.created),
    content: str(delta.content) ?? '',
    reasoning: str(delta.reasoning) ?? str(delta.reasoning_content) ?? '',
    toolCalls: objects(delta.tool_calls).map((tc, i) => {
      const fn = isObject(tc.function) ? tc.function : {};
      return { index: num(tc.index) ?? i, id: str(tc.id) || null, name: str(fn.name), arguments: argumentsText(fn.arguments) };
    }),
    finishReason: choice ? str(choice.finish_reason) : null,
    stopReason: choice && (typeof choice.stop_reason === 'string' || typeof choice.stop_reason === 'number') ? choice.stop_reason : null,
    usage: readUsage(chunk.usage),
    logprobs: choice && isObject(choice.logprobs) ? objects(choice.logprobs.content) : [],
    promptTokenCount: promptIds ? promptIds.length : null,
    tokenCount: choice && Array.isArray(choice.token_ids) ? choice.token_ids.length : 0,
    error,
  };
}

function streamError(chunk: Json): ChatDelta['error'] {
  if (isObject(chunk.error)) {
    return { message: str(chunk.error.message) ?? 'upstream error', type: str(chunk.error.type), code: chunk.error.code ?? null };
  }
  if (chunk.object === 'error') return { message: str(chunk.message) ?? 'upstream error', type: str(chunk.type), code: chunk.code ?? null };
  return null;
}
