import { isObject, isSet, num, str, type Json } from '../../../formats/json';
import { seedOf } from './ids';

/** What the answer's translation needs from the agent's Messages request. */
export interface AnthropicContext {
  model: string | null;
  /** To tell `stop_sequence` from `end_turn`: vLLM names the stop string that ended generation. */
  stopSequences: string[];
  stream: boolean;
  idSeed: string;
}

export type AnthropicRequestTranslation = { ok: true; chat: Json; context: AnthropicContext } | { ok: false; reason: string };

class Unmappable extends Error {
  constructor(readonly reason: string) {
    super(reason);
  }
}

/** Fields dropped on purpose: none changes what the model is asked to generate. */
const HARMLESS = new Set([
  'metadata', // `user_id`, for Anthropic's abuse detection
  'service_tier',
  'cache_control', // prompt caching is the server's business (vLLM caches prefixes by itself)
  'inference_geo',
  'speed',
]);

const MAPPED = new Set([
  'model',
  'messages',
  'system',
  'max_tokens',
  'temperature',
  'top_p',
  'top_k',
  'stop_sequences',
  'stream',
  'tools',
  'tool_choice',
  'thinking',
  'output_config',
]);

const EFFORTS = new Set(['low', 'medium', 'high']);

/**
 * Translates an Anthropic Messages request into a chat-completions request when everything it
 * asks for has a chat equivalent; otherwise says why not (`thinking`, `server_tool:web_search_20250305`,
 * `content_block:document`, …) and the request should pass through untouched.
 *
 * Mapping: `system` (string or text blocks, joined by a newline) → a system message; `tool_use`
 * blocks → assistant `tool_calls` with the block's id as the call id; `tool_result` blocks →
 * `tool` messages placed before the rest of their user turn (`is_error` has no chat field and is
 * dropped); images (base64 or URL) → `image_url` parts; `tools[].input_schema` → function
 * `parameters`; `tool_choice` any → required, tool → named function, `disable_parallel_tool_use`
 * → `parallel_tool_calls: false`; `stop_sequences` → `stop`; `top_k` passes (vLLM and SGLang
 * accept it); `output_config.format` → `response_format`, `output_config.effort` low/medium/high
 * → `reasoning_effort`. Extended thinking (`thinking` enabled, thinking blocks) is refused: the
 * Messages API ties it to signatures the chat API cannot produce.
 */
export function anthropicToChatRequest(body: unknown): AnthropicRequestTranslation {
  try {
    return translate(body);
  } catch (err) {
    if (err instanceof Unmappable) return { ok: false, reason: err.reason };
    throw err;
  }
}

function translate(body: unknown): AnthropicRequestTranslation {
  if (!isObject(body)) return { ok: false, reason: 'not_json_object' };
  for (const [key, value] of Object.entries(body)) {
    if (!isSet(value) || HARMLESS.has(key) || MAPPED.has(key)) continue;
    throw new Unmappable(
      key === 'container' || key === 'mcp_servers' || key === 'context_management' || key === 'diagnostics' ? key : `unsupported_field:${key}`,
    );
  }
  if (isSet(body.thinking) && !(isObject(body.thinking) && body.thinking.type === 'disabled')) throw new Unmappable('thinking');

  const chat: Json = {};
  if (isSet(body.model)) chat.model = body.model;
  const messages: Json[] = [];
  if (isSet(body.system)) messages.push({ role: 'system', content: systemText(body.system) });
  if (!Array.isArray(body.messages)) throw new Unmappable('messages');
  for (const m of body.messages) messages.push(...messagesOf(m));
  chat.messages = messages;

  for (const key of ['max_tokens', 'temperature', 'top_p', 'top_k'] as const) {
    if (!isSet(body[key])) continue;
    if (num(body[key]) === null) throw new Unmappable(key);
    chat[key] = body[key];
  }
  const stopSequences: string[] = [];
  if (isSet(body.stop_sequences)) {
    if (!Array.isArray(body.stop_sequences) || !body.stop_sequences.every((s) => typeof s === 'string')) throw new Unmappable('stop_sequences');
    stopSequences.push(...body.stop_sequences);
    if (stopSequences.length > 0) chat.stop = stopSequences;
  }
  const tools = isSet(body.tools) ? toolsOf(body.tools) : [];
  if (tools.length > 0) chat.tools = tools;
  if (isSet(body.tool_choice)) Object.assign(chat, toolChoiceOf(body.tool_choice, tools.length > 0));
  if (isSet(body.output_config)) Object.assign(chat, outputConfigOf(body.output_config));

  const stream = body.stream === true;
  if (stream) {
    chat.stream = true;
    chat.stream_options = { include_usage: true };
  }
  return { ok: true, chat, context: { model: str(body.model), stopSequences, stream, idSeed: seedOf(body) } };
}

function systemText(system: unknown): string {
  if (typeof system === 'string') return system;
  if (!Array.isArray(system)) throw new Unmappable('system');
  return system
    .map((b) => {
      if (!isObject(b) || b.type !== 'text') throw new Unmappable(`system_block:${isObject(b) ? String(b.type) : typeof b}`);
      return str(b.text) ?? '';
    })
    .join('\n');
}

function messagesOf(m: unknown): Json[] {
  if (!isObject(m)) throw new Unmappable('message');
  const role = m.role;
  if (role !== 'user' && role !== 'assistant') throw new Unmappable(`message_role:${String(role)}`);
  if (typeof m.content === 'string') return [{ role, content: m.content }];
  if (!Array.isArray(m.content)) throw new Unmappable('message_content');
  return role === 'user' ? userMessages(m.content) : [assistantMessage(m.content)];
}

/** Tool results become `tool` messages, which chat templates expect right after the assistant's calls. */
function userMessages(blocks: unknown[]): Json[] {
  const toolMessages: Json[] = [];
  const parts: Json[] = [];
  for (const b of blocks) {
    if (!isObject(b)) throw new Unmappable('content_block');
    if (b.type === 'tool_result') {
      const id = str(b.tool_use_id);
      if (!id) throw new Unmappable('content_block:tool_result');
      toolMessages.push({ role: 'tool', tool_call_id: id, content: toolResultText(b.content) });
    } else if (b.type === 'text') parts.push({ type: 'text', text: str(b.text) ?? '' });
    else if (b.type === 'image') parts.push(imagePart(b.source));
    else throw new Unmappable(`content_block:${String(b.type)}`);
  }
  if (parts.length === 0) return toolMessages;
  const content = parts.every((p) => p.type === 'text') ? parts.map((p) => p.text as string).join('') : parts;
  return [...toolMessages, { role: 'user', content }];
}

function assistantMessage(blocks: unknown[]): Json {
  let text: string | null = null;
  const toolCalls: Json[] = [];
  for (const b of blocks) {
    if (!isObject(b)) throw new Unmappable('content_block');
    if (b.type === 'text') text = (text ?? '') + (str(b.text) ?? '');
    else if (b.type === 'tool_use') {
      const id = str(b.id);
      const name = str(b.name);
      if (!id || name === null) throw new Unmappable('content_block:tool_use');
      toolCalls.push({ id, type: 'function', function: { name, arguments: JSON.stringify(isSet(b.input) ? b.input : {}) } });
    } else if (b.type === 'thinking' || b.type === 'redacted_thinking') throw new Unmappable('thinking');
    else throw new Unmappable(`content_block:${String(b.type)}`);
  }
  const m: Json = { role: 'assistant', content: text };
  if (toolCalls.length > 0) m.tool_calls = toolCalls;
  return m;
}

function toolResultText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!isSet(content)) return '';
  if (!Array.isArray(content)) throw new Unmappable('tool_result_content');
  return content
    .map((b) => {
      if (isObject(b) && b.type === 'text') return str(b.text) ?? '';
      throw new Unmappable(`tool_result_block:${isObject(b) ? String(b.type) : typeof b}`);
    })
    .join('');
}

function imagePart(source: unknown): Json {
  if (isObject(source) && source.type === 'base64' && typeof source.media_type === 'string' && typeof source.data === 'string') {
    return { type: 'image_url', image_url: { url: `data:${source.media_type};base64,${source.data}` } };
  }
  if (isObject(source) && source.type === 'url' && typeof source.url === 'string') return { type: 'image_url', image_url: { url: source.url } };
  throw new Unmappable(`image_source:${isObject(source) ? String(source.type) : typeof source}`);
}

function toolsOf(tools: unknown): Json[] {
  if (!Array.isArray(tools)) throw new Unmappable('tools');
  return tools.map((t) => {
    if (!isObject(t)) throw new Unmappable('tools');
    // Client tools have no type (or `custom`); every other type is a tool Anthropic runs itself.
    if (isSet(t.type) && t.type !== 'custom') throw new Unmappable(`server_tool:${String(t.type)}`);
    const name = str(t.name);
    if (!name || !isObject(t.input_schema)) throw new Unmappable('tools');
    const fn: Json = { name, parameters: t.input_schema };
    if (typeof t.description === 'string') fn.description = t.description;
    if (typeof t.strict === 'boolean') fn.strict = t.strict;
    return { type: 'function', function: fn };
  });
}

function toolChoiceOf(choice: unknown, hasTools: boolean): Json {
  if (!isObject(choice)) throw new Unmappable('tool_choice');
  const out: Json = {};
  if (choice.type === 'auto') out.tool_choice = 'auto';
  else if (choice.type === 'any') out.tool_choice = 'required';
  else if (choice.type === 'none') out.tool_choice = 'none';
  else if (choice.type === 'tool' && typeof choice.name === 'string') out.tool_choice = { type: 'function', function: { name: choice.name } };
  else throw new Unmappable(`tool_choice:${String(choice.type)}`);
  if (choice.disable_parallel_tool_use === true && hasTools) out.parallel_tool_calls = false;
  return out;
}

function outputConfigOf(config: unknown): Json {
  if (!isObject(config)) throw new Unmappable('output_config');
  const out: Json = {};
  for (const [key, value] of Object.entries(config)) {
    if (!isSet(value)) continue;
    if (key === 'format') {
      if (!isObject(value) || value.type !== 'json_schema' || !isObject(value.schema)) throw new Unmappable('output_config.format');
      out.response_format = { type: 'json_schema', json_schema: { name: 'output', schema: value.schema } };
    } else if (key === 'effort') {
      if (typeof value === 'string' && EFFORTS.has(value)) out.reasoning_effort = value;
    } else throw new Unmappable(`output_config.${key}`);
  }
  return out;
}
