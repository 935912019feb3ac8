import Anthropic from '@anthropic-ai/sdk';
import type { ReceivedRequest } from '../../../support/fake-model-server';
import { calculatorAnthropicTool as calculator } from '../../../support/calculator';
import { useTranslatingSidecar } from '../../../support/translating-sidecar';

// The real sidecar translates (receivers.llm_proxy.translate) in front of a vLLM-like server.
const h = useTranslatingSidecar();

const client = () => new Anthropic({ baseURL: h.baseUrl, apiKey: 'test-key', maxRetries: 0, fetch: h.fetch });
const chatRequests = () => h.chatRequests();

async function turn(c: Anthropic, stream: boolean, params: Anthropic.MessageCreateParamsNonStreaming): Promise<Anthropic.Message> {
  return stream ? c.messages.stream(params).finalMessage() : c.messages.create(params);
}

describe('Anthropic Messages through chat completions, read by the real @anthropic-ai/sdk', () => {
  it.each([false, true])(
    'a two-turn tool loop (streamed: %s): tool_use with parsed input, tool_result mapped back, exact prompt continuity',
    async (stream) => {
      const c = client();
      const messages: Anthropic.MessageParam[] = [{ role: 'user', content: 'What is 2+2?' }];
      const first = await turn(c, stream, { model: 'fake-model', max_tokens: 256, system: 'Use tools.', messages, tools: [calculator] });
      expect(first.type).toBe('message');
      expect(first.role).toBe('assistant');
      expect(first.stop_reason).toBe('tool_use');
      expect(first.content).toHaveLength(1);
      const use = first.content[0] as Anthropic.ToolUseBlock;
      expect(use).toMatchObject({ type: 'tool_use', name: 'calculator', input: { expression: '2+2' } });
      expect(use.id).toMatch(/^chatcmpl-tool-/);
      expect(first.usage.input_tokens).toBeGreaterThan(0);
      expect(first.usage.output_tokens).toBeGreaterThan(0);

      messages.push({ role: 'assistant', content: first.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '4' }] });
      const second = await turn(c, stream, { model: 'fake-model', max_tokens: 256, system: 'Use tools.', messages, tools: [calculator] });
      expect(second.stop_reason).toBe('end_turn');
      expect(second.content).toEqual([{ type: 'text', text: 'The answer is 4.' }]);

      const [req1, req2] = chatRequests();
      expect(req1.json).toMatchObject({
        max_tokens: 256,
        tools: [{ type: 'function', function: { name: 'calculator', parameters: calculator.input_schema } }],
      });
      if (stream) expect(req1.json).toMatchObject({ stream: true, stream_options: { include_usage: true } });
      expect(req2.json!.messages).toEqual([
        { role: 'system', content: 'Use tools.' },
        { role: 'user', content: 'What is 2+2?' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: use.id, type: 'function', function: { name: 'calculator', arguments: '{"expression":"2+2"}' } }],
        },
        { role: 'tool', tool_call_id: use.id, content: '4' },
      ]);
      const a1 = await tokenIdsOf(req1);
      const a2 = await tokenIdsOf(req2);
      expect(a2.prompt.slice(0, a1.prompt.length + a1.completion.length)).toEqual([...a1.prompt, ...a1.completion]);
    },
  );

  it('messages.stream: text deltas reach the SDK and finalText equals the answer', async () => {
    const deltas: string[] = [];
    const stream = client().messages.stream({ model: 'fake-model', max_tokens: 64, messages: [{ role: 'user', content: 'Say hello.' }] });
    stream.on('text', (d) => deltas.push(d));
    expect(await stream.finalText()).toBe('Hello from vLLM.');
    expect(deltas.join('')).toBe('Hello from vLLM.');
    await h.received[0].done;
    const events = [...h.received[0].text.matchAll(/^event: (\S+)$/gm)].map((m) => m[1]);
    expect(events[0]).toBe('message_start');
    expect(events.slice(-3)).toEqual(['content_block_stop', 'message_delta', 'message_stop']);
  });

  it('text before a tool call: a text block then a tool_use block, streamed and not', async () => {
    h.script = () => ({ content: 'Let me compute.', toolCalls: [{ name: 'calculator', arguments: { expression: '2+2' } }] });
    for (const stream of [false, true]) {
      const m = await turn(client(), stream, { model: 'fake-model', max_tokens: 64, messages: [{ role: 'user', content: 'x' }], tools: [calculator] });
      expect(m.content.map((b) => b.type)).toEqual(['text', 'tool_use']);
      expect((m.content[0] as Anthropic.TextBlock).text).toBe('Let me compute.');
      expect((m.content[1] as Anthropic.ToolUseBlock).input).toEqual({ expression: '2+2' });
    }
  });

  it('malformed tool arguments become input {} (streamed and not), noted, and never break the SDK', async () => {
    h.script = () => ({ toolCalls: [{ name: 'calculator', arguments: '{"expression": "2+' }] });
    for (const stream of [false, true]) {
      const m = await turn(client(), stream, { model: 'fake-model', max_tokens: 64, messages: [{ role: 'user', content: 'x' }], tools: [calculator] });
      expect(m.content[0]).toMatchObject({ type: 'tool_use', name: 'calculator', input: {} });
    }
    const calls = await h.calls(2);
    expect(calls).toHaveLength(2);
    for (const c of calls) expect(c.translation?.notes[0]).toMatch(/^malformed_tool_arguments:chatcmpl-tool-/);
  });

  it('stop sequences: stop → stop_sequence when vLLM names the request stop string; length → max_tokens', async () => {
    h.script = () => ({ content: 'one two', stopReason: 'END' });
    const m = await client().messages.create({ model: 'fake-model', max_tokens: 64, stop_sequences: ['END'], messages: [{ role: 'user', content: 'x' }] });
    expect(m).toMatchObject({ stop_reason: 'stop_sequence', stop_sequence: 'END' });
    expect(chatRequests()[0].json!.stop).toEqual(['END']);
    h.script = () => ({ content: 'cut', finishReason: 'length' });
    for (const stream of [false, true]) {
      const cut = await turn(client(), stream, { model: 'fake-model', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] });
      expect(cut.stop_reason).toBe('max_tokens');
    }
  });

  it('an unmappable request (extended thinking) passes through untouched, with the reason recorded', async () => {
    await expect(
      client().messages.create({
        model: 'fake-model',
        max_tokens: 2048,
        thinking: { type: 'enabled', budget_tokens: 1024 },
        messages: [{ role: 'user', content: 'x' }],
      }),
    ).rejects.toMatchObject({ status: 404 });
    expect((await h.calls(1))[0]).toMatchObject({ translation: null, token_ids_missing: 'not translated: thinking' });
  });
});

describe('upstream failures reach the Anthropic SDK as the errors it expects', () => {
  it('an upstream 400 is a BadRequestError of type invalid_request_error with the upstream message', async () => {
    h.fault = () => ({
      kind: 'status',
      status: 400,
      body: JSON.stringify({ error: { message: 'prompt is too long', type: 'BadRequestError', param: null, code: 400 } }),
    });
    const err = await client()
      .messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect(err).toMatchObject({ status: 400, error: { type: 'error', error: { type: 'invalid_request_error', message: 'prompt is too long' } } });
  });

  it('an upstream 503 is an overloaded_error', async () => {
    h.fault = () => ({ kind: 'status', status: 503, body: 'Service Unavailable', contentType: 'text/plain' });
    await expect(client().messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] })).rejects.toMatchObject({
      status: 503,
      error: { error: { type: 'overloaded_error' } },
    });
  });

  it('an error in the middle of the stream is raised by messages.stream, not a hang', async () => {
    h.fault = () => ({ kind: 'stream-error', afterEvents: 3, message: 'engine died' });
    await expect(
      client()
        .messages.stream({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'Say hello.' }] })
        .finalMessage(),
    ).rejects.toThrow(/engine died/);
  });

  it('an upstream connection dropped mid-stream is raised by messages.stream', async () => {
    h.fault = () => ({ kind: 'reset-mid-stream', afterEvents: 2 });
    await expect(
      client()
        .messages.stream({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'Say hello.' }] })
        .finalMessage(),
    ).rejects.toThrow(/closed the stream before its end/);
  });

  it('a 200 whose body is not a chat completion is a 502 api_error', async () => {
    h.fault = (r) => (r.path === '/v1/chat/completions' ? { kind: 'non-json', body: '<html></html>' } : null);
    await expect(client().messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] })).rejects.toMatchObject({
      status: 502,
      error: { error: { type: 'api_error' } },
    });
  });
});

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
