import OpenAI from 'openai';
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled } from '@openai/agents';
import type { ReceivedRequest } from '../../../support/fake-model-server';
import { calculatorAgentTool, calculatorResponsesTool as calculator } from '../../../support/calculator';
import { useTranslatingSidecar } from '../../../support/translating-sidecar';

// The real sidecar translates (receivers.llm_proxy.translate) in front of a vLLM-like server.
const h = useTranslatingSidecar();
beforeAll(() => setTracingDisabled(true));

// One client for the file (the agents SDK keeps the first default client it is given); its fetch
// sends to the current test's rollout.
let openai: OpenAI | undefined;
const client = () => (openai ??= new OpenAI({ baseURL: `${h.baseUrl}/v1`, apiKey: 'test-key', maxRetries: 0, fetch: h.fetch }));
const chatRequests = () => h.chatRequests();

describe('Responses API through chat completions, read by the real openai SDK', () => {
  it('responses.create: text answer, usage from the server, output_text assembled by the SDK', async () => {
    const r = await client().responses.create({ model: 'fake-model', instructions: 'Be brief.', input: 'Say hello.' });
    expect(r.object).toBe('response');
    expect(r.status).toBe('completed');
    expect(r.output_text).toBe('Hello from vLLM.');
    expect(r.id).toMatch(/^resp_/);
    expect(r.usage?.input_tokens).toBeGreaterThan(0);
    expect(r.usage!.total_tokens).toBe(r.usage!.input_tokens + r.usage!.output_tokens);
    const sent = chatRequests()[0].json!;
    expect(sent.messages).toEqual([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'Say hello.' },
    ]);
    expect((await h.calls(1))[0].translation).toEqual({ upstream_api: 'chat.completions', notes: [] });
  });

  it('a multi-turn tool loop: call_id is the chat tool call id, and each prompt continues the previous prompt and answer', async () => {
    const c = client();
    const first = await c.responses.create({ model: 'fake-model', input: 'What is 2+2?', tools: [calculator] });
    const call = first.output.find((o) => o.type === 'function_call');
    expect(call).toMatchObject({ type: 'function_call', name: 'calculator', arguments: '{"expression":"2+2"}' });
    const upstreamCallId = (JSON.parse(h.received[0].text) as { output: { call_id?: string }[] }).output[0].call_id;
    expect(call!.type === 'function_call' && call!.call_id).toBe(upstreamCallId);
    expect(upstreamCallId).toMatch(/^chatcmpl-tool-/);

    const second = await c.responses.create({
      model: 'fake-model',
      tools: [calculator],
      input: [
        { role: 'user', content: 'What is 2+2?' },
        ...first.output,
        { type: 'function_call_output', call_id: call!.type === 'function_call' ? call!.call_id : '', output: '4' },
      ],
    } as never);
    expect(second.output_text).toBe('The answer is 4.');
    const [req1, req2] = chatRequests();
    expect(req2.json!.messages).toEqual([
      { role: 'user', content: 'What is 2+2?' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: upstreamCallId, type: 'function', function: { name: 'calculator', arguments: '{"expression":"2+2"}' } }],
      },
      { role: 'tool', tool_call_id: upstreamCallId, content: '4' },
    ]);
    // Exact token ids: the second prompt is the first prompt plus the first answer's tokens.
    const answer1 = await tokenIdsOf(req1);
    const prompt2 = await promptIdsOf(req2);
    expect(prompt2.slice(0, answer1.prompt.length + answer1.completion.length)).toEqual([...answer1.prompt, ...answer1.completion]);
  });

  it('responses.stream: the SDK accepts the event sequence, and finalResponse equals the non-streamed answer', async () => {
    const c = client();
    const events: string[] = [];
    const deltas: string[] = [];
    const stream = c.responses.stream({ model: 'fake-model', input: 'Say hello.' });
    stream.on('event', (e) => events.push(e.type));
    stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
    const final = await stream.finalResponse();
    expect(final.output_text).toBe('Hello from vLLM.');
    expect(deltas.join('')).toBe('Hello from vLLM.');
    expect(events[0]).toBe('response.created');
    expect(events[1]).toBe('response.in_progress');
    expect(events.slice(2, 4)).toEqual(['response.output_item.added', 'response.content_part.added']);
    expect(events.slice(-4)).toEqual(['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.completed']);
    expect(final.usage?.output_tokens).toBeGreaterThan(0);
    const sent = chatRequests()[0].json!;
    expect(sent.stream).toBe(true);
    expect(sent.stream_options).toEqual({ include_usage: true });
    await h.received[0].done;
    const seqs = [...h.received[0].text.matchAll(/"sequence_number":(\d+)/g)].map((m) => Number(m[1]));
    expect(seqs).toEqual(seqs.map((_, i) => i));
  });

  it('responses.stream with a tool call: argument deltas, then the full call in the final response', async () => {
    const argDeltas: string[] = [];
    const stream = client().responses.stream({ model: 'fake-model', input: 'What is 2+2?', tools: [calculator] });
    stream.on('response.function_call_arguments.delta', (e) => argDeltas.push(e.delta));
    const final = await stream.finalResponse();
    expect(argDeltas.join('')).toBe('{"expression":"2+2"}');
    expect(final.output).toHaveLength(1);
    expect(final.output[0]).toMatchObject({ type: 'function_call', name: 'calculator', arguments: '{"expression":"2+2"}', status: 'completed' });
  });

  it('reasoning the server separated comes back as a reasoning item, and goes back upstream as the assistant message reasoning', async () => {
    h.script = (r) => ((r.json!.messages as unknown[]).length > 1 ? { content: 'Still 4.' } : { reasoning: 'two plus two is four', content: 'It is 4.' });
    const c = client();
    for (const streamed of [false, true]) {
      h.upstream.requests.length = 0;
      const first = streamed
        ? await c.responses.stream({ model: 'fake-model', input: 'What is 2+2?' }).finalResponse()
        : await c.responses.create({ model: 'fake-model', input: 'What is 2+2?' });
      expect(first.output.map((o) => o.type)).toEqual(['reasoning', 'message']);
      expect(first.output[0]).toMatchObject({ type: 'reasoning', content: [{ type: 'reasoning_text', text: 'two plus two is four' }] });
      expect(first.output_text).toBe('It is 4.');
      await c.responses.create({
        model: 'fake-model',
        input: [{ role: 'user', content: 'What is 2+2?' }, ...first.output, { role: 'user', content: 'Sure?' }],
      } as never);
      expect(chatRequests()[1].json!.messages).toEqual([
        { role: 'user', content: 'What is 2+2?' },
        { role: 'assistant', content: 'It is 4.', reasoning: 'two plus two is four' },
        { role: 'user', content: 'Sure?' },
      ]);
    }
  });

  it('malformed tool arguments pass through as the model wrote them, streamed and not, and are noted', async () => {
    h.script = () => ({ toolCalls: [{ name: 'calculator', arguments: '{"expression": "2+2"' }] });
    const c = client();
    // Not strict: for strict tools the SDK's stream helper parses arguments itself, as it trusts OpenAI's strict mode.
    const loose = { ...calculator, strict: false };
    const plain = await c.responses.create({ model: 'fake-model', input: 'x', tools: [loose] });
    expect(plain.output[0]).toMatchObject({ type: 'function_call', arguments: '{"expression": "2+2"' });
    const streamed = await c.responses.stream({ model: 'fake-model', input: 'x', tools: [loose] }).finalResponse();
    expect(streamed.output[0]).toMatchObject({ type: 'function_call', arguments: '{"expression": "2+2"' });
    const calls = await h.calls(2);
    expect(calls).toHaveLength(2);
    expect(calls[0].translation?.notes[0]).toMatch(/^malformed_tool_arguments:/);
    expect(calls[1].translation?.notes[0]).toMatch(/^malformed_tool_arguments:/);
  });

  it('finish_reason length is an incomplete response with max_output_tokens as the reason', async () => {
    h.script = () => ({ content: 'cut', finishReason: 'length' });
    const r = await client().responses.create({ model: 'fake-model', input: 'x', max_output_tokens: 1 });
    expect(r.status).toBe('incomplete');
    expect(r.incomplete_details).toEqual({ reason: 'max_output_tokens' });
    expect(chatRequests()[0].json!.max_tokens).toBe(1);
  });

  it('include message.output_text.logprobs: logprobs on the output text from the chat logprobs', async () => {
    const r = await client().responses.create({ model: 'fake-model', input: 'Say hello.', include: ['message.output_text.logprobs'] });
    const part = r.output[0].type === 'message' ? r.output[0].content[0] : null;
    expect(part && part.type === 'output_text' && part.logprobs?.length).toBeGreaterThan(0);
    expect(part && part.type === 'output_text' && part.logprobs?.[0]).toMatchObject({ token: 'Hello', logprob: expect.any(Number) });
  });

  it('an unmappable request passes through untouched (vLLM-like upstream answers 404 there), with the reason recorded', async () => {
    await expect(client().responses.create({ model: 'fake-model', input: 'x', previous_response_id: 'resp_1' })).rejects.toMatchObject({ status: 404 });
    expect((await h.calls(1))[0]).toMatchObject({ translation: null, token_ids_missing: 'not translated: previous_response_id' });
    expect(h.upstream.requests[0].path).toBe('/v1/responses');
  });
});

describe('upstream failures reach the Responses SDK as the errors it expects', () => {
  it('an upstream 400 is a BadRequestError with the upstream message', async () => {
    h.fault = () => ({
      kind: 'status',
      status: 400,
      body: JSON.stringify({ error: { message: "This model's maximum context length is 32768 tokens.", type: 'BadRequestError', param: null, code: 400 } }),
    });
    await expect(client().responses.create({ model: 'fake-model', input: 'x' })).rejects.toMatchObject({
      status: 400,
      message: expect.stringContaining('maximum context length'),
    });
  });

  it('an upstream 500 with a non-JSON body keeps its status and text', async () => {
    h.fault = () => ({ kind: 'status', status: 500, body: 'Internal Server Error', contentType: 'text/plain' });
    await expect(client().responses.create({ model: 'fake-model', input: 'x' })).rejects.toMatchObject({
      status: 500,
      message: expect.stringContaining('Internal Server Error'),
    });
  });

  it('a 200 whose body is not a chat completion is a 502, not a hang', async () => {
    h.fault = (r) => (r.path === '/v1/chat/completions' ? { kind: 'non-json', body: '<html>proxy error</html>' } : null);
    await expect(client().responses.create({ model: 'fake-model', input: 'x' })).rejects.toMatchObject({ status: 502 });
  });

  it('an error in the middle of the stream ends it with an error event the SDK raises', async () => {
    h.fault = () => ({ kind: 'stream-error', afterEvents: 3, message: 'engine died' });
    await expect(client().responses.stream({ model: 'fake-model', input: 'Say hello.' }).finalResponse()).rejects.toThrow('engine died');
    await h.received[0].done;
    expect(h.received[0].text).toMatch(/event: error\ndata: \{"type":"error","sequence_number":\d+,"code":"server_error","message":"engine died"/);
  });

  it('an upstream connection dropped mid-stream ends it with an error event the SDK raises', async () => {
    h.fault = () => ({ kind: 'reset-mid-stream', afterEvents: 2 });
    await expect(client().responses.stream({ model: 'fake-model', input: 'Say hello.' }).finalResponse()).rejects.toThrow(/closed the stream before its end/);
  });
});

describe('@openai/agents with its default (Responses) model through the translation', () => {
  const calc = calculatorAgentTool();

  it('a stream that fails upstream surfaces as an error from run(), not a hang', async () => {
    setDefaultOpenAIClient(client());
    h.fault = () => ({ kind: 'stream-error', afterEvents: 2, message: 'engine died' });
    const agent = new Agent({ name: 'calc', instructions: 'Use the calculator.', tools: [calc] });
    const result = await run(agent, 'What is 2+2?', { stream: true });
    await expect(result.completed).rejects.toThrow(/engine died/);
    expect(await h.calls(1)).toHaveLength(1);
  });

  it.each([false, true])('runs a tool loop to the final answer (streamed: %s), every call translated', async (stream) => {
    setDefaultOpenAIClient(client());
    const agent = new Agent({ name: 'calc', instructions: 'Use the calculator.', tools: [calc] });
    let finalOutput: unknown;
    if (stream) {
      const result = await run(agent, 'What is 2+2?', { stream: true });
      await result.completed;
      finalOutput = result.finalOutput;
    } else {
      finalOutput = (await run(agent, 'What is 2+2?')).finalOutput;
    }
    expect(finalOutput).toBe('The answer is 4.');
    const calls = await h.calls(2);
    expect(calls).toHaveLength(2);
    // The default model's settings (reasoning effort, text verbosity) do not stop the translation.
    expect(calls[0].request).toMatchObject({ model: expect.stringMatching(/^gpt-/), reasoning: expect.any(Object), text: { verbosity: 'low' } });
    expect(calls.every((c) => c.translation !== null)).toBe(true);
    const [req1, req2] = chatRequests();
    const messages2 = req2.json!.messages as { role: string; content?: unknown; tool_call_id?: string }[];
    expect(messages2.map((m) => m.role)).toEqual(['system', 'user', 'assistant', 'tool']);
    expect(messages2[3].content).toBe('4');
    const answer1 = await tokenIdsOf(req1);
    const prompt2 = await promptIdsOf(req2);
    expect(prompt2.slice(0, answer1.prompt.length + answer1.completion.length)).toEqual([...answer1.prompt, ...answer1.completion]);
  });
});

/** Replays a recorded upstream request against the vLLM-like server to read its token ids. */
async function tokenIdsOf(r: ReceivedRequest): Promise<{ prompt: number[]; completion: number[] }> {
  const res = await fetch(`${h.upstream.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...r.json, stream: false, stream_options: undefined, return_token_ids: true }),
  });
  const body = (await res.json()) as { prompt_token_ids: number[]; choices: { token_ids: number[] }[] };
  h.upstream.requests.pop();
  return { prompt: body.prompt_token_ids, completion: body.choices[0].token_ids };
}

async function promptIdsOf(r: ReceivedRequest): Promise<number[]> {
  return (await tokenIdsOf(r)).prompt;
}
