import type { ChoiceCapture, TokenIds } from '../../model/records';
import { appendTo, intList, isObject, str, type Json } from '../json';
import { emptyChoice, intArray, logprobList, NONE_READ, toolCall, withEngineExtras, type Extracted, type ReadLogprobs } from './shape';
import { extend } from '../../model/extend';

/** `/v1/chat/completions`, non-streamed: OpenAI fields plus vLLM and SGLang token fields. */
export function extractChat(body: unknown, read: ReadLogprobs = NONE_READ): Extracted {
  const res = isObject(body) ? body : {};
  const choices = Array.isArray(res.choices) ? res.choices : [];
  return {
    response: body,
    model: str(res.model),
    usage: res.usage ?? null,
    promptTokenIds: intArray(res.prompt_token_ids),
    choices: choices.filter(isObject).map((c, i) => withEngineExtras(chatChoice(c, i, read), c, res)),
    incomplete: false,
  };
}

function chatChoice(c: Json, position: number, read: ReadLogprobs): ChoiceCapture {
  const choice = emptyChoice(typeof c.index === 'number' ? c.index : position);
  choice.finishReason = str(c.finish_reason);
  choice.responseTokenIds = intArray(c.token_ids);
  choice.promptTokenIds = intArray(c.prompt_token_ids);
  const readValues = typeof c.logprobs === 'string' ? read.get(c.logprobs) : undefined;
  if (readValues !== undefined) {
    choice.responseLogprobs = readValues;
  } else {
    const lp = isObject(c.logprobs) ? c.logprobs.content : undefined;
    choice.responseLogprobs = logprobList(lp, (e) => (isObject(e) ? e.logprob : undefined));
  }
  const msg = isObject(c.message) ? c.message : {};
  if (Array.isArray(msg.tool_calls)) {
    for (const tc of msg.tool_calls) {
      if (!isObject(tc)) continue;
      const fn = isObject(tc.function) ? tc.function : {};
      choice.toolCalls.push(toolCall(tc.id, fn.name, fn.arguments));
    }
  }
  return choice;
}

interface ChoiceAcc {
  index: number;
  message: Json;
  toolCalls: Map<number, Json>;
  finishReason: unknown;
  logprobs: unknown[] | null;
  tokenIds: number[] | null;
  promptTokenIds: TokenIds | null;
  extra: Json;
}

/**
 * Assembles `chat.completion.chunk` payloads into the non-streamed shape: content and other
 * string deltas concatenated, tool-call deltas merged by index, token-id and logprob deltas
 * appended, usage and vLLM's first-chunk `prompt_token_ids` kept.
 */
export function assembleChatStream(chunks: unknown[], done: boolean): Extracted {
  const accs = new Map<number, ChoiceAcc>();
  const top: Json = {};
  let usage: unknown = null;
  let promptTokenIds: TokenIds | null = null;
  for (const chunk of chunks) {
    if (!isObject(chunk)) continue;
    // Keys, not entries: no pair array per member of every chunk.
    for (const k of Object.keys(chunk)) {
      if (k === 'choices' || k === 'usage' || k === 'prompt_token_ids') continue;
      if (!(k in top)) top[k] = chunk[k];
    }
    if (chunk.usage !== undefined && chunk.usage !== null) usage = chunk.usage;
    if (promptTokenIds === null) promptTokenIds = intArray(chunk.prompt_token_ids);
    if (!Array.isArray(chunk.choices)) continue;
    for (const c of chunk.choices) {
      if (!isObject(c)) continue;
      const index = typeof c.index === 'number' ? c.index : 0;
      let acc = accs.get(index);
      if (!acc) {
        acc = { index, message: {}, toolCalls: new Map(), finishReason: null, logprobs: null, tokenIds: null, promptTokenIds: null, extra: {} };
        accs.set(index, acc);
      }
      mergeChoiceDelta(acc, c);
    }
  }
  const ordered = [...accs.values()].sort((a, b) => a.index - b.index);
  const response: Json = extend(top, {
    object: 'chat.completion',
    choices: ordered.map((a) => {
      const message: Json = { ...a.message };
      if (a.toolCalls.size > 0) message.tool_calls = [...a.toolCalls.entries()].sort((x, y) => x[0] - y[0]).map((e) => e[1]);
      const out: Json = { index: a.index, message, finish_reason: a.finishReason, ...a.extra };
      if (a.logprobs !== null) out.logprobs = { content: a.logprobs };
      if (a.tokenIds !== null) out.token_ids = a.tokenIds;
      if (a.promptTokenIds !== null) out.prompt_token_ids = a.promptTokenIds;
      return out;
    }),
    usage,
  });
  if (promptTokenIds !== null) response.prompt_token_ids = promptTokenIds;
  const extracted = extractChat(response);
  extracted.incomplete = !done && ordered.every((a) => a.finishReason === null);
  return extracted;
}

const MERGED_MEMBERS = new Set(['index', 'delta', 'finish_reason', 'token_ids', 'prompt_token_ids', 'logprobs']);

function mergeChoiceDelta(acc: ChoiceAcc, c: Json): void {
  if (c.finish_reason !== undefined && c.finish_reason !== null) acc.finishReason = c.finish_reason;
  // Appended in place: a stream of n chunks costs n appends, not n copies of what came before.
  const ids = intList(c.token_ids);
  if (ids) appendTo((acc.tokenIds ??= []), ids);
  const pids = intArray(c.prompt_token_ids);
  if (pids && acc.promptTokenIds === null) acc.promptTokenIds = pids;
  if (isObject(c.logprobs) && Array.isArray(c.logprobs.content)) appendTo((acc.logprobs ??= []), c.logprobs.content);
  for (const k of Object.keys(c)) {
    if (MERGED_MEMBERS.has(k)) continue;
    const v = c[k];
    if (v !== null && v !== undefined) acc.extra[k] = v;
  }
  const delta = isObject(c.delta) ? c.delta : {};
  for (const k of Object.keys(delta)) {
    const v = delta[k];
    if (k === 'tool_calls') {
      if (Array.isArray(v)) for (const tc of v) if (isObject(tc)) mergeToolCall(acc.toolCalls, tc);
    } else if (typeof v === 'string' && typeof acc.message[k] === 'string' && k !== 'role') {
      acc.message[k] = acc.message[k] + v;
    } else if (v !== null || !(k in acc.message)) {
      acc.message[k] = v;
    }
  }
}

function mergeToolCall(calls: Map<number, Json>, tc: Json): void {
  const index = typeof tc.index === 'number' ? tc.index : calls.size;
  const cur = calls.get(index) ?? { id: null, type: 'function', function: { name: '', arguments: '' } };
  if (typeof tc.id === 'string' && tc.id) cur.id = tc.id;
  if (typeof tc.type === 'string') cur.type = tc.type;
  const fn = isObject(tc.function) ? tc.function : {};
  const curFn = cur.function as Json;
  if (typeof fn.name === 'string') curFn.name = (curFn.name as string) + fn.name;
  if (typeof fn.arguments === 'string') curFn.arguments = (curFn.arguments as string) + fn.arguments;
  calls.set(index, cur);
}
