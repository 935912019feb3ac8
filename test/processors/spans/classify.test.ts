import type { Attributes, Span } from '../../../src/model/span';
import { classifySpan, spanAttribution } from '../../../src/processors/spans';

function span(name: string, attributes: Attributes = {}, extra: Partial<Span> = {}): Span {
  return {
    traceId: 'a'.repeat(32),
    spanId: 'b'.repeat(16),
    parentSpanId: '',
    traceState: '',
    flags: 1,
    name,
    kind: 1,
    startTimeUnixNano: '1000000',
    endTimeUnixNano: '2000000',
    attributes,
    events: [],
    links: [],
    status: { code: 0, message: '' },
    resource: {},
    scope: { name: 'x', version: '', attributes: {} },
    ...extra,
  };
}

describe('tool span conventions (reference §4.6)', () => {
  it.each([
    [
      'OTel GenAI execute_tool',
      span('execute_tool get_weather', {
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': 'get_weather',
        'gen_ai.tool.call.id': 'call_1',
        'gen_ai.tool.call.arguments': '{"city":"Paris"}',
        'gen_ai.tool.call.result': 'sunny',
      }),
      { convention: 'gen_ai', toolName: 'get_weather', toolCallId: 'call_1', arguments: '{"city":"Paris"}', result: 'sunny' },
    ],
    [
      'OpenInference TOOL',
      span('search', { 'openinference.span.kind': 'TOOL', 'tool.name': 'search', 'tool.id': 'call_2', 'input.value': '{"q":1}', 'output.value': 'hits' }),
      { convention: 'openinference', toolName: 'search', toolCallId: 'call_2', arguments: '{"q":1}', result: 'hits' },
    ],
    [
      'Traceloop withTool',
      span('lookup.tool', {
        'traceloop.span.kind': 'tool',
        'traceloop.entity.name': 'lookup',
        'traceloop.entity.input': '{"args":[1]}',
        'traceloop.entity.output': '"r"',
      }),
      { convention: 'traceloop', toolName: 'lookup', toolCallId: null, arguments: '{"args":[1]}', result: '"r"' },
    ],
    [
      'Traceloop LangChain task',
      span('execute_tool calculator', { 'traceloop.span.kind': 'task', 'gen_ai.provider.name': 'langchain' }),
      { convention: 'traceloop', toolName: 'calculator', toolCallId: null },
    ],
    [
      'Vercel ai.toolCall',
      span('ai.toolCall', { 'ai.toolCall.name': 'weather', 'ai.toolCall.id': 'call_3', 'ai.toolCall.args': '{}', 'ai.toolCall.result': '{"t":20}' }),
      { convention: 'vercel', toolName: 'weather', toolCallId: 'call_3', result: '{"t":20}' },
    ],
    [
      'MCP tools/call',
      span('tools/call read_file', { 'mcp.method.name': 'tools/call', 'jsonrpc.request.id': '7' }),
      { convention: 'mcp', toolName: 'read_file', toolCallId: null },
    ],
    [
      'MCP with gen_ai attributes',
      span('tools/call read_file', { 'mcp.method.name': 'tools/call', 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 'read_file' }),
      { convention: 'mcp', toolName: 'read_file' },
    ],
    ['span name execute_tool', span('execute_tool grep'), { convention: 'name-pattern', toolName: 'grep' }],
    ['span name *.tool', span('fetch_page.tool'), { convention: 'name-pattern', toolName: 'fetch_page' }],
    ['LangSmith tool run', span('calc', { 'langsmith.span.kind': 'tool' }), { convention: 'langsmith', toolName: null }],
  ])('%s', (_name, s, expected) => {
    const c = classifySpan(s);
    expect(c.kind).toBe('tool');
    expect(c.kind === 'tool' && c.tool).toMatchObject({ outcome: 'ok', errorType: null, ...expected });
  });

  it('reads a LangChain tool span named by class (Traceloop) from its serialized ToolMessage', () => {
    const toolMessage = (status: string) =>
      JSON.stringify({
        lc: 1,
        type: 'constructor',
        id: ['langchain_core', 'messages', 'ToolMessage'],
        kwargs: { status, content: '42', tool_call_id: 'call_9', name: 'calculator' },
      });
    const ok = classifySpan(
      span('DynamicStructuredTool.task', {
        'traceloop.span.kind': 'task',
        'gen_ai.operation.name': 'execute_tool',
        'traceloop.entity.name': 'DynamicStructuredTool',
        'traceloop.entity.input': JSON.stringify({ args: ['{"expression":"6*7"}'] }),
        'traceloop.entity.output': toolMessage('success'),
      }),
    );
    expect(ok.kind === 'tool' && ok.tool).toMatchObject({
      convention: 'traceloop',
      toolName: 'calculator',
      toolCallId: 'call_9',
      arguments: '{"expression":"6*7"}',
      result: '42',
      outcome: 'ok',
    });
    const failed = classifySpan(
      span('DynamicStructuredTool.task', {
        'traceloop.span.kind': 'task',
        'gen_ai.operation.name': 'execute_tool',
        'traceloop.entity.name': 'DynamicStructuredTool',
        'traceloop.entity.output': toolMessage('error'),
      }),
    );
    expect(failed.kind === 'tool' && [failed.tool.outcome, failed.tool.toolName]).toEqual(['error', 'calculator']);
    // Thrown before any ToolMessage: the name is unknown (not the class), the arguments are kept.
    const thrown = classifySpan(
      span(
        'DynamicStructuredTool.task',
        {
          'traceloop.span.kind': 'task',
          'gen_ai.operation.name': 'execute_tool',
          'traceloop.entity.name': 'DynamicStructuredTool',
          'traceloop.entity.input': JSON.stringify({ args: ['{"q":"x"}'] }),
        },
        { status: { code: 2, message: 'boom' } },
      ),
    );
    expect(thrown.kind === 'tool' && thrown.tool).toMatchObject({ toolName: null, arguments: '{"q":"x"}', outcome: 'error' });
  });

  it.each([
    ['status ERROR', { status: { code: 2, message: 'bad input' } }, 'bad input'],
    ['error.type', { attributes: { 'gen_ai.operation.name': 'execute_tool', 'error.type': 'tool_error' } }, 'tool_error'],
    ['exception event', { events: [{ name: 'exception', timeUnixNano: '1', attributes: { 'exception.type': 'TimeoutError' } }] }, 'TimeoutError'],
  ])('detects failure by %s', (_name, extra, errorType) => {
    const s = span('execute_tool x', { 'gen_ai.operation.name': 'execute_tool' }, extra as Partial<Span>);
    const c = classifySpan(s);
    expect(c.kind === 'tool' && [c.tool.outcome, c.tool.errorType]).toEqual(['error', errorType]);
  });

  it('caps arguments and results and says so', () => {
    const c = classifySpan(span('execute_tool x', { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.call.result': 'r'.repeat(100) }), {
      maxPayloadChars: 10,
    });
    expect(c.kind === 'tool' && [c.tool.result, c.tool.truncated]).toEqual(['rrrrrrrrrr', true]);
  });

  it.each([
    ['an OpenAI chat span', span('chat gpt-4o', { 'gen_ai.operation.name': 'chat', 'gen_ai.request.model': 'gpt-4o' })],
    ['an HTTP client span', span('POST', { 'http.request.method': 'POST', 'url.full': 'http://127.0.0.1:4000/v1/chat/completions' }, { kind: 3 })],
    ['a Traceloop workflow', span('run.workflow', { 'traceloop.span.kind': 'workflow' })],
  ])('classifies %s as other', (_name, s) => {
    expect(classifySpan(s).kind).toBe('other');
  });
});

describe('reward spans', () => {
  it('reads agent-lightning annotations in index order, first = primary, provisional', () => {
    const c = classifySpan(
      span('agentlightning.annotation', {
        'agentlightning.reward.1.name': 'format',
        'agentlightning.reward.1.value': 0.5,
        'agentlightning.reward.0.name': 'primary',
        'agentlightning.reward.0.value': 1,
      }),
    );
    expect(c).toEqual({
      kind: 'reward',
      reward: {
        source: 'agentlightning.annotation',
        rewards: [
          { name: 'primary', value: 1 },
          { name: 'format', value: 0.5 },
        ],
        final: false,
        provisional: true,
      },
    });
  });

  it('ignores non-numeric and non-finite values without failing', () => {
    const c = classifySpan(
      span('agentlightning.annotation', {
        'agentlightning.reward.0.value': 'NaN',
        'agentlightning.reward.1.value': 'abc',
        'agentlightning.reward.2.value': '0.25',
      }),
    );
    expect(c.kind === 'reward' && c.reward.rewards).toEqual([{ name: 'reward_2', value: 0.25 }]);
  });

  it('reads ours: lightning.reward with lightning.reward.final', () => {
    expect(classifySpan(span('reward', { 'lightning.reward': 0.7, 'lightning.reward.final': true }))).toEqual({
      kind: 'reward',
      reward: { source: 'lightning.reward', rewards: [{ name: 'primary', value: 0.7 }], final: true, provisional: false },
    });
    expect(classifySpan(span('reward', { 'lightning.reward': '2', 'lightning.reward.name': 'tests' }))).toMatchObject({
      reward: { rewards: [{ name: 'tests', value: 2 }], final: false, provisional: true },
    });
  });
});

describe('rollout attribution of spans', () => {
  it('prefers the span attribute over the resource attribute', () => {
    const s = span('x', { 'lightning.rollout_id': 'from-span', 'lightning.attempt_id': '2' }, { resource: { 'agentlightning.rollout_id': 'from-resource' } });
    expect(spanAttribution(s)).toMatchObject({ rolloutId: 'from-span', attemptId: '2', source: 'span' });
    expect(spanAttribution(span('x', {}, { resource: { 'agentlightning.rollout_id': 'ro-9', 'agentlightning.attempt_id': 'a1' } }))).toMatchObject({
      rolloutId: 'ro-9',
      attemptId: 'a1',
      source: 'resource',
    });
  });

  it('ignores ids that are not 1-128 characters of [A-Za-z0-9._:-]', () => {
    expect(spanAttribution(span('x', { 'lightning.rollout_id': '../../etc' })).rolloutId).toBeNull();
    expect(spanAttribution(span('x', { 'lightning.rollout_id': 'x'.repeat(129) })).rolloutId).toBeNull();
  });
});
