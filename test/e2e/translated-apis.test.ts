import Anthropic from '@anthropic-ai/sdk';
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import { renderPrompt } from '../support/fake-tokenizer';
import { startFakeModelServer, type Fault, type FakeModelServer, type ReceivedRequest } from '../support/fake-model-server';
import { calculatorAgentTool, calculatorAnthropicTool, calculatorResponsesTool as calculator, vllmCalculatorScript as script } from '../support/calculator';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

describe('Responses API and Anthropic Messages agents get exact token ids through a vLLM server (translated by the sidecar)', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  let fault: ((r: ReceivedRequest) => Fault | null) | null = null;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ strict: true, script, fault: (r) => fault?.(r) ?? null });
    // No flavor configured: the server is identified by itself.
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'auto' } } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });
  beforeEach(() => (fault = null));

  /** Chat requests the server received for a rollout's calls, in order (prompt ids are computed from them). */
  const chatPrompts = (from: number) =>
    upstream.requests
      .slice(from)
      .filter((r) => r.path === '/v1/chat/completions')
      .map((r) => renderPrompt((r.json!.messages ?? []) as never[]));

  async function transitionsOf(rollout: string, n: number) {
    expect((await postReward(sidecar.origin, rollout, 1)).status).toBe(202);
    const until = Date.now() + 10_000;
    while (sidecar.transitions().filter((t) => t.rollout_id === rollout).length < n && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    return sidecar.transitions().filter((t) => t.rollout_id === rollout);
  }

  it('openai responses.create and responses.stream in a tool loop: exact ids, the agent-facing bodies recorded', async () => {
    const from = upstream.requests.length;
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/resp-1/v1`, apiKey: 'k', maxRetries: 0 });
    const first = await client.responses.create({ model: 'fake-model', input: 'What is 2+2?', tools: [calculator] });
    const call = first.output.find((o) => o.type === 'function_call');
    expect(call).toMatchObject({ name: 'calculator', arguments: '{"expression":"2+2"}' });
    const stream = client.responses.stream({
      model: 'fake-model',
      tools: [calculator],
      input: [
        { role: 'user', content: 'What is 2+2?' },
        ...(first.output as OpenAI.Responses.ResponseInputItem[]),
        { type: 'function_call_output', call_id: call!.type === 'function_call' ? call!.call_id : '', output: '4' },
      ],
    });
    const final = await stream.finalResponse();
    expect(final.output_text).toBe('The answer is 4.');

    const prompts = chatPrompts(from);
    const ts = await transitionsOf('resp-1', 2);
    expect(ts.map((t) => [t.api, t.streamed, t.status])).toEqual([
      ['responses', false, 'ok'],
      ['responses', true, 'ok'],
    ]);
    expect(ts.map((t) => t.prompt_token_ids)).toEqual(prompts);
    expect(ts[1].continues_previous).toBe(true);
    for (const t of ts) {
      expect(t.translation).toEqual({ upstream_api: 'chat.completions', notes: [] });
      expect(t.response_token_ids?.length).toBeGreaterThan(0);
      expect(t.response_logprobs?.length).toBe(t.response_token_ids?.length);
    }
    // The record keeps what the agent sent and got.
    expect((ts[0].request as { input: string }).input).toBe('What is 2+2?');
    expect((ts[0].response as { object: string; output: { type: string }[] }).output[0].type).toBe('function_call');
    expect(ts[0].tool_calls.map((c) => c.name)).toEqual(['calculator']);
    expect((ts[1].response as { status: string }).status).toBe('completed');
  });

  it('Anthropic messages.create and messages.stream in a tool loop: exact ids', async () => {
    const from = upstream.requests.length;
    const client = new Anthropic({ baseURL: `${sidecar.origin}/rollout/anth-1`, apiKey: 'k', maxRetries: 0 });
    const tools = [calculatorAnthropicTool];
    const first = await client.messages.create({ model: 'fake-model', max_tokens: 64, tools, messages: [{ role: 'user', content: 'What is 2+2?' }] });
    const use = first.content.find((b) => b.type === 'tool_use');
    expect(use).toMatchObject({ name: 'calculator', input: { expression: '2+2' } });
    const final = await client.messages
      .stream({
        model: 'fake-model',
        max_tokens: 64,
        tools,
        messages: [
          { role: 'user', content: 'What is 2+2?' },
          { role: 'assistant', content: first.content },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: use!.type === 'tool_use' ? use!.id : '', content: '4' }] },
        ],
      })
      .finalMessage();
    expect(final.content.find((b) => b.type === 'text')).toMatchObject({ text: 'The answer is 4.' });

    const prompts = chatPrompts(from);
    const ts = await transitionsOf('anth-1', 2);
    expect(ts.map((t) => [t.api, t.streamed, t.status])).toEqual([
      ['anthropic.messages', false, 'ok'],
      ['anthropic.messages', true, 'ok'],
    ]);
    expect(ts.map((t) => t.prompt_token_ids)).toEqual(prompts);
    expect(ts[0].finish_reason).toBe('tool_calls');
  });

  let agentsClient: OpenAI | undefined;
  let currentRollout = '';
  it.each([false, true])('the OpenAI Agents SDK with its default model (the Responses API), streamed: %s: a tool loop with exact ids', async (streamed) => {
    setTracingDisabled(true);
    const rollout = `agents-${String(streamed)}`;
    const from = upstream.requests.length;
    // The SDK keeps the first default client it is given: one client, its rollout set per run.
    currentRollout = rollout;
    agentsClient ??= new OpenAI({
      baseURL: `${sidecar.origin}/rollout/ROLLOUT/v1`,
      apiKey: 'k',
      maxRetries: 0,
      fetch: (url, init) => fetch(String(url).replace('/ROLLOUT/', `/${currentRollout}/`), init),
    });
    setDefaultOpenAIClient(agentsClient);
    const calc = calculatorAgentTool();
    const agent = new Agent({ name: 'calc', instructions: 'Use the calculator.', tools: [calc] });
    let output: unknown;
    if (streamed) {
      const result = await run(agent, 'What is 2+2?', { stream: true });
      await result.completed;
      output = result.finalOutput;
    } else output = (await run(agent, 'What is 2+2?')).finalOutput;
    expect(output).toBe('The answer is 4.');
    const prompts = chatPrompts(from);
    const ts = await transitionsOf(rollout, 2);
    expect(ts.map((t) => [t.api, t.streamed, t.status])).toEqual([
      ['responses', streamed, 'ok'],
      ['responses', streamed, 'ok'],
    ]);
    expect(ts.map((t) => t.prompt_token_ids)).toEqual(prompts);
    expect(ts[1].continues_previous).toBe(true);
  });

  it('what does not map passes through untouched and says why; upstream errors reach the SDK as its own errors', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/resp-2/v1`, apiKey: 'k', maxRetries: 0 });
    // previous_response_id needs server-side state: not translated; vLLM-like has no /v1/responses → 404 as it is.
    await expect(client.responses.create({ model: 'fake-model', input: 'hi', previous_response_id: 'resp_x' })).rejects.toMatchObject({ status: 404 });
    fault = () => ({
      kind: 'status',
      status: 400,
      body: JSON.stringify({ object: 'error', message: 'max_tokens is too large', type: 'BadRequestError', code: 400 }),
    });
    await expect(client.responses.create({ model: 'fake-model', input: 'hi' })).rejects.toMatchObject({ status: 400 });
    fault = null;
    const ts = await transitionsOf('resp-2', 2);
    expect(ts[0]).toMatchObject({ prompt_token_ids: null, translation: null, token_ids_missing: 'not translated: previous_response_id' });
    expect(ts[1]).toMatchObject({ status: 'error', http_status: 400 });
  });
});
