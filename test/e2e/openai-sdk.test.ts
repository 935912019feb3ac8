import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { logprobOf, renderPrompt } from '../support/fake-tokenizer';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

const tools = [
  {
    type: 'function' as const,
    function: {
      name: 'calculator',
      description: 'evaluates arithmetic',
      parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
    },
  },
];

describe('the proxy with the real openai SDK in front of a vLLM-like server', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;

  beforeEach(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
  });
  afterEach(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  async function runAgent(client: OpenAI, stream: boolean): Promise<void> {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 2+2?' }];
    for (let step = 0; step < 3; step++) {
      let message: OpenAI.Chat.ChatCompletionMessage;
      if (stream) {
        const s = client.chat.completions.stream({ model: 'policy', messages, tools });
        message = (await s.finalChatCompletion()).choices[0].message;
      } else {
        message = (await client.chat.completions.create({ model: 'policy', messages, tools })).choices[0].message;
      }
      messages.push(message as OpenAI.Chat.ChatCompletionMessageParam);
      if (!message.tool_calls?.length) return;
      for (const tc of message.tool_calls) messages.push({ role: 'tool', tool_call_id: tc.id, content: '4' });
    }
    throw new Error('agent did not finish');
  }

  it.each([false, true])('records each call of a tool-using agent with exact token ids (stream=%s)', async (stream) => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/r-1/attempt/a-1/v1`, apiKey: 'sk-test-secret-123', maxRetries: 0 });
    await runAgent(client, stream);
    expect((await postReward(sidecar.origin, 'r-1', 0.75, { attempt_id: 'a-1' })).status).toBe(202);
    const [episode] = await sidecar.waitForEpisodes(1);
    expect(episode).toMatchObject({ rollout_id: 'r-1', attempt_id: 'a-1', episode_status: 'completed', final_reward: 0.75, transitions: 2 });
    const ts = sidecar.transitions();
    expect(ts.map((t) => t.transition_id)).toEqual(['r-1/a-1/0', 'r-1/a-1/1']);
    expect(ts.map((t) => t.streamed)).toEqual([stream, stream]);
    // The server saw the injected fields; the transition says so.
    expect(upstream.requests[0].json).toMatchObject({ return_token_ids: true, logprobs: true });
    expect(ts[0].injected.sort()).toEqual(['logprobs', 'return_token_ids']);
    for (const [i, t] of ts.entries()) {
      const sent = upstream.requests[i].json as { messages: never[] };
      expect(t.prompt_token_ids).toEqual(renderPrompt(sent.messages));
      expect(t.response_token_ids!.length).toBeGreaterThan(0);
      expect(t.response_logprobs).toEqual(t.response_token_ids!.map((id, p) => logprobOf(id, p)));
      expect(t.reward).toBe(0.75);
    }
    expect(ts[0].tool_calls).toEqual([{ id: expect.any(String), name: 'calculator', status: null, reward: null, span_id: null, join: null }]);
    expect(ts[0].finish_reason).toBe('tool_calls');
    expect(ts[1].continues_previous).toBe(true);
    expect(ts[1].is_last).toBe(true);
  });
});
