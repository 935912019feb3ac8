import { foldCompletionsStream } from '../../../formats/adapters/completions';
import { foldSglangGenerateStream } from '../../../formats/adapters/sglang-generate';
import { isObject, type Json } from '../../../formats/json';
import { sseJsonPayloads } from '../../../formats/sse';
import type { TokenInRequest } from './request';
import { extend } from '../../../model/extend';

/**
 * A token-in call the engine aborted (a weight update, a pause) is sent again with the ids sampled
 * so far appended to its prompt and the rest of its token budget (docs/token-in.md#aborted-calls).
 * The record is one answer: the attempts' answers merged here into the route's own shape, so the
 * extraction reads it as it reads any answer of that route.
 */

/** The routes token-in calls, by the shape of their answers. */
export type TokenInRoute = 'completions' | 'generate' | 'sglang.generate';

/** One attempt's answer in its whole (not streamed) shape, from the bytes journaled of it. */
export function attemptAnswer(route: TokenInRoute, bytes: Buffer[], streamed: boolean): Json | null {
  const text = Buffer.concat(bytes).toString('utf8');
  if (!streamed) {
    try {
      const v = JSON.parse(text) as unknown;
      return isObject(v) ? v : null;
    } catch {
      return null;
    }
  }
  const values = sseJsonPayloads(text).payloads.map((p) => p.value);
  return route === 'sglang.generate' ? foldSglangGenerateStream(values) : foldCompletionsStream(values);
}

/** The attempts' answers as one answer of the route (each attempt continued the one before). */
export function mergeAttempts(route: TokenInRoute, attempts: Json[]): Json {
  return route === 'sglang.generate' ? mergeSglang(attempts) : mergeCompletions(attempts);
}

interface Span {
  version: string;
  start: number;
  end: number;
}

/**
 * Weight-version spans over the merged output: each attempt's shifted by the tokens before it,
 * adjacent equal versions joined. Null when an attempt that sampled tokens did not say (a partial
 * provenance would read as a whole one).
 */
function mergedSpans(parts: { spans: unknown; tokens: number }[]): Span[] | null {
  const out: Span[] = [];
  let offset = 0;
  for (const p of parts) {
    if (!Array.isArray(p.spans)) {
      if (p.tokens > 0) return null;
      continue;
    }
    for (const s of p.spans as unknown[]) {
      if (!isObject(s) || typeof s.start !== 'number' || typeof s.end !== 'number') return null;
      if (typeof s.version !== 'string' && typeof s.version !== 'number') return null;
      const span = { version: String(s.version), start: s.start + offset, end: s.end + offset };
      const last = out[out.length - 1];
      if (last !== undefined && last.version === span.version && last.end === span.start) last.end = span.end;
      else out.push(span);
    }
    offset += p.tokens;
  }
  return out;
}

function ids(v: unknown): number[] {
  return Array.isArray(v) ? (v as number[]) : [];
}

function concatLists(values: unknown[]): unknown[] | undefined {
  if (!values.some(Array.isArray)) return undefined;
  const out: unknown[] = [];
  for (const v of values) if (Array.isArray(v)) for (const x of v) out.push(x);
  return out;
}

/** Usage over the merged answer: the first attempt's prompt, every attempt's sampled tokens. */
function mergedUsage(first: unknown, completion: number): Json | undefined {
  if (!isObject(first) || typeof first.prompt_tokens !== 'number') return undefined;
  return { prompt_tokens: first.prompt_tokens, completion_tokens: completion, total_tokens: first.prompt_tokens + completion };
}

/** Completions and vLLM's generate route: one choice (token-in asks for one). */
function mergeCompletions(attempts: Json[]): Json {
  const choices = attempts.map((a) => (Array.isArray(a.choices) && isObject(a.choices[0]) ? a.choices[0] : {}));
  const first = choices[0];
  const last = choices[choices.length - 1];
  const tokens = choices.map((c) => ids(c.token_ids));
  const total = tokens.reduce((n, t) => n + t.length, 0);
  const choice: Json = extend(last, { index: 0 });
  choice.text = choices.map((c) => (typeof c.text === 'string' ? c.text : '')).join('');
  choice.token_ids = tokens.flat();
  if (first.prompt_token_ids !== undefined) choice.prompt_token_ids = first.prompt_token_ids;
  else delete choice.prompt_token_ids;
  choice.logprobs = mergedLogprobs(choices.map((c) => c.logprobs));
  const mask = concatLists(choices.map((c) => c.sampling_mask));
  if (mask !== undefined) choice.sampling_mask = mask;
  const spans = mergedSpans(choices.map((c, i) => ({ spans: c.weight_versions, tokens: tokens[i].length })));
  if (spans !== null) choice.weight_versions = spans;
  else delete choice.weight_versions;
  // Routing: the last attempt's, which covers the whole sequence (its prompt held the earlier attempts' ids).
  const out: Json = extend(attempts[0], { choices: [choice] });
  const lastAnswer = attempts[attempts.length - 1];
  if (lastAnswer.prompt_routed_experts !== undefined) out.prompt_routed_experts = lastAnswer.prompt_routed_experts;
  const usage = mergedUsage(attempts[0].usage, total);
  if (usage !== undefined) out.usage = usage;
  return out;
}

/** Logprobs of the attempts in order: vLLM generate's `content` list, or completions' parallel lists. */
function mergedLogprobs(all: unknown[]): unknown {
  const objects = all.filter(isObject);
  if (objects.length === 0) return all[all.length - 1] ?? null;
  if (objects.some((o) => Array.isArray(o.content))) return { content: concatLists(objects.map((o) => o.content)) ?? [] };
  const out: Json = {};
  for (const key of ['tokens', 'token_logprobs', 'top_logprobs']) {
    const merged = concatLists(objects.map((o) => o[key]));
    out[key] = merged ?? null;
  }
  // Text offsets continue from the text before each attempt's.
  const offsets: number[] = [];
  let base = 0;
  for (const o of objects) {
    const own = Array.isArray(o.text_offset) ? (o.text_offset as number[]) : [];
    for (const x of own) offsets.push(x + base);
    if (own.length > 0) base = offsets[offsets.length - 1];
  }
  out.text_offset = offsets;
  return out;
}

/** SGLang's `/generate`: `{text, output_ids, meta_info}`. */
function mergeSglang(attempts: Json[]): Json {
  const metas = attempts.map((a) => (isObject(a.meta_info) ? a.meta_info : {}));
  const tokens = attempts.map((a) => ids(a.output_ids));
  const total = tokens.reduce((n, t) => n + t.length, 0);
  const meta: Json = { ...metas[metas.length - 1] };
  if (typeof metas[0].prompt_tokens === 'number') meta.prompt_tokens = metas[0].prompt_tokens;
  meta.completion_tokens = total;
  for (const key of ['output_token_logprobs', 'output_token_sampling_mask']) {
    const merged = concatLists(metas.map((m) => m[key]));
    if (merged !== undefined) meta[key] = merged;
  }
  // Spans when every attempt gave them, else from each attempt's one version (the version it ended with).
  const spans =
    mergedSpans(metas.map((m, i) => ({ spans: m.weight_versions, tokens: tokens[i].length }))) ??
    mergedSpans(
      metas.map((m, i) => ({
        spans:
          typeof m.weight_version === 'string' || typeof m.weight_version === 'number'
            ? [{ version: m.weight_version, start: 0, end: tokens[i].length }]
            : null,
        tokens: tokens[i].length,
      })),
    );
  delete meta.weight_versions;
  if (spans !== null) meta.weight_versions = spans.filter((s) => s.end > s.start);
  return extend(attempts[attempts.length - 1], {
    text: attempts.map((a) => (typeof a.text === 'string' ? a.text : '')).join(''),
    output_ids: tokens.flat(),
    meta_info: meta,
  });
}

/**
 * The request of a resumed attempt: the agent's token budget less the tokens sampled so far (and
 * so its minimum), or null when nothing of it is left. Without a budget of the agent's, the rest
 * of the context is asked for, which the longer prompt already accounts for.
 */
export function resumedRequest(r: TokenInRequest, spent: number): TokenInRequest | null {
  const c = r.chat;
  const chat: Record<string, unknown> = { ...c };
  const budget = c.max_completion_tokens ?? c.max_tokens;
  if (typeof budget === 'number') {
    if (budget - spent <= 0) return null;
    delete chat.max_completion_tokens;
    chat.max_tokens = budget - spent;
  }
  if (typeof c.min_tokens === 'number') chat.min_tokens = Math.max(0, c.min_tokens - spent);
  return extend(r, { chat });
}

/** The usage a merged answer gives the agent. */
export function answerUsage(route: TokenInRoute, merged: Json): unknown {
  if (route !== 'sglang.generate') return merged.usage;
  const meta = isObject(merged.meta_info) ? merged.meta_info : {};
  return mergedUsage(meta, typeof meta.completion_tokens === 'number' ? meta.completion_tokens : 0);
}
