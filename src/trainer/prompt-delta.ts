import type { PromptIdsDelta } from '../model/prompt-delta';
import type { Transition } from '../model/records';

/** A transition as read from Kafka: full prompt ids, or a delta against the previous transition. */
export type WireTransition = Transition & { prompt_token_ids_delta?: PromptIdsDelta | null };

export type Rebuilt = { ok: true; prompt_token_ids: number[] } | { ok: false; reason: string };

/** The full prompt: the previous transition's full prompt, its response, then the suffix. */
export function rebuildPrompt(delta: PromptIdsDelta, previous: Transition | undefined): Rebuilt {
  if (!previous) return { ok: false, reason: `previous transition ${delta.previous_transition_id} is not held` };
  if (!previous.prompt_token_ids || !previous.response_token_ids)
    return { ok: false, reason: `previous transition ${delta.previous_transition_id} has no token ids` };
  const prefix = previous.prompt_token_ids.length + previous.response_token_ids.length;
  if (prefix !== delta.prefix_length)
    return { ok: false, reason: `prefix_length ${delta.prefix_length} but the previous prompt and response hold ${prefix} ids` };
  return { ok: true, prompt_token_ids: previous.prompt_token_ids.concat(previous.response_token_ids, delta.suffix) };
}

/** Without the delta member: what a consumer hands on once the prompt is whole again. */
export function withFullPrompt(t: WireTransition, prompt: number[] | null): Transition {
  const { prompt_token_ids_delta: _delta, ...rest } = t;
  return { ...rest, prompt_token_ids: prompt };
}
