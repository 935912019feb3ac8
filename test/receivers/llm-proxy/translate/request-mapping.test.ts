import { anthropicToChatRequest, responsesToChatRequest } from '../../../../src/receivers/llm-proxy/translate';
import { ChatStreamToAnthropicEvents } from '../../../../src/receivers/llm-proxy/translate/anthropic-stream';
import { ChatStreamToResponsesEvents } from '../../../../src/receivers/llm-proxy/translate/responses-stream';
import { startFakeModelServer } from '../../../support/fake-model-server';

const fn = { type: 'function', name: 'f', parameters: { type: 'object', properties: {} } };

describe('responsesToChatRequest', () => {
  it('maps instructions, string input, function tools, tool_choice, sampling and streaming; drops harmless fields', () => {
    const t = responsesToChatRequest({
      model: 'm',
      instructions: 'sys',
      input: 'hi',
      tools: [{ ...fn, description: 'd', strict: true }],
      tool_choice: { type: 'function', name: 'f' },
      temperature: 0.5,
      top_p: 0.9,
      max_output_tokens: 100,
      stream: true,
      parallel_tool_calls: false,
      metadata: { a: '1' },
      store: true,
      user: 'u',
      reasoning: { effort: 'low', summary: 'auto' },
      text: { format: { type: 'text' }, verbosity: 'low' },
      truncation: 'disabled',
      background: false,
      previous_response_id: null,
    });
    expect(t).toMatchObject({ ok: true });
    if (!t.ok) return;
    expect(t.chat).toEqual({
      model: 'm',
      messages: [
        { role: 'system', content: 'sys' },
        { role: 'user', content: 'hi' },
      ],
      tools: [{ type: 'function', function: { name: 'f', description: 'd', parameters: fn.parameters, strict: true } }],
      tool_choice: { type: 'function', function: { name: 'f' } },
      parallel_tool_calls: false,
      temperature: 0.5,
      top_p: 0.9,
      max_tokens: 100,
      user: 'u',
      reasoning_effort: 'low',
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(t.context).toMatchObject({ model: 'm', instructions: 'sys', stream: true, parallelToolCalls: false, metadata: { a: '1' } });
  });

  it('maps input items: message parts, images, developer → system, merged assistant text + calls, tool outputs, reasoning', () => {
    const t = responsesToChatRequest({
      input: [
        { type: 'message', role: 'developer', content: [{ type: 'input_text', text: 'rules' }] },
        {
          role: 'user',
          content: [
            { type: 'input_text', text: 'look: ' },
            { type: 'input_image', image_url: 'data:image/png;base64,AAAA', detail: 'high' },
          ],
        },
        { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: 'hmm' }] },
        { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'calling' }] },
        { type: 'function_call', call_id: 'c1', name: 'f', arguments: '{"a":1}' },
        { type: 'function_call', call_id: 'c2', name: 'f', arguments: '{}' },
        { type: 'function_call_output', call_id: 'c1', output: 'one' },
        { type: 'function_call_output', call_id: 'c2', output: [{ type: 'input_text', text: 'two' }] },
      ],
    });
    expect(t.ok && t.chat.messages).toEqual([
      { role: 'system', content: 'rules' },
      {
        role: 'user',
        content: [
          { type: 'text', text: 'look: ' },
          { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA', detail: 'high' } },
        ],
      },
      {
        role: 'assistant',
        content: 'calling',
        reasoning: 'hmm',
        tool_calls: [
          { id: 'c1', type: 'function', function: { name: 'f', arguments: '{"a":1}' } },
          { id: 'c2', type: 'function', function: { name: 'f', arguments: '{}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'c1', content: 'one' },
      { role: 'tool', tool_call_id: 'c2', content: 'two' },
    ]);
  });

  it('maps json_schema text format and the logprobs include', () => {
    const t = responsesToChatRequest({
      input: 'x',
      text: { format: { type: 'json_schema', name: 'out', schema: { type: 'object' }, strict: true } },
      include: ['message.output_text.logprobs'],
      top_logprobs: 2,
    });
    expect(t.ok && t.chat).toMatchObject({
      response_format: { type: 'json_schema', json_schema: { name: 'out', schema: { type: 'object' }, strict: true } },
      logprobs: true,
      top_logprobs: 2,
    });
    expect(t.ok && t.context.includeLogprobs).toBe(true);
  });

  it.each<[string, Record<string, unknown>]>([
    ['previous_response_id', { input: 'x', previous_response_id: 'resp_1' }],
    ['conversation', { input: 'x', conversation: 'conv_1' }],
    ['background', { input: 'x', background: true }],
    ['prompt', { prompt: { id: 'pmpt_1' } }],
    ['truncation:auto', { input: 'x', truncation: 'auto' }],
    ['builtin_tool:web_search', { input: 'x', tools: [{ type: 'web_search' }] }],
    ['builtin_tool:file_search', { input: 'x', tools: [fn, { type: 'file_search', vector_store_ids: ['v'] }] }],
    ['tool_choice:allowed_tools', { input: 'x', tools: [fn], tool_choice: { type: 'allowed_tools', mode: 'auto', tools: [] } }],
    ['include:file_search_call.results', { input: 'x', include: ['file_search_call.results'] }],
    ['input_item:item_reference', { input: [{ type: 'item_reference', id: 'msg_1' }] }],
    ['input_item:web_search_call', { input: [{ type: 'web_search_call', id: 'ws_1', status: 'completed' }] }],
    ['input_item:encrypted_reasoning', { input: [{ type: 'reasoning', id: 'rs', summary: [], encrypted_content: 'gAAA' }] }],
    ['input_image:file_id', { input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'file_1' }] }] }],
    ['content_part:input_file', { input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'file_1' }] }] }],
    ['tool_output_part:input_image', { input: [{ type: 'function_call_output', call_id: 'c', output: [{ type: 'input_image', image_url: 'x' }] }] }],
    ['unsupported_field:frobnicate', { input: 'x', frobnicate: 1 }],
    ['not_json_object', [] as unknown as Record<string, unknown>],
  ])('refuses %s', (reason, body) => {
    expect(responsesToChatRequest(body)).toEqual({ ok: false, reason });
  });
});

describe('anthropicToChatRequest', () => {
  it('maps system blocks, text / image / tool_use / tool_result blocks, tools, tool_choice, sampling, stop sequences and streaming', () => {
    const t = anthropicToChatRequest({
      model: 'claude',
      max_tokens: 50,
      temperature: 0.2,
      top_p: 0.8,
      top_k: 40,
      stop_sequences: ['END'],
      stream: true,
      metadata: { user_id: 'u' },
      system: [
        { type: 'text', text: 'a', cache_control: { type: 'ephemeral' } },
        { type: 'text', text: 'b' },
      ],
      tools: [{ name: 'f', description: 'd', input_schema: { type: 'object', properties: {} } }],
      tool_choice: { type: 'any', disable_parallel_tool_use: true },
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'see ' },
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } },
          ],
        },
        {
          role: 'assistant',
          content: [
            { type: 'text', text: 'ok' },
            { type: 'tool_use', id: 'toolu_1', name: 'f', input: { x: 1 } },
          ],
        },
        {
          role: 'user',
          content: [
            { type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'res' }], is_error: false },
            { type: 'text', text: 'next' },
          ],
        },
      ],
    });
    expect(t.ok && t.chat).toEqual({
      model: 'claude',
      max_tokens: 50,
      temperature: 0.2,
      top_p: 0.8,
      top_k: 40,
      stop: ['END'],
      messages: [
        { role: 'system', content: 'a\nb' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'see ' },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } },
          ],
        },
        { role: 'assistant', content: 'ok', tool_calls: [{ id: 'toolu_1', type: 'function', function: { name: 'f', arguments: '{"x":1}' } }] },
        { role: 'tool', tool_call_id: 'toolu_1', content: 'res' },
        { role: 'user', content: 'next' },
      ],
      tools: [{ type: 'function', function: { name: 'f', description: 'd', parameters: { type: 'object', properties: {} } } }],
      tool_choice: 'required',
      parallel_tool_calls: false,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(t.ok && t.context).toMatchObject({ model: 'claude', stopSequences: ['END'], stream: true });
  });

  it.each<[string, Record<string, unknown>]>([
    ['thinking', { max_tokens: 9, messages: [], thinking: { type: 'enabled', budget_tokens: 1024 } }],
    ['thinking', { max_tokens: 9, messages: [{ role: 'assistant', content: [{ type: 'thinking', thinking: 't', signature: 's' }] }] }],
    ['server_tool:web_search_20250305', { max_tokens: 9, messages: [], tools: [{ type: 'web_search_20250305', name: 'web_search' }] }],
    [
      'content_block:document',
      { max_tokens: 9, messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'text', data: 'x', media_type: 'text/plain' } }] }] },
    ],
    [
      'tool_result_block:image',
      {
        max_tokens: 9,
        messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 't', content: [{ type: 'image', source: { type: 'url', url: 'u' } }] }] }],
      },
    ],
    ['image_source:file', { max_tokens: 9, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'file', file_id: 'f' } }] }] }],
    ['mcp_servers', { max_tokens: 9, messages: [], mcp_servers: [{ type: 'url', url: 'u', name: 'n' }] }],
    ['container', { max_tokens: 9, messages: [], container: 'c' }],
    ['unsupported_field:frobnicate', { max_tokens: 9, messages: [], frobnicate: true }],
  ])('refuses %s', (reason, body) => {
    expect(anthropicToChatRequest(body)).toEqual({ ok: false, reason });
  });

  it('keeps thinking disabled and cache_control (harmless)', () => {
    expect(
      anthropicToChatRequest({
        max_tokens: 9,
        messages: [{ role: 'user', content: 'x' }],
        thinking: { type: 'disabled' },
        cache_control: { type: 'ephemeral' },
      }).ok,
    ).toBe(true);
  });
});

describe('stream translators on their own', () => {
  const rctx = () => {
    const t = responsesToChatRequest({ input: 'x', stream: true });
    if (!t.ok) throw new Error('unexpected');
    return t.context;
  };

  it('Responses: end() before any chunk, and an error chunk, give one error event and nothing after', () => {
    const a = new ChatStreamToResponsesEvents(rctx());
    expect(a.end()).toMatch(/^event: error\ndata: .*"message":"upstream stream ended without any chunk"/);
    expect(a.done).toBe(true);
    expect(a.end() + a.push({ choices: [] })).toBe('');
    const b = new ChatStreamToResponsesEvents(rctx());
    b.push({ id: 'chatcmpl-1', choices: [{ index: 0, delta: { content: 'hi' } }] });
    expect(b.push({ error: { message: 'boom', type: 'InternalServerError', code: 500 } })).toMatch(/"type":"error".*"message":"boom"/);
  });

  it('Responses: ids derive from the chat id; call_id is the chat tool call id', () => {
    const s = new ChatStreamToResponsesEvents(rctx());
    let out = s.push({
      id: 'chatcmpl-abc',
      created: 5,
      model: 'm',
      choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'call_x', function: { name: 'f', arguments: '{"a"' } }] } }],
    });
    out += s.push({
      id: 'chatcmpl-abc',
      choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: ':1}' } }] }, finish_reason: 'tool_calls' }],
    });
    out += s.push({ id: 'chatcmpl-abc', choices: [], usage: { prompt_tokens: 3, completion_tokens: 4 } });
    out += s.end();
    const completed = JSON.parse(
      out
        .split('\n')
        .filter((l) => l.startsWith('data: '))
        .pop()!
        .slice(6),
    );
    expect(completed.response).toMatchObject({
      id: 'resp_abc',
      created_at: 5,
      status: 'completed',
      output: [{ type: 'function_call', id: 'fc_abc_0', call_id: 'call_x', arguments: '{"a":1}' }],
      usage: { input_tokens: 3, output_tokens: 4, total_tokens: 7 },
    });
  });

  it('Anthropic: a tool_use block is sent whole with valid JSON; malformed arguments become {}', () => {
    const s = new ChatStreamToAnthropicEvents({ model: 'm', stopSequences: [], stream: true, idSeed: 'seed' });
    let out = s.push({
      id: 'chatcmpl-z',
      choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 't0', function: { name: 'f', arguments: '{"a":' } }] } }],
    });
    expect(out).not.toMatch(/input_json_delta/);
    out += s.push({
      choices: [{ index: 0, delta: { tool_calls: [{ index: 1, id: 't1', function: { name: 'g', arguments: '{"b":2}' } }] }, finish_reason: 'tool_calls' }],
    });
    out += s.end();
    expect([...out.matchAll(/"partial_json":"((?:[^"\\]|\\.)*)"/g)].map((m) => JSON.parse(`"${m[1]}"`))).toEqual(['{}', '{"b":2}']);
    expect(s.notes).toEqual(['malformed_tool_arguments:t0']);
    expect(out).toMatch(/"stop_reason":"tool_use"/);
  });
});

describe('the strict fake model server with flavor openai', () => {
  it('rejects a field OpenAI does not know with 400, and answers the same request without it', async () => {
    const s = await startFakeModelServer({ strict: true, flavor: 'openai' });
    try {
      const post = (body: unknown) =>
        fetch(`${s.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      const bad = await post({ model: 'm', messages: [{ role: 'user', content: 'x' }], return_token_ids: true });
      expect(bad.status).toBe(400);
      expect(await bad.json()).toEqual({
        error: { message: 'Unrecognized request argument supplied: return_token_ids', type: 'invalid_request_error', param: null, code: null },
      });
      const good = await post({ model: 'm', messages: [{ role: 'user', content: 'x' }] });
      const body = (await good.json()) as Record<string, unknown>;
      expect(good.status).toBe(200);
      expect(body.prompt_token_ids).toBeUndefined();
      expect((await fetch(`${s.origin}/version`)).status).toBe(404);
    } finally {
      await s.close();
    }
  });
});
