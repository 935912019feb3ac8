import type { TokenState } from './conversation';
import type { TokenInRequest } from './request';
import { extend } from '../../../model/extend';

/**
 * Token-in against SGLang's native `POST /generate` (docs/token-in.md#sglangs-generate): the
 * prompt as `input_ids`, the agent's sampling fields mapped to SGLang's `sampling_params`, the
 * sampled tokens' logprobs asked for (`return_logprob`), streamed when the agent streams. Its answer
 * (`text`, `output_ids`, `meta_info`) is read back into the completions-choice shape the token-in
 * answer already speaks, so the same parsers make the agent's chat answer of it.
 */

/** SGLang's route, at the server's root. */
export const SGLANG_GENERATE_PATH = '/generate';

/** Chat request fields and their SGLang `sampling_params` names. */
const SAMPLING: Record<string, string> = {
  temperature: 'temperature',
  top_p: 'top_p',
  top_k: 'top_k',
  min_p: 'min_p',
  presence_penalty: 'presence_penalty',
  frequency_penalty: 'frequency_penalty',
  repetition_penalty: 'repetition_penalty',
  seed: 'sampling_seed',
  stop: 'stop',
  stop_token_ids: 'stop_token_ids',
  ignore_eos: 'ignore_eos',
  min_tokens: 'min_new_tokens',
};

export interface SglangExtras {
  /** Ask for routed experts (`processors.routed_experts.sglang`): only the rows of positions the rollout's previous call did not route. */
  routing: boolean;
  /** Ask for sampling masks (`processors.sampling.masks`). */
  masks: boolean;
  /** Keep special tokens in the text (parsers that read them). */
  keepSpecialTokens: boolean;
}

/**
 * The `/generate` request. Its token budget is the agent's, else the rest of the context (SGLang's
 * default is 128 new tokens). With routing asked for, `routed_experts_start_len` skips the rows
 * of positions the previous call of the rollout routed already (its prompt and sampled ids but the
 * last), which the trajectory takes from that call.
 */
export function sglangGenerateBody(r: TokenInRequest, prompt: Uint32Array, maxModelLen: number | null, extras: SglangExtras, state: TokenState | null): Buffer {
  const c = r.chat;
  const params: Record<string, unknown> = {};
  const budget = c.max_completion_tokens ?? c.max_tokens;
  if (budget !== undefined && budget !== null) params.max_new_tokens = budget;
  else if (maxModelLen !== null && maxModelLen > prompt.length) params.max_new_tokens = maxModelLen - prompt.length;
  for (const [from, to] of Object.entries(SAMPLING)) if (c[from] !== undefined) params[to] = c[from];
  if (extras.keepSpecialTokens) params.skip_special_tokens = false;
  const out: Record<string, unknown> = { sampling_params: params, return_logprob: true, stream: r.stream };
  if (c.model !== undefined) out.model = c.model;
  if (extras.routing) {
    out.return_routed_experts = true;
    const routed = state === null ? 0 : state.prompt.length + state.sampled.length - 1;
    if (routed > 0 && routed <= prompt.length) out.routed_experts_start_len = routed;
  }
  if (extras.masks) out.return_sampling_mask = true;
  return Buffer.from(`${JSON.stringify(out).slice(0, -1)},"input_ids":[${prompt.join(',')}]}`);
}

/** The completions-choice shape the token-in answer reads. */
export interface ChoicePiece {
  text?: unknown;
  token_ids?: number[];
  finish_reason?: string | null;
  stop_reason?: unknown;
}

/**
 * Reads SGLang's `/generate` answers, whole or streamed, as completions choices. A stream is
 * cumulative by default (each event carries the text and `output_ids` so far) or incremental
 * (`--incremental-streaming-output`: each the new part); an event whose ids are as many as its
 * `meta_info.completion_tokens` is the whole so far, and only what is new is passed on.
 */
export class SglangAnswerReader {
  private text = '';
  private ids = 0;

  /**
   * One answer object (the whole answer, or a stream event): the new part, its usage, and the event
   * as a delta (what is journaled of a stream: a cumulative stream's events repeat everything so
   * far, and kept as they came would grow the record with the square of the answer's length).
   */
  read(v: unknown): { choice: ChoicePiece; usage: unknown; delta: Record<string, unknown> } {
    const o = (typeof v === 'object' && v !== null ? v : {}) as { text?: unknown; output_ids?: unknown; meta_info?: Record<string, unknown> };
    const meta = o.meta_info ?? {};
    const ids = Array.isArray(o.output_ids) ? (o.output_ids as number[]) : [];
    const text = typeof o.text === 'string' ? o.text : '';
    const done = typeof meta.completion_tokens === 'number' ? meta.completion_tokens : null;
    const cumulative = done !== null && ids.length === done && ids.length >= this.ids;
    const newIds = cumulative ? ids.slice(this.ids) : ids;
    const newText = cumulative ? text.slice(this.text.length) : text;
    const from = this.ids;
    // Per-token lists of a cumulative event cover every token so far: the delta keeps the new ones.
    const deltaMeta: Record<string, unknown> = { ...meta };
    if (cumulative)
      for (const key of ['output_token_logprobs', 'output_token_sampling_mask'])
        if (Array.isArray(meta[key]) && (meta[key] as unknown[]).length === ids.length) deltaMeta[key] = (meta[key] as unknown[]).slice(from);
    const delta = cumulative ? extend(o, { text: newText, output_ids: newIds, meta_info: deltaMeta }) : (o as Record<string, unknown>);
    this.ids = cumulative ? ids.length : this.ids + ids.length;
    this.text = cumulative ? text : this.text + text;
    const finish = meta.finish_reason as { type?: unknown; matched?: unknown } | null | undefined;
    const choice: ChoicePiece = { text: newText, token_ids: newIds, finish_reason: null, stop_reason: null };
    if (finish && typeof finish.type === 'string') {
      choice.finish_reason = finish.type;
      // A matched stop string of the request; a matched token id is the model's end of turn (or a stop token).
      if (typeof finish.matched === 'string') choice.stop_reason = finish.matched;
    }
    const usage =
      typeof meta.prompt_tokens === 'number' && typeof meta.completion_tokens === 'number'
        ? { prompt_tokens: meta.prompt_tokens, completion_tokens: meta.completion_tokens, total_tokens: meta.prompt_tokens + meta.completion_tokens }
        : undefined;
    return { choice, usage, delta };
  }
}

/**
 * SGLang renders a conversation only on its chat route: the server's rendering (for the check of
 * local rendering, or when the sidecar has no tokenizer files) is a one-token chat call that
 * returns its prompt's ids (`return_prompt_token_ids`).
 */
export function sglangRenderBody(r: TokenInRequest): Buffer {
  const c = r.chat;
  const body: Record<string, unknown> = { messages: r.messages, max_tokens: 1, return_prompt_token_ids: true, stream: false };
  if (c.model !== undefined) body.model = c.model;
  if (Array.isArray(c.tools) && c.tools.length > 0) body.tools = c.tools;
  if (c.chat_template_kwargs !== undefined) body.chat_template_kwargs = c.chat_template_kwargs;
  return Buffer.from(JSON.stringify(body));
}

/** The prompt ids of that chat answer (on its first choice, or the answer), or null. */
export function sglangRenderedIds(body: Buffer): number[] | null {
  try {
    const v = JSON.parse(body.toString('utf8')) as { prompt_token_ids?: unknown; choices?: { prompt_token_ids?: unknown }[] };
    const ids = v.choices?.[0]?.prompt_token_ids ?? v.prompt_token_ids;
    return Array.isArray(ids) && ids.length > 0 && ids.every((x) => Number.isInteger(x) && (x as number) >= 0) ? (ids as number[]) : null;
  } catch {
    return null;
  }
}

/** The context length a model listing gives (`max_model_len` of the model, else of the first), as SGLang and vLLM list it. */
export function sglangMaxModelLen(body: Buffer, model: unknown): number | null {
  try {
    const v = JSON.parse(body.toString('utf8')) as { data?: { id?: unknown; max_model_len?: unknown }[] };
    const cards = Array.isArray(v.data) ? v.data : [];
    const card = cards.find((m) => m.id === model) ?? cards[0];
    return typeof card?.max_model_len === 'number' ? card.max_model_len : null;
  } catch {
    return null;
  }
}
