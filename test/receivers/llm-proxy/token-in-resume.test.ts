import { extractBody } from '../../../src/formats/adapters';
import { attemptAnswer, mergeAttempts, resumedRequest } from '../../../src/receivers/llm-proxy/token-in/resume';
import { readTokenInRequest, type TokenInRequest } from '../../../src/receivers/llm-proxy/token-in/request';

/**
 * The record of a call the engine aborted and the sidecar sent again: the attempts' answers
 * merged into one answer of the route, read by the same extraction as any answer of it.
 */

function request(body: Record<string, unknown>): TokenInRequest {
  const r = readTokenInRequest(Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], ...body })));
  if ('reason' in r) throw new Error(r.reason);
  return r;
}

describe('merging the attempts of a resumed call', () => {
  it('vLLM generate: ids, logprobs, masks in order; version spans shifted and joined; routing and finish of the last attempt', () => {
    const merged = mergeAttempts('generate', [
      {
        prompt_token_ids: [1, 2],
        choices: [
          {
            index: 0,
            token_ids: [10, 11],
            text: 'ab',
            finish_reason: 'abort',
            logprobs: { content: [{ logprob: -1 }, { logprob: -2 }] },
            sampling_mask: [[10], [11, 5]],
            weight_versions: [{ version: 'v1', start: 0, end: 2 }],
          },
        ],
        usage: { prompt_tokens: 2, completion_tokens: 2, total_tokens: 4 },
      },
      {
        prompt_token_ids: [1, 2, 10, 11],
        choices: [
          {
            index: 0,
            token_ids: [12],
            text: 'c',
            finish_reason: 'abort',
            logprobs: { content: [{ logprob: -3 }] },
            sampling_mask: [[12]],
            weight_versions: [{ version: 'v1', start: 0, end: 1 }],
          },
        ],
      },
      {
        prompt_token_ids: [1, 2, 10, 11, 12],
        choices: [
          {
            index: 0,
            token_ids: [13, 14],
            text: 'de',
            finish_reason: 'stop',
            logprobs: { content: [{ logprob: -4 }, { logprob: -5 }] },
            sampling_mask: [[13], [14]],
            weight_versions: [{ version: 'v2', start: 0, end: 2 }],
            routed_experts: 'LAST',
          },
        ],
        usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 },
      },
    ]);
    const x = extractBody('generate', merged);
    expect(x.promptTokenIds).toEqual([1, 2]);
    const c = x.choices[0];
    expect(c.responseTokenIds).toEqual([10, 11, 12, 13, 14]);
    expect(c.responseLogprobs).toEqual([-1, -2, -3, -4, -5]);
    expect(c.finishReason).toBe('stop');
    expect(c.weightVersions).toEqual([
      { version: 'v1', start: 0, end: 3 },
      { version: 'v2', start: 3, end: 5 },
    ]);
    expect((merged.choices as Record<string, unknown>[])[0].sampling_mask).toEqual([[10], [11, 5], [12], [13], [14]]);
    expect((merged.choices as Record<string, unknown>[])[0].routed_experts).toBe('LAST');
    expect((merged.choices as Record<string, unknown>[])[0].text).toBe('abcde');
    expect(merged.usage).toEqual({ prompt_tokens: 2, completion_tokens: 5, total_tokens: 7 });
  });

  it('an attempt that sampled tokens without saying which weights: no versions at all, never a partial list', () => {
    const merged = mergeAttempts('generate', [
      { choices: [{ token_ids: [1], finish_reason: 'abort', weight_versions: [{ version: 'a', start: 0, end: 1 }] }] },
      { choices: [{ token_ids: [2], finish_reason: 'stop' }] },
    ]);
    expect(extractBody('generate', merged).choices[0].weightVersions).toBeUndefined();
    // An attempt aborted before its first token says `[]` or nothing: nothing is lost.
    const empty = mergeAttempts('generate', [
      { choices: [{ token_ids: [], finish_reason: 'abort', weight_versions: null }] },
      { choices: [{ token_ids: [2], finish_reason: 'stop', weight_versions: [{ version: 'b', start: 0, end: 1 }] }] },
    ]);
    expect(extractBody('generate', empty).choices[0].weightVersions).toEqual([{ version: 'b', start: 0, end: 1 }]);
  });

  it('completions: token_logprobs and text offsets continue across attempts', () => {
    const merged = mergeAttempts('completions', [
      {
        choices: [
          {
            text: 'ab',
            token_ids: [1, 2],
            prompt_token_ids: [9],
            finish_reason: 'abort',
            logprobs: { tokens: ['a', 'b'], token_logprobs: [-1, -2], top_logprobs: null, text_offset: [0, 1] },
          },
        ],
      },
      {
        choices: [
          {
            text: 'c',
            token_ids: [3],
            prompt_token_ids: [9, 1, 2],
            finish_reason: 'length',
            logprobs: { tokens: ['c'], token_logprobs: [-3], top_logprobs: null, text_offset: [0] },
          },
        ],
      },
    ]);
    const c = extractBody('completions', merged).choices[0];
    expect(c.responseTokenIds).toEqual([1, 2, 3]);
    expect(c.responseLogprobs).toEqual([-1, -2, -3]);
    expect(c.promptTokenIds).toEqual([9]);
    expect(c.finishReason).toBe('length');
    expect(((merged.choices as Record<string, unknown>[])[0].logprobs as { text_offset: number[] }).text_offset).toEqual([0, 1, 1]);
  });

  it("SGLang: one version an attempt becomes spans; the first attempt's prompt count, every attempt's tokens", () => {
    const merged = mergeAttempts('sglang.generate', [
      {
        text: 'ab',
        output_ids: [1, 2],
        meta_info: {
          finish_reason: { type: 'abort' },
          prompt_tokens: 7,
          completion_tokens: 2,
          weight_version: 'w0',
          output_token_logprobs: [
            [-1, 1, null],
            [-2, 2, null],
          ],
        },
      },
      {
        text: 'c',
        output_ids: [3],
        meta_info: {
          finish_reason: { type: 'stop', matched: 3 },
          prompt_tokens: 9,
          completion_tokens: 1,
          weight_version: 'w1',
          output_token_logprobs: [[-3, 3, null]],
        },
      },
    ]);
    const x = extractBody('sglang.generate', merged);
    expect(x.choices[0].responseTokenIds).toEqual([1, 2, 3]);
    expect(x.choices[0].responseLogprobs).toEqual([-1, -2, -3]);
    expect(x.choices[0].finishReason).toBe('stop');
    expect(x.choices[0].weightVersions).toEqual([
      { version: 'w0', start: 0, end: 2 },
      { version: 'w1', start: 2, end: 3 },
    ]);
    expect(x.usage).toEqual({ prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 });
    expect(merged.text).toBe('abc');
  });

  it('a streamed attempt is read from its events as its whole answer', () => {
    const events = [
      { choices: [{ index: 0, text: 'a', token_ids: [1], finish_reason: null }], prompt_token_ids: [9] },
      { choices: [{ index: 0, text: '', token_ids: [], finish_reason: 'abort', weight_versions: [{ version: 'v', start: 0, end: 1 }] }] },
    ];
    const bytes = [Buffer.from(events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join('') + 'data: [DONE]\n\n')];
    const whole = attemptAnswer('generate', bytes, true)!;
    expect(whole.prompt_token_ids).toEqual([9]);
    expect((whole.choices as Record<string, unknown>[])[0]).toMatchObject({ text: 'a', token_ids: [1], finish_reason: 'abort' });
    expect(attemptAnswer('generate', [Buffer.from('{"choices":')], false)).toBeNull();
  });

  it("the resumed request: the agent's budget less what was sampled, none when it is spent", () => {
    const r = request({ max_completion_tokens: 100, min_tokens: 10 });
    const next = resumedRequest(r, 30)!;
    expect(next.chat.max_tokens).toBe(70);
    expect(next.chat.max_completion_tokens).toBeUndefined();
    expect(next.chat.min_tokens).toBe(0);
    expect(resumedRequest(r, 100)).toBeNull();
    // Without a budget of the agent's the request asks for the rest of the context, which the longer prompt accounts for.
    expect(resumedRequest(request({}), 30)!.chat.max_tokens).toBeUndefined();
  });
});
