import { argumentsObject, readChatAnswer, usageOrCounts, type ChatUsage } from './chat-answer';
import type { AnthropicContext } from './anthropic-request';
import { upstreamError } from './responses-response';
import type { Json } from '../../../formats/json';
import { idBase } from './ids';

export type AnthropicAnswerTranslation = { ok: true; message: Json; notes: string[] } | { ok: false; reason: string };

export function anthropicMessageId(upstreamId: unknown, seed: string): string {
  return `msg_${idBase(upstreamId, seed)}`;
}

/**
 * Chat `finish_reason` → Anthropic `stop_reason`: stop → end_turn, or stop_sequence when vLLM's
 * `stop_reason` names one of the request's stop sequences; length → max_tokens; tool_calls →
 * tool_use (also when the server said stop but returned tool calls); content_filter → refusal.
 */
export function stopReasonOf(
  finishReason: string | null,
  stopReason: string | number | null,
  hasToolCalls: boolean,
  ctx: AnthropicContext,
): { stopReason: string; stopSequence: string | null } {
  if (finishReason === 'length') return { stopReason: 'max_tokens', stopSequence: null };
  if (finishReason === 'content_filter') return { stopReason: 'refusal', stopSequence: null };
  if (finishReason === 'tool_calls' || hasToolCalls) return { stopReason: 'tool_use', stopSequence: null };
  if (typeof stopReason === 'string' && ctx.stopSequences.includes(stopReason)) return { stopReason: 'stop_sequence', stopSequence: stopReason };
  return { stopReason: 'end_turn', stopSequence: null };
}

export function anthropicUsage(u: ChatUsage): Json {
  return {
    input_tokens: u.promptTokens,
    output_tokens: u.completionTokens,
    cache_creation_input_tokens: null,
    cache_read_input_tokens: u.cachedTokens > 0 ? u.cachedTokens : null,
    server_tool_use: null,
    service_tier: null,
  };
}

export function messageShell(id: string, model: string, content: Json[], stop: { stopReason: string | null; stopSequence: string | null }, usage: Json): Json {
  return {
    id,
    type: 'message',
    role: 'assistant',
    model,
    content,
    stop_reason: stop.stopReason,
    stop_sequence: stop.stopSequence,
    stop_details: null,
    container: null,
    usage,
  };
}

/**
 * Translates a chat completion into an Anthropic `message`: the text as a `text` block (an empty
 * one when the model said nothing and called nothing, so `content[0].text` works as with
 * Anthropic), each tool call as a `tool_use` block whose id is the chat tool call's id, so the
 * agent's next `tool_result` maps back. `input` must be an object: arguments that are not a JSON
 * object become `{}`, noted as `malformed_tool_arguments:<id>`; the raw text stays in the
 * recorded upstream answer. Reasoning the server separated is not shown to the agent (thinking
 * blocks need signatures), but its tokens are in the recorded token ids.
 */
export function chatToAnthropicResponse(chat: unknown, ctx: AnthropicContext): AnthropicAnswerTranslation {
  const a = readChatAnswer(chat);
  if (!a) return { ok: false, reason: 'upstream_not_chat_completion' };
  const notes: string[] = [];
  const content: Json[] = [];
  if (a.content !== '' || a.toolCalls.length === 0) content.push({ type: 'text', text: a.content });
  const base = idBase(a.id, ctx.idSeed);
  a.toolCalls.forEach((call, i) => {
    const id = call.id ?? `toolu_${base}_${i}`;
    const { input, malformed } = argumentsObject(call.arguments);
    if (malformed) notes.push(`malformed_tool_arguments:${id}`);
    content.push({ type: 'tool_use', id, name: call.name, input });
  });
  const stop = stopReasonOf(a.finishReason, a.stopReason, a.toolCalls.length > 0, ctx);
  const message = messageShell(anthropicMessageId(a.id, ctx.idSeed), a.model ?? ctx.model ?? '', content, stop, anthropicUsage(usageOrCounts(a)));
  return { ok: true, message, notes };
}

/** An upstream error answer in Anthropic's `{"type": "error", "error": {type, message}}` shape, keeping the status. */
export function chatErrorToAnthropicError(status: number, body: Buffer | string): { status: number; body: Json } {
  const e = upstreamError(body);
  return { status, body: { type: 'error', error: { type: anthropicErrorType(status), message: e.message || `upstream answered ${status}` } } };
}

export function anthropicErrorType(status: number): string {
  if (status === 400 || status === 422) return 'invalid_request_error';
  if (status === 401) return 'authentication_error';
  if (status === 402) return 'billing_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 408 || status === 504) return 'timeout_error';
  if (status === 413) return 'request_too_large';
  if (status === 429) return 'rate_limit_error';
  if (status === 503 || status === 529) return 'overloaded_error';
  return 'api_error';
}
