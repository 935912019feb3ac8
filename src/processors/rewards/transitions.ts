import type { CreditConfig } from '../../config/schema';
import type { CallRecord, ChoiceCapture, ClosedEpisode, EpisodeStatus, Transition } from '../../pipeline/records';
import { credit } from './credit';

export interface EpisodeFacts {
  rolloutId: string;
  attemptId: string;
  groupId: string | null;
  calls: CallRecord[];
  rewards: { name: string; value: number; final: boolean }[];
  finalReward: number | null;
  startedAt: number;
  endedAt: number;
}

export interface TransitionOptions {
  credit: CreditConfig;
  airWeight: number;
}

/** One transition per call and choice (`n > 1` → `{rollout}/{attempt}/{seq}.{choice}`), in seq order. */
export function buildEpisode(facts: EpisodeFacts, status: EpisodeStatus, options: TransitionOptions): ClosedEpisode {
  const calls = [...facts.calls].sort((a, b) => a.seq - b.seq);
  const transitions: Transition[] = [];
  let previous: number[] | null = null;
  calls.forEach((call, position) => {
    const callCredit = credit(options.credit, facts.finalReward, position, calls.length);
    const choices: (ChoiceCapture | null)[] = call.choices.length > 0 ? call.choices : [null];
    const multi = choices.length > 1;
    const groupId = call.correlation.groupId ?? facts.groupId;
    choices.forEach((choice) => {
      const promptIds = choice?.promptTokenIds ?? call.promptTokenIds;
      const responseIds = choice?.responseTokenIds ?? null;
      const intermediate: number | null = null;
      const id = `${facts.rolloutId}/${facts.attemptId}/${call.seq}${multi && choice ? `.${choice.index}` : ''}`;
      transitions.push({
        schema: 'lightning.transition.v1',
        transition_id: id,
        rollout_id: facts.rolloutId,
        attempt_id: facts.attemptId,
        group_id: groupId,
        seq: call.seq,
        choice_index: choice?.index ?? 0,
        agent_name: call.correlation.agentName,
        model: call.model,
        policy_version: null,
        api: call.api,
        request: call.request,
        response: call.response,
        streamed: call.streamed,
        status: call.status,
        http_status: call.httpStatus,
        error: call.error,
        finish_reason: choice?.finishReason ?? null,
        usage: call.usage,
        prompt_token_ids: promptIds,
        response_token_ids: responseIds,
        response_logprobs: choice?.responseLogprobs ?? null,
        continues_previous: previous !== null && promptIds !== null && startsWith(promptIds, previous),
        tool_calls: (choice?.toolCalls ?? []).map((tc) => ({ id: tc.id, name: tc.name, status: null, reward: null, span_id: null })),
        intermediate_reward: intermediate,
        final_reward: facts.finalReward,
        reward: (callCredit ?? 0) + options.airWeight * (intermediate ?? 0),
        credit: callCredit,
        is_last: position === calls.length - 1,
        episode_status: status,
        truncated: call.truncated,
        trace_id: call.traceId,
        span_id: call.spanId,
        started_at: new Date(call.startedAt).toISOString(),
        ended_at: new Date(call.endedAt).toISOString(),
        latency_ms: call.latencyMs,
        ttft_ms: call.ttftMs,
        injected: call.injected,
      });
    });
    const first = call.choices[0];
    const p = first?.promptTokenIds ?? call.promptTokenIds;
    previous = p && first?.responseTokenIds ? p.concat(first.responseTokenIds) : null;
  });
  return {
    episode: {
      schema: 'lightning.episode.v1',
      rollout_id: facts.rolloutId,
      attempt_id: facts.attemptId,
      group_id: facts.groupId,
      episode_status: status,
      final_reward: facts.finalReward,
      rewards: facts.rewards,
      credit_mode: options.credit.mode,
      transitions: transitions.length,
      transition_ids: transitions.map((t) => t.transition_id),
      started_at: new Date(facts.startedAt).toISOString(),
      ended_at: new Date(facts.endedAt).toISOString(),
    },
    transitions,
  };
}

function startsWith(ids: number[], prefix: number[]): boolean {
  if (prefix.length === 0 || prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}
