import { isObject, str, type Json } from '../json';
import { emptyChoice, intArray, toolCall, type Extracted } from './shape';
import { extend } from '../../model/extend';

/** Anthropic `/v1/messages`: `tool_use` content blocks are the tool calls. */
export function extractAnthropic(body: unknown): Extracted {
  const res = isObject(body) ? body : {};
  const choice = emptyChoice(0);
  choice.finishReason = str(res.stop_reason);
  choice.responseTokenIds = intArray(res.token_ids);
  const content = Array.isArray(res.content) ? res.content.filter(isObject) : [];
  for (const block of content) {
    if (block.type === 'tool_use') choice.toolCalls.push(toolCall(block.id, block.name, block.input ?? {}));
  }
  return {
    response: body,
    model: str(res.model),
    usage: res.usage ?? null,
    promptTokenIds: intArray(res.prompt_token_ids),
    choices: [choice],
    incomplete: false,
  };
}

/**
 * `message_start` … `message_stop`: blocks from `content_block_start`, text and
 * `input_json_delta` fragments appended, `message_delta` stop reason and usage merged.
 */
export function assembleAnthropicStream(events: { event: string; value: unknown }[]): Extracted {
  let message: Json = {};
  const blocks = new Map<number, Json>();
  const partialJson = new Map<number, string>();
  let stopped = false;
  for (const { event, value } of events) {
    if (!isObject(value)) continue;
    const type = str(value.type) ?? event;
    const index = typeof value.index === 'number' ? value.index : 0;
    if (type === 'message_start' && isObject(value.message)) {
      message = { ...value.message };
    } else if (type === 'content_block_start' && isObject(value.content_block)) {
      blocks.set(index, { ...value.content_block });
    } else if (type === 'content_block_delta' && isObject(value.delta)) {
      const block = blocks.get(index) ?? {};
      const d = value.delta;
      if (d.type === 'input_json_delta' && typeof d.partial_json === 'string') {
        partialJson.set(index, (partialJson.get(index) ?? '') + d.partial_json);
      } else {
        for (const key of ['text', 'thinking', 'signature'] as const) {
          if (typeof d[key] === 'string') block[key] = ((block[key] as string | undefined) ?? '') + d[key];
        }
      }
      blocks.set(index, block);
    } else if (type === 'message_delta') {
      if (isObject(value.delta)) Object.assign(message, value.delta);
      if (isObject(value.usage)) message.usage = extend(isObject(message.usage) ? message.usage : {}, value.usage);
    } else if (type === 'message_stop') {
      stopped = true;
    }
  }
  for (const [index, json] of partialJson) {
    const block = blocks.get(index);
    if (!block) continue;
    try {
      block.input = json === '' ? {} : JSON.parse(json);
    } catch {
      block.input = json;
    }
  }
  message.content = [...blocks.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
  const extracted = extractAnthropic(message);
  extracted.incomplete = !stopped;
  return extracted;
}
