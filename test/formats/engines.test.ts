import { assembleChatStream, extractChat } from '../../src/formats/adapters/chat-completions';
import { extractCompletions } from '../../src/formats/adapters/completions';
import { BROUGHT, ENGINE, ENGINES } from '../../src/formats/engines';
import type { CallFacts } from '../../src/formats/extract';
import type { ChoiceCapture } from '../../src/model/records';
import { checkSamplingMasks, trajectorySamplingMask } from '../../src/processors/rewards/sampling-mask';
import { fieldsFor } from '../../src/receivers/llm-proxy/inject';
import { broughtMembers } from '../../src/receivers/llm-proxy/strip';

// Each engine's wire dialect (src/formats/engines): what is asked, what it brings, where its extras are.

const rows = (c: ChoiceCapture): number[][] => {
  const m = c.samplingMask!;
  return Array.from({ length: m.offsets.length - 1 }, (_, r) => Array.from(m.ids.subarray(m.offsets[r], m.offsets[r + 1])));
};

describe('engine dialects', () => {
  it('ask each engine for ids in its own words, and only vLLM and SGLang', () => {
    expect(ENGINES.map((e) => e.name)).toEqual(['vllm', 'sglang']);
    expect(fieldsFor('vllm', 'chat.completions')).toEqual({ return_token_ids: 'true', logprobs: 'true' });
    expect(fieldsFor('sglang', 'completions')).toEqual({ return_token_ids: 'true', return_prompt_token_ids: 'true', logprobs: '0' });
    expect(fieldsFor('openai', 'chat.completions')).toBeNull();
    expect(fieldsFor('vllm', 'responses')).toBeNull();
  });

  it('ask SGLang for masks on non-streamed chat only, vLLM nowhere on the routes the sidecar calls', () => {
    expect(ENGINE.sglang.maskFields('chat.completions', false)).toEqual({ return_meta_info: 'true', return_sampling_mask: 'true' });
    expect(ENGINE.sglang.maskFields('chat.completions', true)).toBeNull();
    expect(ENGINE.sglang.maskFields('completions', false)).toBeNull();
    for (const api of ['chat.completions', 'completions'] as const) for (const s of [true, false]) expect(ENGINE.vllm.maskFields(api, s)).toBeNull();
  });

  it('give back as null what each added field brings, over every engine', () => {
    expect(BROUGHT.return_token_ids).toEqual(['prompt_token_ids', 'token_ids']);
    expect(broughtMembers(['return_meta_info', 'return_sampling_mask', 'return_routed_experts'])).toEqual(['meta_info', 'routed_experts']);
    expect(broughtMembers(['logprobs'])).toEqual(['logprobs']);
  });

  it("read vLLM's choice extras: mask rows, version spans, routing kept for decoding", () => {
    const x = extractChat({
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: 'hi' },
          token_ids: [9707, 11, 151645],
          sampling_mask: [[9707, 11, 40], [13, 11], [151645]],
          weight_versions: [{ version: 'step-41', start: 0, end: 3 }],
          routed_experts: 'k05VTVBZ',
        },
      ],
      prompt_routed_experts: null,
    });
    const c = x.choices[0];
    expect(rows(c)).toEqual([[9707, 11, 40], [13, 11], [151645]]);
    expect(c.weightVersions).toEqual([{ version: 'step-41', start: 0, end: 3 }]);
    expect(c.routedExperts).toEqual({ value: 'k05VTVBZ', prompt: null, form: 'vllm' });
  });

  it("read SGLang's from meta_info (masks, spans) or, for the first choice, sglext (routing, scalar version)", () => {
    const meta = extractChat({
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: 'x' },
          meta_info: {
            output_token_sampling_mask: [[1, 2], [3]],
            weight_versions: [{ version: 7, start: 0, end: 2 }],
            routed_experts: 'AAAA',
            routed_experts_start_len: 4,
          },
        },
      ],
    }).choices[0];
    expect(rows(meta)).toEqual([[1, 2], [3]]);
    expect(meta.weightVersions).toEqual([{ version: '7', start: 0, end: 2 }]);
    expect(meta.routedExperts).toEqual({ value: 'AAAA', prompt: null, form: 'sglang', start: 4 });
    const ext = extractCompletions({
      choices: [
        { index: 0, text: 'x' },
        { index: 1, text: 'y' },
      ],
      sglext: { weight_version: '41', routed_experts: 'BBBB' },
    }).choices;
    expect(ext[0].weightVersions).toEqual({ whole: '41' });
    expect(ext[0].routedExperts?.form).toBe('sglang');
    expect(ext[1].weightVersions).toBeUndefined();
    expect(ext[1].routedExperts).toBeUndefined();
  });

  it('say why a mask that is not a list of id lists cannot be used, instead of reading part of it', () => {
    const read = (mask: unknown) => extractChat({ choices: [{ index: 0, message: {}, sampling_mask: mask }] }).choices[0];
    expect(read('abc').samplingMaskError).toMatch(/not a list per token/);
    expect(read([[1], 2]).samplingMaskError).toMatch(/row is not a list/);
    expect(read([[1], [-1]]).samplingMaskError).toMatch(/row 1 holds -1/);
    expect(read([[1], [2.5]]).samplingMask).toBeUndefined();
    expect(read(null).samplingMaskError).toBeUndefined();
  });

  it('keep a mask and version spans a stream carries on its terminal chunk', () => {
    const x = assembleChatStream(
      [
        { choices: [{ index: 0, delta: { content: 'a' }, token_ids: [5] }] },
        {
          choices: [
            {
              index: 0,
              delta: { content: 'b' },
              token_ids: [6],
              finish_reason: 'stop',
              sampling_mask: [[5, 1], [6]],
              weight_versions: [{ version: 'v2', start: 0, end: 2 }],
            },
          ],
        },
      ],
      true,
    );
    expect(rows(x.choices[0])).toEqual([[5, 1], [6]]);
    expect(x.choices[0].weightVersions).toEqual([{ version: 'v2', start: 0, end: 2 }]);
  });
});

describe('sampling masks checked against their tokens and laid over a trajectory', () => {
  const facts = (choices: ChoiceCapture[]): CallFacts => ({ choices }) as unknown as CallFacts;
  const choice = (ids: number[], mask: number[][]): ChoiceCapture =>
    extractChat({ choices: [{ index: 0, message: {}, token_ids: ids, sampling_mask: mask }] }).choices[0];

  it('count sampled ids outside their row; drop a mask whose rows are not one per token, saying why', () => {
    const ok = choice([5, 6, 7], [[5, 1], [2, 3], [7]]);
    const short = choice([5, 6], [[5]]);
    checkSamplingMasks(facts([ok, short]), null);
    expect(ok.samplingMaskViolations).toBe(1);
    expect(short.samplingMask).toBeUndefined();
    expect(short.samplingMaskError).toBe('the sampling mask has 1 rows for 2 output tokens');
  });

  it('put each turn’s rows at its sampled positions; empty rows elsewhere; missing, coverage and violations from the turns', () => {
    const a = choice([10, 11], [[10, 1], [11]]);
    const b = choice([20], [[2]]);
    checkSamplingMasks(facts([a, b]), null);
    const m = trajectorySamplingMask(
      [
        { responseStart: 2, responseEnd: 4, choice: a },
        { responseStart: 6, responseEnd: 7, choice: undefined },
        { responseStart: 8, responseEnd: 9, choice: b },
      ],
      9,
      true,
    )!;
    const row = (p: number) => Array.from(m.ids.subarray(m.offsets[p], m.offsets[p + 1]));
    expect(Array.from(m.offsets)).toHaveLength(10);
    expect([row(2), row(3), row(8)]).toEqual([[10, 1], [11], [2]]);
    for (const p of [0, 1, 4, 5, 6, 7]) expect(row(p)).toEqual([]);
    expect(m.missing).toEqual([[6, 7]]);
    expect(m.coverage).toBeCloseTo(3 / 4, 12);
    expect(m.violations).toBe(1);
    expect(m.complete).toBe(false);
    expect(m.problems).toEqual(['a call returned no sampling mask', '1 sampled ids are not in their kept set']);
  });

  it('none when no call had a mask and none was asked for; flagged when asked for and none came', () => {
    const turns = [{ responseStart: 1, responseEnd: 3, choice: undefined }];
    expect(trajectorySamplingMask(turns, 3, false)).toBeNull();
    const m = trajectorySamplingMask(turns, 3, true)!;
    expect([m.complete, m.coverage, m.ids.length, m.missing]).toEqual([false, 0, 0, [[1, 3]]]);
  });
});
