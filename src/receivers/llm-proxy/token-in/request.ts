import { hasImageParts } from '../../../formats/images';
import { canonicalJson, canonicalMessage, PrefixDigest } from './conversation';

/**
 * Which chat requests token-in serves, and the completions request it sends for one. A field it
 * does not know how to carry over makes the call go through as chat (the reason names the
 * field): an answer token-in could not give exactly as chat would is not given.
 */

/** Chat request fields carried over to the completions request as they are. */
const SAMPLING = [
  'temperature',
  'top_p',
  'top_k',
  'min_p',
  'presence_penalty',
  'frequency_penalty',
  'repetition_penalty',
  'seed',
  'stop',
  'stop_token_ids',
  'ignore_eos',
  'min_tokens',
  'logit_bias',
  'user',
];
/**
 * Chat request fields token-in handles itself, or that do not shape the answer (`store`,
 * `metadata`: OpenAI's bookkeeping, which SDKs and agent frameworks may send to any server).
 */
const HANDLED = new Set([
  'store',
  'metadata',
  'model',
  'messages',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'stream',
  'stream_options',
  'max_tokens',
  'max_completion_tokens',
  'n',
  'chat_template_kwargs',
  'logprobs',
  'return_token_ids',
]);

export interface TokenInRequest {
  chat: Record<string, unknown>;
  messages: unknown[];
  /** Canonical messages (see conversation.ts). */
  canonical: string[];
  /** Digest of what else shapes the rendering: model, tools, template arguments. */
  context: string;
  stream: boolean;
  /** The agent asked for a usage chunk at the end of its stream. */
  includeUsage: boolean;
  /** Tool calls are parsed out of the answer (tools given, tool_choice auto or absent). */
  parseTools: boolean;
  /** Thinking is on (the template's `enable_thinking` is not false). */
  thinking: boolean;
  /** The messages have image parts: only vLLM's render and generate routes take them (docs/images.md#token-in). */
  images: boolean;
}

/** The chat request as token-in takes it, or why not. */
export function readTokenInRequest(body: Buffer): TokenInRequest | { reason: string } {
  let chat: unknown;
  try {
    chat = JSON.parse(body.toString('utf8'));
  } catch {
    return { reason: 'not_json' };
  }
  if (!chat || typeof chat !== 'object' || Array.isArray(chat)) return { reason: 'not_json' };
  const c = chat as Record<string, unknown>;
  for (const key of Object.keys(c)) if (!HANDLED.has(key) && !SAMPLING.includes(key)) return { reason: `unsupported_field:${key}` };
  if (!Array.isArray(c.messages) || c.messages.length === 0) return { reason: 'no_messages' };
  if (c.n !== undefined && c.n !== 1) return { reason: 'n_above_1' };
  if (c.logprobs === true) return { reason: 'logprobs_requested' };
  const choice = c.tool_choice;
  if (choice !== undefined && choice !== 'auto' && choice !== 'none') return { reason: 'tool_choice' };
  if (c.tools !== undefined && !Array.isArray(c.tools)) return { reason: 'tools_not_a_list' };
  const kwargs = c.chat_template_kwargs;
  if (kwargs !== undefined && (typeof kwargs !== 'object' || kwargs === null)) return { reason: 'chat_template_kwargs' };
  const canonical = c.messages.map(canonicalMessage);
  const context = new PrefixDigest();
  context.add(canonicalJson([c.model ?? null, c.tools ?? null, kwargs ?? null]));
  const tools = Array.isArray(c.tools) && c.tools.length > 0;
  return {
    chat: c,
    messages: c.messages,
    canonical,
    context: context.peek(),
    stream: c.stream === true,
    includeUsage: (c.stream_options as { include_usage?: unknown } | undefined)?.include_usage === true,
    parseTools: tools && choice !== 'none',
    thinking: (kwargs as { enable_thinking?: unknown } | undefined)?.enable_thinking !== false,
    images: hasImageParts(c),
  };
}

/** The `/tokenize` request that renders the whole conversation with the server's template. */
export function tokenizeBody(r: TokenInRequest): Buffer {
  const c = r.chat;
  const body: Record<string, unknown> = { messages: r.messages, add_generation_prompt: true };
  if (c.model !== undefined) body.model = c.model;
  if (Array.isArray(c.tools) && c.tools.length > 0) body.tools = c.tools;
  if (c.chat_template_kwargs !== undefined) body.chat_template_kwargs = c.chat_template_kwargs;
  return Buffer.from(JSON.stringify(body));
}

/**
 * The `/v1/completions` request for a prompt of ids: the agent's sampling fields, its token
 * budget (the server's completions default is 16 tokens, chat's is the rest of the context, so
 * the rest of the context is asked for when the agent set none), token ids and logprobs back.
 */
export function completionsBody(r: TokenInRequest, prompt: Uint32Array, maxModelLen: number | null, keepSpecialTokens = false): Buffer {
  const c = r.chat;
  const out: Record<string, unknown> = {};
  if (c.model !== undefined) out.model = c.model;
  const budget = c.max_completion_tokens ?? c.max_tokens;
  if (budget !== undefined && budget !== null) out.max_tokens = budget;
  else if (maxModelLen !== null && maxModelLen > prompt.length) out.max_tokens = maxModelLen - prompt.length;
  for (const key of SAMPLING) if (c[key] !== undefined) out[key] = c[key];
  out.stream = r.stream;
  if (r.stream) out.stream_options = { include_usage: true };
  out.return_token_ids = true;
  out.logprobs = 0;
  // gpt-oss's harmony messages are told apart by special tokens the text leaves out by default.
  if (keepSpecialTokens) out.skip_special_tokens = false;
  // The ids last: the rest of the request stays readable at the head of the journaled body.
  return Buffer.from(`${JSON.stringify(out).slice(0, -1)},"prompt":[${prompt.join(',')}]}`);
}

/** vLLM's render route: a chat request rendered into the generate route's request (ids expanded, image features). */
export const VLLM_RENDER_PATH = '/v1/chat/completions/render';

/** The render request for a chat call with images: what `/tokenize` is asked (messages, tools, template arguments, the generation prompt). */
export const renderBody = (r: TokenInRequest): Buffer => tokenizeBody(r);

/** vLLM's token-in route (docs/token-in.md#vllms-generate-route). */
export const VLLM_GENERATE_PATH = '/inference/v1/generate';

/**
 * The same call for vLLM's `/inference/v1/generate`: the sampling fields in `sampling_params`
 * (vLLM `SamplingParams` names), the answer's text asked for (`output_mode: text`; the parsers read
 * it) beside the ids, and the prompt's ids echoed (`return_token_ids`) for the record.
 */
export function generateBody(
  r: TokenInRequest,
  prompt: Uint32Array,
  maxModelLen: number | null,
  keepSpecialTokens = false,
  features: Record<string, unknown> | null = null,
): Buffer {
  const c = r.chat;
  const params: Record<string, unknown> = {};
  const budget = c.max_completion_tokens ?? c.max_tokens;
  if (budget !== undefined && budget !== null) params.max_tokens = budget;
  else if (maxModelLen !== null && maxModelLen > prompt.length) params.max_tokens = maxModelLen - prompt.length;
  for (const key of SAMPLING) if (c[key] !== undefined && key !== 'user') params[key] = c[key];
  params.logprobs = 0;
  if (keepSpecialTokens) params.skip_special_tokens = false;
  const out: Record<string, unknown> = {};
  if (c.model !== undefined) out.model = c.model;
  out.sampling_params = params;
  out.stream = r.stream;
  if (r.stream) out.stream_options = { include_usage: true };
  out.return_token_ids = true;
  out.output_mode = 'text';
  // The images' processed data and where their placeholders are (the render route's, placed for this prompt).
  if (features !== null) out.features = features;
  return Buffer.from(`${JSON.stringify(out).slice(0, -1)},"token_ids":[${prompt.join(',')}]}`);
}
