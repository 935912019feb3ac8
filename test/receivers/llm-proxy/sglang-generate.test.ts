import { assembleSglangGenerateStream, extractSglangGenerate } from '../../../src/formats/adapters/sglang-generate';
import { readTokenInRequest } from '../../../src/receivers/llm-proxy/token-in/request';
import { SglangAnswerReader, sglangGenerateBody, sglangMaxModelLen, sglangRenderedIds } from '../../../src/receivers/llm-proxy/token-in/sglang-generate';

// SGLang's /generate as token-in speaks it: the request, its answers read back, and the record.

function request(extra: Record<string, unknown> = {}) {
  const r = readTokenInRequest(Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], ...extra })));
  if ('reason' in r) throw new Error(r.reason);
  return r;
}
const body = (b: Buffer) => JSON.parse(b.toString()) as Record<string, unknown> & { sampling_params: Record<string, unknown> };

describe("SGLang's /generate request", () => {
  it("maps the agent's sampling fields to SGLang's names, and the budget to max_new_tokens", () => {
    const r = request({ temperature: 0.7, top_p: 0.9, top_k: 20, seed: 5, stop: ['x'], max_completion_tokens: 64, min_tokens: 2 });
    const b = body(sglangGenerateBody(r, Uint32Array.from([1, 2, 3]), 100, { routing: false, masks: false, keepSpecialTokens: false }, null));
    expect(b.sampling_params).toEqual({ max_new_tokens: 64, temperature: 0.7, top_p: 0.9, top_k: 20, sampling_seed: 5, stop: ['x'], min_new_tokens: 2 });
    expect(b).toMatchObject({ input_ids: [1, 2, 3], return_logprob: true, stream: false, model: 'm' });
    expect('return_routed_experts' in b || 'return_sampling_mask' in b).toBe(false);
    // No budget from the agent: the rest of the context.
    expect(
      body(sglangGenerateBody(request(), Uint32Array.from([1, 2, 3]), 100, { routing: false, masks: false, keepSpecialTokens: true }, null)).sampling_params,
    ).toEqual({
      max_new_tokens: 97,
      skip_special_tokens: false,
    });
  });

  it('asks for routing of the new rows only (after what the previous call routed), and for masks', () => {
    const state = { prompt: Uint32Array.from([1, 2, 3]), sampled: Uint32Array.from([4, 5]), digest: '', messages: 1, context: '', stopped: true };
    const b = body(
      sglangGenerateBody(request(), Uint32Array.from([1, 2, 3, 4, 5, 6, 7]), null, { routing: true, masks: true, keepSpecialTokens: false }, state),
    );
    expect(b).toMatchObject({ return_routed_experts: true, routed_experts_start_len: 4, return_sampling_mask: true });
    const first = body(sglangGenerateBody(request(), Uint32Array.from([1, 2]), null, { routing: true, masks: false, keepSpecialTokens: false }, null));
    expect(first.return_routed_experts).toBe(true);
    expect('routed_experts_start_len' in first).toBe(false);
  });
});

describe("SGLang's /generate answers", () => {
  const meta = (n: number, finish: unknown = null) => ({ completion_tokens: n, prompt_tokens: 3, finish_reason: finish });
  it('reads cumulative and incremental events into the same pieces', () => {
    const cumulative = new SglangAnswerReader();
    const a = [
      cumulative.read({ text: 'He', output_ids: [1], meta_info: meta(1) }),
      cumulative.read({ text: 'Hello', output_ids: [1, 2], meta_info: meta(2) }),
      cumulative.read({ text: 'Hello!', output_ids: [1, 2, 3], meta_info: meta(3, { type: 'stop', matched: 3 }) }),
    ];
    const incremental = new SglangAnswerReader();
    const b = [
      incremental.read({ text: 'He', output_ids: [1], meta_info: meta(1) }),
      incremental.read({ text: 'llo', output_ids: [2], meta_info: meta(2) }),
      incremental.read({ text: '!', output_ids: [3], meta_info: meta(3, { type: 'stop', matched: 3 }) }),
    ];
    expect(a.map((x) => x.choice)).toEqual(b.map((x) => x.choice));
    expect(a.map((x) => x.choice.text).join('')).toBe('Hello!');
    expect(a.flatMap((x) => x.choice.token_ids)).toEqual([1, 2, 3]);
    expect(a[2].choice).toMatchObject({ finish_reason: 'stop', stop_reason: null });
    expect(a[2].usage).toEqual({ prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 });
    // A stop string of the request is a stop of the request, not the model's end of turn.
    expect(new SglangAnswerReader().read({ text: 'x', output_ids: [9], meta_info: meta(1, { type: 'stop', matched: '###' }) }).choice.stop_reason).toBe('###');
  });

  it("records ids, logprobs, finish reason and SGLang's extras, whole or streamed either way", () => {
    const whole = extractSglangGenerate({
      text: 'Hi!',
      output_ids: [7, 8, 9],
      meta_info: {
        ...meta(3, { type: 'stop', matched: 9 }),
        output_token_logprobs: [
          [-0.1, 7, null],
          [-0.2, 8, null],
          [-0.3, 9, null],
        ],
        weight_version: 'w3',
      },
    });
    expect(whole.choices[0]).toMatchObject({
      finishReason: 'stop',
      responseTokenIds: [7, 8, 9],
      responseLogprobs: [-0.1, -0.2, -0.3],
      weightVersions: { whole: 'w3' },
    });
    const events = [
      { text: 'H', output_ids: [7], meta_info: { ...meta(1), output_token_logprobs: [[-0.1, 7, null]] } },
      {
        text: 'Hi',
        output_ids: [7, 8],
        meta_info: {
          ...meta(2),
          output_token_logprobs: [
            [-0.1, 7, null],
            [-0.2, 8, null],
          ],
        },
      },
      {
        text: 'Hi!',
        output_ids: [7, 8, 9],
        meta_info: {
          ...meta(3, { type: 'stop' }),
          output_token_logprobs: [
            [-0.1, 7, null],
            [-0.2, 8, null],
            [-0.3, 9, null],
          ],
          weight_version: 'w3',
        },
      },
    ];
    const deltas = [
      events[0],
      { text: 'i', output_ids: [8], meta_info: { ...meta(2), output_token_logprobs: [[-0.2, 8, null]] } },
      { text: '!', output_ids: [9], meta_info: { ...meta(3, { type: 'stop' }), output_token_logprobs: [[-0.3, 9, null]], weight_version: 'w3' } },
    ];
    for (const stream of [events, deltas]) {
      const x = assembleSglangGenerateStream(stream, true);
      expect(x.choices[0]).toMatchObject({
        finishReason: 'stop',
        responseTokenIds: [7, 8, 9],
        responseLogprobs: [-0.1, -0.2, -0.3],
        weightVersions: { whole: 'w3' },
      });
      expect(x.incomplete).toBe(false);
    }
    expect(assembleSglangGenerateStream(events.slice(0, 2), false).incomplete).toBe(true);
  });

  it('reads the rendering check and the context length', () => {
    expect(sglangRenderedIds(Buffer.from(JSON.stringify({ choices: [{ prompt_token_ids: [1, 2] }] })))).toEqual([1, 2]);
    expect(sglangRenderedIds(Buffer.from('{"choices":[{}]}'))).toBeNull();
    expect(
      sglangMaxModelLen(
        Buffer.from(
          JSON.stringify({
            data: [
              { id: 'a', max_model_len: 10 },
              { id: 'm', max_model_len: 20 },
            ],
          }),
        ),
        'm',
      ),
    ).toBe(20);
    expect(sglangMaxModelLen(Buffer.from('{"data":[{"id":"a"}]}'), 'a')).toBeNull();
  });
});
