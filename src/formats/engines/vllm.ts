import { vllmRoutedExperts } from '../routed-experts';
import type { Api } from '../../model/records';
import { readSamplingMask, versionSpans, type EngineDialect } from './dialect';

/**
 * vLLM's OpenAI-compatible server (docs/architecture.md#engine-dialects):
 * - ids and logprobs: `return_token_ids` (prompt ids on the answer, response ids per choice) and
 *   `logprobs`; on completions `logprobs: 0` gives the sampled token's only;
 * - routed experts: returned unasked when the server runs with `--enable-return-routed-experts`,
 *   as `choices[].routed_experts` (≥ 0.22: a base64 `.npy` over prompt and output; 0.21: nested
 *   lists, the prompt's in the answer's `prompt_routed_experts`), rows from the request's
 *   `routed_experts_prompt_start`;
 * - weight versions: `choices[].weight_versions` spans over output-token indexes;
 * - sampling masks: `choices[].sampling_mask` (one kept-id list per token, with
 *   `--return-sampling-mask`) on its token-in route `/inference/v1/generate` only (token-in calls
 *   it, docs/token-in.md); read wherever an answer has them (a patched server's chat answer too),
 *   never asked for.
 */
export const vllm: EngineDialect = {
  name: 'vllm',
  idsFields: {
    'chat.completions': { return_token_ids: 'true', logprobs: 'true' },
    completions: { return_token_ids: 'true', logprobs: '0' },
  },
  routingFields: null,
  maskFields: (_api: Api, _streamed: boolean) => null,
  maskRoutes:
    'vLLM returns sampling masks (--return-sampling-mask) only on /inference/v1/generate, which the sidecar does not call; chat and completions answers carry none',
  brought: {
    return_token_ids: ['prompt_token_ids', 'token_ids'],
    logprobs: ['logprobs'],
  },
  readChoice(choice, c, res) {
    let found = false;
    const versions = versionSpans(c.weight_versions);
    if (versions !== null) {
      choice.weightVersions = versions;
      found = true;
    }
    if (c.routed_experts !== undefined && c.routed_experts !== null) {
      choice.routedExperts = { value: c.routed_experts, prompt: res.prompt_routed_experts ?? null, form: 'vllm' };
      found = true;
    }
    if (c.sampling_mask !== undefined && c.sampling_mask !== null) {
      readSamplingMask(choice, c.sampling_mask);
      found = true;
    }
    return found;
  },
  decodeRouting: (value, kept, request) => vllmRoutedExperts(value, kept.prompt, request.requested('routed_experts_prompt_start')),
};
