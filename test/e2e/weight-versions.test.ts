import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { CALCULATOR_TOOLS, startQwen3Server, type ChatMessage, type Qwen3Server } from '../support/qwen3-server';
import { rewardedTrajectories as trajectoriesOf, startSidecar, type TestSidecar } from '../support/sidecar';

// Per-token weight versions (async RL: the weights change while a rollout runs): the servers say
// which weights sampled which output tokens (vLLM's `weight_versions` spans, SGLang's
// `weight_version`), and the trajectory gives them as spans over its own token positions.

async function toolLoop(baseURL: string): Promise<void> {
  const client = new OpenAI({ baseURL, apiKey: 'sk-test', maxRetries: 0 });
  const messages: ChatMessage[] = [{ role: 'user', content: 'Compute 3*4 and 7+8.' }];
  for (let step = 0; step < 4; step++) {
    const m = (await client.chat.completions.create({ model: 'Qwen/Qwen3-8B', messages: messages as never, tools: CALCULATOR_TOOLS })).choices[0].message;
    const calls = (m.tool_calls ?? []).flatMap((t) => (t.type === 'function' ? [t] : []));
    messages.push({ role: 'assistant', content: m.content, ...(calls.length > 0 ? { tool_calls: calls as never } : {}) });
    if (calls.length === 0) return;
    for (const c of calls) messages.push({ role: 'tool', tool_call_id: c.id, content: '12' });
  }
}

describe('weight versions on trajectories', () => {
  let qwen: Qwen3Server;
  let sglang: FakeModelServer;
  const sidecars: TestSidecar[] = [];
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await Promise.all([qwen?.close(), sglang?.close()]);
  });

  it('vLLM spans, token-in: each call’s spans shifted to its sampled ids; an update inside a call splits it; equal neighbours merge', async () => {
    // Answer 0 by v1; answer 1 crosses the update from v1 to v2 after 3 tokens; later answers by v2.
    qwen = await startQwen3Server({
      weightVersions: (answer, n) =>
        answer === 0
          ? [{ version: 'v1', start: 0, end: n }]
          : answer === 1
            ? [
                { version: 'v1', start: 0, end: 3 },
                { version: 'v2', start: 3, end: n },
              ]
            : [{ version: 'v2', start: 0, end: n }],
    });
    const sidecar = await startSidecar(qwen.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: true } } } });
    sidecars.push(sidecar);
    await toolLoop(`${sidecar.origin}/rollout/wv-vllm/v1`);
    const [t, ...more] = await trajectoriesOf(sidecar, 'wv-vllm');
    expect(more).toEqual([]);
    expect(t.turns.length).toBe(3);
    const [a, b, c] = t.turns;
    expect(t.weight_versions).toEqual([
      { version: 'v1', start: a.response_start, end: a.response_end },
      { version: 'v1', start: b.response_start, end: b.response_start + 3 },
      { version: 'v2', start: b.response_start + 3, end: b.response_end },
      { version: 'v2', start: c.response_start, end: c.response_end },
    ]);
    // Right before `turns`.
    const keys = Object.keys(t);
    expect(keys[keys.indexOf('turns') - 1]).toBe('weight_versions');
  }, 30_000);

  it('SGLang’s one version per answer covers each call’s sampled ids; a server that says nothing adds no key', async () => {
    sglang = await startFakeModelServer({ flavor: 'sglang', sglangWeightVersion: '41' });
    const sidecar = await startSidecar(sglang.url, { receivers: { llm_proxy: { upstream_flavor: 'sglang' } } });
    sidecars.push(sidecar);
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/wv-sglang/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const tools = [
      { type: 'function' as const, function: { name: 'calculator', parameters: { type: 'object', properties: { expression: { type: 'string' } } } } },
    ];
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 2+2?' }];
    const first = (await client.chat.completions.create({ model: 'fake-model', messages, tools })).choices[0].message;
    messages.push(first, { role: 'tool', tool_call_id: first.tool_calls![0].id, content: '4' });
    await client.chat.completions.create({ model: 'fake-model', messages, tools });
    const [t] = await trajectoriesOf(sidecar, 'wv-sglang');
    expect(t.weight_versions).toEqual(t.turns.map((u) => ({ version: '41', start: u.response_start, end: u.response_end })));
    // A server that says nothing: no key, the trajectory as it was.
    const plain = await startQwen3Server();
    const silent = await startSidecar(plain.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    sidecars.push(silent);
    try {
      await toolLoop(`${silent.origin}/rollout/wv-none/v1`);
      const none = await trajectoriesOf(silent, 'wv-none');
      expect(none.length).toBeGreaterThan(0);
      for (const x of none) expect('weight_versions' in x).toBe(false);
    } finally {
      await silent.stop();
      sidecars.splice(sidecars.indexOf(silent), 1);
      await plain.close();
    }
  }, 30_000);
});
