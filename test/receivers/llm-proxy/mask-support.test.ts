import { samplingSchema } from '../../../src/config/schema';
import { logprobsModeGap, samplingMaskGap } from '../../../src/receivers/llm-proxy/mask-support';

// What is said at start and in /readyz about sampling masks and logprobs modes, before training.

const sampling = (o: Record<string, unknown>) => samplingSchema.parse(o);

describe('sampling mask gaps', () => {
  it('truncating pins without masks name the parameters; untruncated pins or none say nothing', () => {
    expect(samplingMaskGap(sampling({ pin: { top_p: { value: 0.8 }, top_k: { value: 50 }, min_p: { value: 0.05 } } }), 'sglang')).toMatch(
      /^sampling is truncated \(processors.sampling.pin top_p 0.8, top_k 50, min_p 0.05\) but processors.sampling.masks is off/,
    );
    expect(samplingMaskGap(sampling({ pin: { top_p: { value: 1 }, top_k: { value: -1 }, temperature: { value: 0.7 } } }), 'vllm')).toBeNull();
    expect(samplingMaskGap(sampling({}), 'vllm')).toBeNull();
  });

  it('masks asked of a server that cannot give them say so; of SGLang, nothing', () => {
    expect(samplingMaskGap(sampling({ masks: true }), 'vllm')).toMatch(/only on \/inference\/v1\/generate/);
    // Token-in calls that route when the server has it.
    expect(samplingMaskGap(sampling({ masks: true }), 'vllm', true)).toBeNull();
    expect(samplingMaskGap(sampling({ masks: true }), 'openai')).toMatch(/not identified as vLLM or SGLang/);
    expect(samplingMaskGap(sampling({ masks: true, pin: { top_k: { value: 20 } } }), 'sglang')).toBeNull();
  });

  it('a vLLM server with masks or truncation and no logprobs mode is told to name it', () => {
    expect(logprobsModeGap(sampling({ masks: true }), 'vllm')).toMatch(/logprobs_mode is not set/);
    expect(logprobsModeGap(sampling({ pin: { top_k: { value: 20 } } }), 'vllm')).toMatch(/raw_logprobs/);
    expect(logprobsModeGap(sampling({ masks: true, logprobs_mode: 'processed_logprobs' }), 'vllm')).toBeNull();
    expect(logprobsModeGap(sampling({ masks: true }), 'sglang')).toBeNull();
    expect(logprobsModeGap(sampling({}), 'vllm')).toBeNull();
  });
});
