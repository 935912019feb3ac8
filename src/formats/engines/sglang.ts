import { RoutingFormatError, sglangRoutedExperts } from '../routed-experts';
import { isRecord, readSamplingMask, versionSpans, type EngineDialect } from './dialect';

/**
 * SGLang's OpenAI-compatible server (docs/architecture.md#engine-dialects):
 * - ids and logprobs: `return_token_ids` and `return_prompt_token_ids` (both per choice), `logprobs`;
 * - routed experts: asked with `return_routed_experts`; base64 of raw little-endian int32 with no
 *   shape (the model's layers and top-k come from `processors.routed_experts.sglang`), in the
 *   choice's `meta_info.routed_experts` or the answer's `sglext` (built from the first choice),
 *   rows from `routed_experts_start_len` (echoed, else the request's);
 * - weight versions: `weight_versions` spans or the scalar `weight_version` (the version the answer
 *   ended with), in `meta_info` or `sglext`;
 * - sampling masks: asked with `return_sampling_mask`, which needs `return_meta_info`, which SGLang
 *   refuses on streamed chat; `meta_info.output_token_sampling_mask`, one kept-id list per token.
 */
export const sglang: EngineDialect = {
  name: 'sglang',
  idsFields: {
    'chat.completions': { return_token_ids: 'true', return_prompt_token_ids: 'true', logprobs: 'true' },
    completions: { return_token_ids: 'true', return_prompt_token_ids: 'true', logprobs: '0' },
  },
  routingFields: { return_routed_experts: 'true' },
  maskFields: (api, streamed) => (api === 'chat.completions' && !streamed ? { return_meta_info: 'true', return_sampling_mask: 'true' } : null),
  maskRoutes: 'SGLang returns sampling masks on non-streamed chat completions (return_sampling_mask with return_meta_info); streamed calls carry none',
  brought: {
    return_token_ids: ['prompt_token_ids', 'token_ids'],
    return_prompt_token_ids: ['prompt_token_ids'],
    logprobs: ['logprobs'],
    return_routed_experts: ['routed_experts'],
    return_meta_info: ['meta_info'],
  },
  readChoice(choice, c, res) {
    // The choice's `meta_info`, or the answer's `sglext` (built from the first choice only).
    const meta = isRecord(c.meta_info) ? c.meta_info : null;
    const ext = isRecord(res.sglext) && choice.index === 0 ? res.sglext : null;
    if (meta === null && ext === null) return false;
    const versions = versionSpans(meta?.weight_versions) ?? versionSpans(ext?.weight_versions);
    if (versions !== null) choice.weightVersions = versions;
    else
      for (const v of [meta?.weight_version, ext?.weight_version])
        if (typeof v === 'string' || typeof v === 'number') {
          choice.weightVersions = { whole: String(v) };
          break;
        }
    const value = meta?.routed_experts ?? ext?.routed_experts;
    if (value !== undefined && value !== null)
      choice.routedExperts = { value, prompt: null, form: 'sglang', start: meta?.routed_experts_start_len ?? ext?.routed_experts_start_len };
    readSamplingMask(choice, meta?.output_token_sampling_mask);
    return true;
  },
  decodeRouting(value, kept, request) {
    if (request.shape === null) throw new RoutingFormatError('SGLang routing without processors.routed_experts.sglang (layers, top_k) to shape it');
    const start = kept.start;
    const from = Number.isSafeInteger(start) && (start as number) >= 0 ? (start as number) : request.requested('routed_experts_start_len');
    return sglangRoutedExperts(value, request.shape.layers, request.shape.topK, from);
  },
};
