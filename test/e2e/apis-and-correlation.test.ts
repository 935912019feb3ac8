import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { logprobOf, renderPrompt, tokenize } from '../support/fake-tokenizer';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

let upstream: FakeModelServer;
let sidecar: TestSidecar;

async function setup(flavor: 'vllm' | 'sglang' | 'openai', proxyFlavor: 'vllm' | 'sglang' | 'openai' = flavor): Promise<void> {
  upstream = await startFakeModelServer({ flavor });
  // These suites record each API as the fake server speaks it natively (translation has its own tests).
  sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: proxyFlavor, translate: [] } } });
}

afterEach(async () => {
  await sidecar?.stop();
  await upstream?.close();
});

const endRollout = (id: string, attempt = '0') =>
  fetch(`${sidecar.origin}/lightning/v1/rollouts/${id}/end`, { method: 'POST', body: JSON.stringify({ attempt_id: attempt }) });

describe('correlation of proxied calls to rollouts', () => {
  beforeEach(() => setup('vllm'));

  const ask = (client: OpenAI, headers: Record<string, string> = {}) =>
    client.chat.completions.create({ model: 'policy', messages: [{ role: 'user', content: 'hello' }] }, { headers });

  it('takes rollout and attempt from our path prefix, and group and agent from headers', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/ro-7/attempt/2/v1`, apiKey: 'k', maxRetries: 0 });
    await ask(client, { 'x-group-id': 'task-9', 'x-agent-name': 'writer' });
    await ask(client);
    await endRollout('ro-7', '2');
    await sidecar.waitForEpisodes(1);
    const ts = sidecar.transitions();
    expect(ts.map((t) => t.transition_id)).toEqual(['ro-7/2/0', 'ro-7/2/1']);
    expect(ts[0]).toMatchObject({ group_id: 'task-9', agent_name: 'writer' });
    expect(sidecar.episodes()[0].group_id).toBe('task-9');
    expect(upstream.requests[0].path).toBe('/v1/chat/completions');
  });

  it("takes rollout and attempt from agent-lightning v1's gateway path", async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/proxy/rollout/agl-1/attempt/0/mode/train/openai/v1`, apiKey: 'k', maxRetries: 0 });
    await ask(client);
    await endRollout('agl-1');
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0].transition_id).toBe('agl-1/0/0');
    expect(upstream.requests[0].path).toBe('/v1/chat/completions');
  });

  it('uses the /rollout/{id}/v1 prefix with attempt "0"', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/short-1/v1`, apiKey: 'k', maxRetries: 0 });
    await ask(client);
    await endRollout('short-1');
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0].transition_id).toBe('short-1/0/0');
  });

  it('takes ids from x-rollout-id / x-attempt-id / x-task-id headers', async () => {
    const client = new OpenAI({ baseURL: sidecar.baseUrl, apiKey: 'k', maxRetries: 0 });
    await ask(client, { 'x-rollout-id': 'hdr-1', 'x-attempt-id': '3', 'x-task-id': 'task-1' });
    await endRollout('hdr-1', '3');
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0]).toMatchObject({ transition_id: 'hdr-1/3/0', group_id: 'task-1' });
  });

  it('takes ids from W3C baggage when there is no header', async () => {
    const client = new OpenAI({ baseURL: sidecar.baseUrl, apiKey: 'k', maxRetries: 0 });
    await ask(client, { baggage: 'other=1,lightning.rollout_id=bag-1;p=x,lightning.group_id=g%2D1,lightning.agent_name=checker' });
    await endRollout('bag-1');
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0]).toMatchObject({ rollout_id: 'bag-1', group_id: 'g-1', agent_name: 'checker' });
  });

  it('uses the traceparent trace id as the rollout id when nothing else names one', async () => {
    const client = new OpenAI({ baseURL: sidecar.baseUrl, apiKey: 'k', maxRetries: 0 });
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    await ask(client, { traceparent: `00-${traceId}-00f067aa0ba902b7-01` });
    await endRollout(traceId);
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0]).toMatchObject({ rollout_id: traceId, trace_id: traceId, span_id: '00f067aa0ba902b7' });
  });

  it('makes a call with no correlation at all its own one-call rollout, closed when the call ends', async () => {
    const client = new OpenAI({ baseURL: sidecar.baseUrl, apiKey: 'k', maxRetries: 0 });
    await ask(client);
    await ask(client);
    // Nothing can name a made-up rollout id again: no idle timeout to wait for.
    await sidecar.waitForEpisodes(2);
    expect(sidecar.app.pipeline.assembler.openCount).toBe(0);
    const [a, b] = sidecar.transitions();
    expect(a.rollout_id).toMatch(/^call-/);
    expect(b.rollout_id).toMatch(/^call-/);
    expect(a.rollout_id).not.toBe(b.rollout_id);
    expect(a).toMatchObject({ seq: 0, is_last: true, episode_status: 'completed', final_reward: null });
    expect(sidecar.episodes().map((e) => e.episode_status)).toEqual(['completed', 'completed']);
  });
});

describe('n > 1', () => {
  beforeEach(() => setup('vllm'));

  it('yields one transition per choice with a .{choice} suffix', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/multi/v1`, apiKey: 'k', maxRetries: 0 });
    const res = await client.chat.completions.create({ model: 'policy', n: 3, messages: [{ role: 'user', content: 'write' }] });
    expect(res.choices).toHaveLength(3);
    await postReward(sidecar.origin, 'multi', 1);
    await sidecar.waitForEpisodes(1);
    const ts = sidecar.transitions();
    expect(ts.map((t) => t.transition_id)).toEqual(['multi/0/0.0', 'multi/0/0.1', 'multi/0/0.2']);
    expect(new Set(ts.map((t) => JSON.stringify(t.response_token_ids))).size).toBe(3);
    for (const t of ts) expect(t.prompt_token_ids).toEqual(renderPrompt([{ role: 'user', content: 'write' }]));
  });
});

describe('SGLang flavor', () => {
  beforeEach(() => setup('sglang'));

  it('reads per-choice prompt_token_ids and token_ids', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/sg/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'policy', messages: [{ role: 'user', content: 'hello' }] });
    await endRollout('sg');
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(upstream.requests[0].json).toMatchObject({ return_token_ids: true, return_prompt_token_ids: true, logprobs: true });
    expect(t.prompt_token_ids).toEqual(renderPrompt([{ role: 'user', content: 'hello' }]));
    expect(t.response_token_ids).toEqual([...tokenize('Hello from the fake model.'), 2]);
  });
});

describe('openai flavor (no injection)', () => {
  beforeEach(() => setup('openai'));

  it('forwards the body untouched and records null token ids', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/plain/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'gpt', messages: [{ role: 'user', content: 'hello' }] });
    await endRollout('plain');
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(upstream.requests[0].json).not.toHaveProperty('return_token_ids');
    expect(t).toMatchObject({ prompt_token_ids: null, response_token_ids: null, response_logprobs: null, injected: [] });
  });
});

describe('completions and responses APIs', () => {
  beforeEach(() => setup('vllm'));

  it.each([false, true])('records /v1/completions with token ids and token_logprobs (stream=%s)', async (stream) => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/cmp/v1`, apiKey: 'k', maxRetries: 0 });
    if (stream) {
      const s = await client.completions.create({ model: 'policy', prompt: 'Once upon a time', stream: true });
      for await (const _ of s) void _;
    } else {
      await client.completions.create({ model: 'policy', prompt: 'Once upon a time' });
    }
    await endRollout('cmp');
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(upstream.requests[0].json).toMatchObject({ return_token_ids: true, logprobs: 0 });
    expect(t.api).toBe('completions');
    expect(t.prompt_token_ids).toEqual(tokenize('Once upon a time'));
    expect(t.response_token_ids).toEqual(tokenize('Hello from the fake model.'));
    expect(t.response_logprobs).toEqual(t.response_token_ids!.map((id, p) => logprobOf(id, p)));
  });

  it.each([false, true])('records /v1/responses function calls (stream=%s)', async (stream) => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/resp/v1`, apiKey: 'k', maxRetries: 0 });
    const tools = [
      { type: 'function' as const, name: 'calculator', parameters: { type: 'object', properties: { expression: { type: 'string' } } }, strict: false },
    ];
    if (stream) {
      const s = client.responses.stream({ model: 'policy', input: 'What is 2+2?', tools });
      await s.finalResponse();
    } else {
      await client.responses.create({ model: 'policy', input: 'What is 2+2?', tools });
    }
    await endRollout('resp');
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(t).toMatchObject({ api: 'responses', streamed: stream, status: 'ok', finish_reason: 'tool_calls' });
    expect(t.tool_calls).toEqual([expect.objectContaining({ name: 'calculator', id: expect.stringMatching(/^call_/) })]);
    expect((t.response as { status: string }).status).toBe('completed');
  });
});

describe('the Anthropic SDK on /v1/messages', () => {
  beforeEach(() => setup('vllm'));

  it.each([false, true])('records tool_use blocks and usage (stream=%s)', async (stream) => {
    const client = new Anthropic({ baseURL: `${sidecar.origin}/rollout/anth`, apiKey: 'sk-ant-secret-456', maxRetries: 0 });
    const tools = [{ name: 'calculator', description: 'math', input_schema: { type: 'object' as const, properties: { expression: { type: 'string' } } } }];
    const params = { model: 'claude-policy', max_tokens: 256, messages: [{ role: 'user' as const, content: 'What is 2+2?' }], tools };
    let msg: Anthropic.Message;
    if (stream) msg = await client.messages.stream(params).finalMessage();
    else msg = await client.messages.create(params);
    expect(msg.stop_reason).toBe('tool_use');
    const toolUse = msg.content.find((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock;
    expect(toolUse.input).toEqual({ expression: '2+2' });
    await endRollout('anth');
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(t).toMatchObject({ api: 'anthropic.messages', streamed: stream, status: 'ok', finish_reason: 'tool_use', model: 'claude-policy' });
    expect(t.tool_calls).toEqual([expect.objectContaining({ id: toolUse.id, name: 'calculator' })]);
    expect((t.response as { content: unknown[] }).content).toEqual(msg.content);
    expect(upstream.requests[0].headers.authorization).toBe('Bearer sk-ant-secret-456');
  });
});
