import { appendTo, intList, isObject, str, type Json } from '../json';
import { emptyChoice, intArray, logprobList, toolCall, type Extracted } from './shape';
import { extend } from '../../model/extend';

/** OpenAI Responses API: `output[]` items; `function_call` items are the tool calls. */
export function extractResponses(body: unknown): Extracted {
  const res = isObject(body) ? body : {};
  const choice = emptyChoice(0);
  const output = Array.isArray(res.output) ? res.output.filter(isObject) : [];
  const logprobs: unknown[] = [];
  let tokenIds: number[] | null = null;
  for (const item of output) {
    if (item.type === 'function_call') choice.toolCalls.push(toolCall(item.call_id ?? item.id, item.name, item.arguments));
    if (item.type === 'message' && Array.isArray(item.content)) {
      for (const part of item.content) {
        if (isObject(part) && Array.isArray(part.logprobs)) appendTo(logprobs, part.logprobs);
      }
    }
    const ids = intList(item.token_ids);
    if (ids) appendTo((tokenIds ??= []), ids);
  }
  choice.responseTokenIds = tokenIds ?? intArray(res.token_ids) ?? intArray(res.output_token_ids);
  choice.responseLogprobs = logprobList(logprobs, (e) => (isObject(e) ? e.logprob : undefined));
  const status = str(res.status);
  const incompleteReason = isObject(res.incomplete_details) ? str(res.incomplete_details.reason) : null;
  choice.finishReason = incompleteReason ?? (choice.toolCalls.length > 0 ? 'tool_calls' : status === 'completed' ? 'stop' : status);
  return {
    response: body,
    model: str(res.model),
    usage: res.usage ?? null,
    promptTokenIds: intArray(res.prompt_token_ids) ?? intArray(res.input_token_ids),
    choices: [choice],
    incomplete: false,
  };
}

const TERMINAL = new Set(['response.completed', 'response.incomplete', 'response.failed']);

/**
 * A Responses stream: the terminal event (`response.completed` / `.incomplete` / `.failed`)
 * carries the whole response. Without one (a cut stream), the response is rebuilt from the
 * last `response` snapshot and the `response.output_item.done` items seen.
 */
export function assembleResponsesStream(events: { event: string; value: unknown }[]): Extracted {
  let snapshot: Json | null = null;
  const items: Json[] = [];
  for (const { event, value } of events) {
    if (!isObject(value)) continue;
    const type = str(value.type) ?? event;
    if (isObject(value.response)) {
      snapshot = value.response;
      if (TERMINAL.has(type)) return extractResponses(value.response);
    }
    if (type === 'response.output_item.done' && isObject(value.item)) items.push(value.item);
  }
  const rebuilt = extend(snapshot ?? {}, { output: items, status: 'incomplete' });
  const extracted = extractResponses(rebuilt);
  extracted.incomplete = true;
  return extracted;
}
