import { appendTo, isObject, str, type Json } from '../json';
import { emptyChoice, intArray, logprobList, withEngineExtras, type Extracted } from './shape';
import { extend } from '../../model/extend';

/**
 * SGLang's native `/generate` (which only token-in calls): `{text, output_ids, meta_info}`, one
 * answer (`meta_info.finish_reason.type`, `output_token_logprobs` as `[logprob, id, text]`
 * triplets, and SGLang's extras: routing, weight versions, masks). Its prompt is not in the answer:
 * the extraction takes it from the request's `input_ids` (formats/extract.ts).
 */
export function extractSglangGenerate(body: unknown): Extracted {
  const res = isObject(body) ? body : {};
  const meta = isObject(res.meta_info) ? res.meta_info : {};
  const choice = emptyChoice(0);
  choice.finishReason = isObject(meta.finish_reason) ? str(meta.finish_reason.type) : null;
  choice.responseTokenIds = intArray(res.output_ids);
  choice.responseLogprobs = logprobList(meta.output_token_logprobs, (e) => (Array.isArray(e) ? e[0] : undefined));
  withEngineExtras(choice, { meta_info: meta }, {});
  const usage =
    typeof meta.prompt_tokens === 'number' && typeof meta.completion_tokens === 'number'
      ? { prompt_tokens: meta.prompt_tokens, completion_tokens: meta.completion_tokens, total_tokens: meta.prompt_tokens + meta.completion_tokens }
      : null;
  return { response: body, model: null, usage, promptTokenIds: null, choices: [choice], incomplete: false };
}

/**
 * A streamed `/generate` answer as one: events are cumulative by default (the text, `output_ids`
 * and logprobs so far; an event's ids are then as many as its `meta_info.completion_tokens`) or
 * incremental (`--incremental-streaming-output`: the new part); the last `meta_info` holds the
 * finish reason and the extras.
 */
export function assembleSglangGenerateStream(chunks: unknown[], done: boolean): Extracted {
  const whole = foldSglangGenerateStream(chunks);
  const extracted = extractSglangGenerate(whole);
  extracted.incomplete = !done && !isObject((whole.meta_info as Json).finish_reason);
  return extracted;
}

/** A streamed `/generate` answer's events as the one answer they add up to (`{text, output_ids, meta_info}`). */
export function foldSglangGenerateStream(chunks: unknown[]): Json {
  let text = '';
  let ids: number[] = [];
  let logprobs: unknown[] = [];
  let meta: Json = {};
  for (const chunk of chunks) {
    if (!isObject(chunk)) continue;
    const m = isObject(chunk.meta_info) ? chunk.meta_info : {};
    const more = Array.isArray(chunk.output_ids) ? (chunk.output_ids as number[]) : [];
    const lps = Array.isArray(m.output_token_logprobs) ? m.output_token_logprobs : [];
    const t = typeof chunk.text === 'string' ? chunk.text : '';
    const cumulative = typeof m.completion_tokens === 'number' && more.length === m.completion_tokens && more.length >= ids.length;
    if (cumulative) {
      ids = [...more];
      text = t;
      logprobs = [...lps];
    } else {
      appendTo(ids, more);
      text += t;
      appendTo(logprobs, lps);
    }
    for (const [k, v] of Object.entries(m)) if (v !== null && v !== undefined) meta[k] = v;
  }
  meta = extend(meta, { output_token_logprobs: logprobs });
  return { text, output_ids: ids, meta_info: meta };
}
