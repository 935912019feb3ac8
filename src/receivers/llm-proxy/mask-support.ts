import type { Config, SamplingConfig } from '../../config/schema';
import type { Flavor } from './flavor';
import { ENGINE } from '../../formats/engines';

/**
 * What a trainer replaying truncated sampling would miss, said before training starts (the
 * start-up log and `/readyz`): sampling is truncated (a pinned `top_p` below 1, `top_k` above 0 or
 * `min_p` above 0) without masks asked for, or masks are asked of a server that gives none on the
 * routes the sidecar calls (`tokenInGenerate`: token-in may call vLLM's generate route, which
 * does). Null when nothing is missing.
 */
export function samplingMaskGap(sampling: SamplingConfig, flavor: Flavor, tokenInGenerate = false): string | null {
  const truncated = truncation(sampling);
  if (!sampling.masks)
    return truncated === null
      ? null
      : `sampling is truncated (processors.sampling.pin ${truncated}) but processors.sampling.masks is off: trajectories carry no sampling masks, so a trainer's importance ratios compare against the untruncated distribution`;
  if (flavor === 'openai')
    return 'sampling masks are asked for (processors.sampling.masks), but the model server is not identified as vLLM or SGLang: none are requested';
  // Token-in sends vLLM calls to the route that has them, when the server has it.
  if (flavor === 'vllm' && !tokenInGenerate)
    return `sampling masks are asked for (processors.sampling.masks), but ${ENGINE.vllm.maskRoutes}: trajectories are flagged sampling_mask_complete false (token-in calls that route with token_in.route auto or generate)`;
  return null;
}

/**
 * Truncated sampling (pinned) or masks asked for, with vLLM and no `processors.sampling.logprobs_mode`:
 * the trajectories cannot say whether their logprobs are before truncation (vLLM's default) or
 * after. Null otherwise (SGLang's chat logprobs have no mode to name).
 */
export function logprobsModeGap(sampling: SamplingConfig, flavor: Flavor): string | null {
  if (flavor !== 'vllm' || sampling.logprobs_mode !== undefined || (!sampling.masks && truncation(sampling) === null)) return null;
  return "processors.sampling.logprobs_mode is not set: trajectories cannot say whether their logprobs are before truncation (vLLM's default --logprobs-mode raw_logprobs) or after it (processed_logprobs); set what the server runs with";
}

/** The pinned parameters that truncate the sampled distribution, as text, or null. */
function truncation(sampling: SamplingConfig): string | null {
  const p = sampling.pin;
  const parts: string[] = [];
  if (p.top_p !== undefined && p.top_p.value < 1) parts.push(`top_p ${p.top_p.value}`);
  if (p.top_k !== undefined && p.top_k.value > 0) parts.push(`top_k ${p.top_k.value}`);
  if (p.min_p !== undefined && p.min_p.value > 0) parts.push(`min_p ${p.min_p.value}`);
  return parts.length === 0 ? null : parts.join(', ');
}

/** Token-in may call vLLM's `/inference/v1/generate` (on, and `token_in.route` not `completions`). */
export function tokenInGenerate(config: Config): boolean {
  const t = config.receivers.llm_proxy.token_in;
  return t.enabled && t.route !== 'completions';
}
