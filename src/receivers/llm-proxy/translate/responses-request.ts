import { isObject, isSet, num, objects, str, type Json } from '../../../formats/json';
import { seedOf } from './ids';
import { extend } from '../../../model/extend';

/** What the answer's translation needs from the agent's Responses request. */
export interface ResponsesContext {
  model: string | null;
  instructions: string | null;
  /** The request's tools in Responses shape, echoed in the response object as OpenAI does. */
  tools: Json[];
  toolChoice: unknown;
  parallelToolCalls: boolean;
  temperature: number | null;
  topP: number | null;
  maxOutputTokens: number | null;
  metadata: Json;
  text: Json;
  reasoning: Json;
  store: boolean;
  user: string | null;
  /** `include: ["message.output_text.logprobs"]`: the agent wants logprobs on output text. */
  includeLogprobs: boolean;
  topLogprobs: number | null;
  stream: boolean;
  /** Digest of the request: ids for an upstream answer that carries none. */
  idSeed: string;
}

export type ResponsesRequestTranslation = { ok: true; chat: Json; context: ResponsesContext } | { ok: false; reason: string };

class Unmappable extends Error {
  constructor(readonly reason: string) {
    super(reason);
  }
}

/** Fields dropped on purpose: none changes what the model is asked to generate. */
const HARMLESS = new Set([
  'metadata', // labels for the caller's dashboard
  'store', // where OpenAI would keep the response; nothing here reads it back (previous_response_id is refused)
  'service_tier',
  'safety_identifier',
  'prompt_cache_key',
  'prompt_cache_retention',
  'prompt_cache_options',
  'stream_options', // only `include_obfuscation`, which pads events for the public internet
  'max_tool_calls', // limits built-in tool calls, and built-in tools are refused
]);

const MAPPED = new Set([
  'model',
  'input',
  'instructions',
  'tools',
  'tool_choice',
  'temperature',
  'top_p',
  'max_output_tokens',
  'stream',
  'parallel_tool_calls',
  'text',
  'reasoning',
  'user',
  'top_logprobs',
  'include',
  'background',
  'truncation',
]);

/** `include` values that need nothing the translation cannot give. */
const INCLUDE_OK = new Set([
  'message.output_text.logprobs', // mapped to chat logprobs
  'reasoning.encrypted_content', // asks OpenAI to return encrypted reasoning for stateless replay; reasoning here is plain text and is replayed as such
]);

const REASONING_EFFORTS = new Set(['low', 'medium', 'high']);

/**
 * Translates an OpenAI Responses API request into a chat-completions request when everything it
 * asks for has a chat equivalent; otherwise says why not, as a short machine-readable reason
 * (`previous_response_id`, `builtin_tool:web_search`, `input_item:item_reference`, …) and the
 * request should pass through untouched.
 *
 * Decisions: `store` is harmless (only `previous_response_id`, which needs server-side state, is
 * refused); `developer` messages become `system`; `reasoning.effort` low/medium/high becomes
 * `reasoning_effort` and other efforts are dropped (older vLLM rejects them); `text.verbosity`
 * and `reasoning.summary` are dropped; reasoning items sent back become the next assistant
 * message's `reasoning` (vLLM's field for interleaved thinking). The chat request asks for no
 * token ids itself: the injector adds the server's fields.
 */
export function responsesToChatRequest(body: unknown): ResponsesRequestTranslation {
  try {
    return translate(body);
  } catch (err) {
    if (err instanceof Unmappable) return { ok: false, reason: err.reason };
    throw err;
  }
}

function translate(body: unknown): ResponsesRequestTranslation {
  if (!isObject(body)) return { ok: false, reason: 'not_json_object' };
  for (const [key, value] of Object.entries(body)) {
    if (!isSet(value) || HARMLESS.has(key) || MAPPED.has(key)) continue;
    throw new Unmappable(
      key === 'previous_response_id' || key === 'conversation' || key === 'prompt' || key === 'context_management' ? key : `unsupported_field:${key}`,
    );
  }
  if (body.background === true) throw new Unmappable('background');
  if (isSet(body.truncation) && body.truncation !== 'disabled') throw new Unmappable(`truncation:${String(body.truncation)}`);
  let includeLogprobs = false;
  if (isSet(body.include)) {
    if (!Array.isArray(body.include)) throw new Unmappable('include');
    for (const v of body.include) {
      if (typeof v !== 'string' || !INCLUDE_OK.has(v)) throw new Unmappable(`include:${String(v)}`);
      if (v === 'message.output_text.logprobs') includeLogprobs = true;
    }
  }

  const chat: Json = {};
  if (isSet(body.model)) chat.model = body.model;
  const instructions = isSet(body.instructions) ? str(body.instructions) : null;
  if (isSet(body.instructions) && instructions === null) throw new Unmappable('instructions');
  const messages: Json[] = instructions !== null ? [{ role: 'system', content: instructions }] : [];
  messages.push(...inputMessages(body.input));
  chat.messages = messages;

  const tools = isSet(body.tools) ? toolsOf(body.tools) : [];
  if (tools.length > 0) chat.tools = tools;
  if (isSet(body.tool_choice)) chat.tool_choice = toolChoiceOf(body.tool_choice);
  if (typeof body.parallel_tool_calls === 'boolean' && tools.length > 0) chat.parallel_tool_calls = body.parallel_tool_calls;
  for (const [from, to] of [
    ['temperature', 'temperature'],
    ['top_p', 'top_p'],
    ['max_output_tokens', 'max_tokens'],
    ['top_logprobs', 'top_logprobs'],
  ] as const) {
    if (!isSet(body[from])) continue;
    if (num(body[from]) === null) throw new Unmappable(from);
    chat[to] = body[from];
  }
  if (isSet(body.top_logprobs) && !includeLogprobs) delete chat.top_logprobs;
  if (includeLogprobs) chat.logprobs = true;
  if (isSet(body.user)) chat.user = body.user;

  const text = isObject(body.text) ? body.text : {};
  if (isSet(body.text) && !isObject(body.text)) throw new Unmappable('text');
  const responseFormat = responseFormatOf(text.format);
  if (responseFormat) chat.response_format = responseFormat;

  const reasoning = isObject(body.reasoning) ? body.reasoning : {};
  if (isSet(body.reasoning) && !isObject(body.reasoning)) throw new Unmappable('reasoning');
  if (typeof reasoning.effort === 'string' && REASONING_EFFORTS.has(reasoning.effort)) chat.reasoning_effort = reasoning.effort;

  const stream = body.stream === true;
  if (stream) {
    chat.stream = true;
    chat.stream_options = { include_usage: true };
  }
  return {
    ok: true,
    chat,
    context: {
      model: str(body.model),
      instructions,
      tools: objects(body.tools),
      toolChoice: isSet(body.tool_choice) ? body.tool_choice : 'auto',
      parallelToolCalls: body.parallel_tool_calls !== false,
      temperature: num(body.temperature),
      topP: num(body.top_p),
      maxOutputTokens: num(body.max_output_tokens),
      metadata: isObject(body.metadata) ? body.metadata : {},
      text: extend(text, { format: isObject(text.format) ? text.format : { type: 'text' } }),
      reasoning: { effort: str(reasoning.effort), summary: str(reasoning.summary) },
      store: body.store !== false,
      user: str(body.user),
      includeLogprobs,
      topLogprobs: num(body.top_logprobs),
      stream,
      idSeed: seedOf(body),
    },
  };
}

/** Builds chat messages from `input`, merging an assistant turn's text, reasoning and calls into one message. */
function inputMessages(input: unknown): Json[] {
  if (typeof input === 'string') return [{ role: 'user', content: input }];
  if (!isSet(input)) return [];
  if (!Array.isArray(input)) throw new Unmappable('input');
  const out: Json[] = [];
  let assistant: { content: string | null; reasoning: string | null; toolCalls: Json[] } | null = null;
  const flush = () => {
    if (!assistant) return;
    const m: Json = { role: 'assistant', content: assistant.content };
    if (assistant.reasoning !== null) m.reasoning = assistant.reasoning;
    if (assistant.toolCalls.length > 0) m.tool_calls = assistant.toolCalls;
    out.push(m);
    assistant = null;
  };
  for (const item of input) {
    if (!isObject(item)) throw new Unmappable('input_item');
    const type = str(item.type) ?? (isSet(item.role) ? 'message' : null);
    if (type === 'message') {
      const role = str(item.role);
      if (role === 'assistant') {
        const text = assistantText(item.content);
        if (assistant && (assistant.content !== null || assistant.toolCalls.length > 0)) flush();
        assistant ??= { content: null, reasoning: null, toolCalls: [] };
        assistant.content = text;
        continue;
      }
      flush();
      if (role === 'user') out.push({ role: 'user', content: userContent(item.content) });
      else if (role === 'system' || role === 'developer') out.push({ role: 'system', content: systemText(item.content) });
      else throw new Unmappable(`input_role:${String(role)}`);
    } else if (type === 'function_call') {
      const callId = str(item.call_id);
      const name = str(item.name);
      if (!callId || name === null) throw new Unmappable('input_item:function_call');
      assistant ??= { content: null, reasoning: null, toolCalls: [] };
      assistant.toolCalls.push({
        id: callId,
        type: 'function',
        function: { name, arguments: typeof item.arguments === 'string' ? item.arguments : JSON.stringify(item.arguments ?? {}) },
      });
    } else if (type === 'function_call_output') {
      const callId = str(item.call_id);
      if (!callId) throw new Unmappable('input_item:function_call_output');
      flush();
      out.push({ role: 'tool', tool_call_id: callId, content: toolOutputText(item.output) });
    } else if (type === 'reasoning') {
      const text = objects(item.content)
        .filter((p) => p.type === 'reasoning_text')
        .map((p) => str(p.text) ?? '')
        .join('');
      if (text === '' && isSet(item.encrypted_content)) throw new Unmappable('input_item:encrypted_reasoning');
      if (text === '') continue;
      if (assistant && (assistant.content !== null || assistant.toolCalls.length > 0)) flush();
      assistant ??= { content: null, reasoning: null, toolCalls: [] };
      assistant.reasoning = (assistant.reasoning ?? '') + text;
    } else {
      throw new Unmappable(`input_item:${String(type)}`);
    }
  }
  flush();
  return out;
}

function userContent(content: unknown): string | Json[] {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw new Unmappable('message_content');
  const parts: Json[] = [];
  for (const p of content) {
    if (!isObject(p)) throw new Unmappable('message_content');
    if (p.type === 'input_text' || p.type === 'output_text') parts.push({ type: 'text', text: str(p.text) ?? '' });
    else if (p.type === 'input_image') {
      const url = str(p.image_url);
      if (!url) throw new Unmappable('input_image:file_id');
      parts.push({ type: 'image_url', image_url: { url, ...(typeof p.detail === 'string' && p.detail !== 'auto' ? { detail: p.detail } : {}) } });
    } else throw new Unmappable(`content_part:${String(p.type)}`);
  }
  return parts.every((p) => p.type === 'text') ? parts.map((p) => p.text as string).join('') : parts;
}

function systemText(content: unknown): string {
  const c = userContent(content);
  if (typeof c !== 'string') throw new Unmappable('system_image');
  return c;
}

function assistantText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw new Unmappable('message_content');
  return content
    .map((p) => {
      if (!isObject(p)) throw new Unmappable('message_content');
      if (p.type === 'output_text' || p.type === 'input_text') return str(p.text) ?? '';
      if (p.type === 'refusal') return str(p.refusal) ?? '';
      throw new Unmappable(`content_part:${String(p.type)}`);
    })
    .join('');
}

function toolOutputText(output: unknown): string {
  if (typeof output === 'string') return output;
  if (Array.isArray(output)) {
    return output
      .map((p) => {
        if (isObject(p) && (p.type === 'input_text' || p.type === 'output_text')) return str(p.text) ?? '';
        throw new Unmappable(`tool_output_part:${isObject(p) ? String(p.type) : typeof p}`);
      })
      .join('');
  }
  if (!isSet(output)) return '';
  throw new Unmappable('tool_output');
}

function toolsOf(tools: unknown): Json[] {
  if (!Array.isArray(tools)) throw new Unmappable('tools');
  return tools.map((t) => {
    if (!isObject(t)) throw new Unmappable('tools');
    if (t.type !== 'function') throw new Unmappable(`builtin_tool:${String(t.type)}`);
    const name = str(t.name);
    if (!name) throw new Unmappable('tools');
    const fn: Json = { name };
    if (typeof t.description === 'string') fn.description = t.description;
    fn.parameters = isObject(t.parameters) ? t.parameters : { type: 'object', properties: {} };
    if (typeof t.strict === 'boolean') fn.strict = t.strict;
    return { type: 'function', function: fn };
  });
}

function toolChoiceOf(choice: unknown): unknown {
  if (choice === 'auto' || choice === 'none' || choice === 'required') return choice;
  if (isObject(choice) && choice.type === 'function' && typeof choice.name === 'string') return { type: 'function', function: { name: choice.name } };
  throw new Unmappable(`tool_choice:${isObject(choice) ? String(choice.type) : String(choice)}`);
}

function responseFormatOf(format: unknown): Json | null {
  if (!isSet(format)) return null;
  if (!isObject(format)) throw new Unmappable('text.format');
  if (format.type === 'text') return null;
  if (format.type === 'json_object') return { type: 'json_object' };
  if (format.type === 'json_schema' && isObject(format.schema)) {
    const schema: Json = { name: str(format.name) ?? 'output', schema: format.schema };
    if (typeof format.description === 'string') schema.description = format.description;
    if (typeof format.strict === 'boolean') schema.strict = format.strict;
    return { type: 'json_schema', json_schema: schema };
  }
  throw new Unmappable(`text.format:${String(format.type)}`);
}
