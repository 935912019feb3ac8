import type { ChoiceCapture } from '../../model/records';
import { appendTo, intList, isObject, str, type Json } from '../json';
import { emptyChoice, intArray, logprobList, withEngineExtras, type Extracted } from './shape';
import { extend } from '../../model/extend';

/**
 * Legacy `/v1/completions`: `text`, `logprobs.token_logprobs`, and vLLM/SGLang per-choice token ids.
 * vLLM's token-in route `/inference/v1/generate` answers in the same shape (`choices[].token_ids`,
 * `text`, `finish_reason`, a top-level `prompt_token_ids`) but for its logprobs, a `content` list
 * with a `logprob` per token; both are read here.
 */
export function extractCompletions(body: unknown): Extracted {
  const res = isObject(body) ? body : {};
  const choices = Array.isArray(res.choices) ? res.choices.filter(isObject) : [];
  const mapped = choices.map((c, i) => withEngineExtras(completionChoice(c, i), c, res));
  return {
    response: body,
    model: str(res.model),
    usage: res.usage ?? null,
    promptTokenIds: intArray(res.prompt_token_ids) ?? mapped[0]?.promptTokenIds ?? null,
    choices: mapped,
    incomplete: false,
  };
}

function completionChoice(c: Json, position: number): ChoiceCapture {
  const choice = emptyChoice(typeof c.index === 'number' ? c.index : position);
  choice.finishReason = str(c.finish_reason);
  choice.responseTokenIds = intArray(c.token_ids);
  choice.promptTokenIds = intArray(c.prompt_token_ids);
  if (isObject(c.logprobs) && Array.isArray(c.logprobs.content))
    choice.responseLogprobs = logprobList(c.logprobs.content, (e) => (isObject(e) ? e.logprob : undefined));
  else choice.responseLogprobs = logprobList(isObject(c.logprobs) ? c.logprobs.token_logprobs : undefined, (v) => v);
  return choice;
}

const MERGED = new Set(['index', 'text', 'finish_reason', 'token_ids', 'prompt_token_ids', 'logprobs']);

/** Assembles completion stream chunks: text, token ids and `token_logprobs` appended per choice. */
export function assembleCompletionsStream(chunks: unknown[], done: boolean): Extracted {
  const whole = foldCompletionsStream(chunks);
  const extracted = extractCompletions(whole);
  extracted.incomplete = !done && (whole.choices as Json[]).every((a) => a.finish_reason === null);
  return extracted;
}

/** Completion stream chunks as the one answer they add up to (the whole answer's shape). */
export function foldCompletionsStream(chunks: unknown[]): Json {
  const top: Json = {};
  const accs = new Map<number, Json>();
  let usage: unknown = null;
  for (const chunk of chunks) {
    if (!isObject(chunk)) continue;
    for (const [k, v] of Object.entries(chunk)) if (k !== 'choices' && k !== 'usage' && !(k in top)) top[k] = v;
    if (chunk.usage !== undefined && chunk.usage !== null) usage = chunk.usage;
    if (!Array.isArray(chunk.choices)) continue;
    for (const c of chunk.choices) {
      if (!isObject(c)) continue;
      const index = typeof c.index === 'number' ? c.index : 0;
      const acc = accs.get(index) ?? { index, text: '', finish_reason: null };
      if (typeof c.text === 'string') acc.text = (acc.text as string) + c.text;
      if (c.finish_reason !== undefined && c.finish_reason !== null) acc.finish_reason = c.finish_reason;
      const ids = intList(c.token_ids);
      if (ids) appendTo((acc.token_ids ??= []) as number[], ids);
      const pids = intArray(c.prompt_token_ids);
      if (pids && acc.prompt_token_ids === undefined) acc.prompt_token_ids = pids;
      if (isObject(c.logprobs)) {
        const prev = isObject(acc.logprobs) ? acc.logprobs : Array.isArray(c.logprobs.content) ? { content: [] } : { tokens: [], token_logprobs: [] };
        for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset', 'content'] as const) {
          const more = c.logprobs[key];
          if (Array.isArray(more)) appendTo((prev[key] ??= []) as unknown[], more);
        }
        acc.logprobs = prev;
      }
      // What an engine puts on a choice's last chunk (weight versions, routing, masks) is kept as it came.
      for (const [k, v] of Object.entries(c)) if (!MERGED.has(k) && v !== null && v !== undefined) acc[k] = v;
      accs.set(index, acc);
    }
  }
  const ordered = [...accs.values()].sort((a, b) => (a.index as number) - (b.index as number));
  return extend(top, { choices: ordered, usage });
}
