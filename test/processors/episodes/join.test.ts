import { joinToolSpans, requestKey } from '../../../src/processors/episodes/join';
import { callRecord, toolSpan } from '../../support/records';

const T = 'a'.repeat(32);

describe('joining tool spans to the calls that requested them', () => {
  it('joins by tool call id first', () => {
    const calls = [
      callRecord('r', 0, 10, {
        toolCalls: [
          { id: 'call_1', name: 'search', arguments: '{}' },
          { id: 'call_2', name: 'search', arguments: '{}' },
        ],
      }),
    ];
    const spans = [
      toolSpan('r', 's2', 20, { toolCallId: 'call_2', toolName: 'search' }),
      toolSpan('r', 's1', 21, { toolCallId: 'call_1', toolName: 'search' }),
    ];
    const j = joinToolSpans(calls, spans);
    expect(j.get(requestKey(0, 0, 0))).toMatchObject({ method: 'tool_call_id', span: { spanId: 's1' } });
    expect(j.get(requestKey(0, 0, 1))).toMatchObject({ method: 'tool_call_id', span: { spanId: 's2' } });
  });

  it('else joins by same trace and tool name to the nearest earlier call', () => {
    const calls = [
      callRecord('r', 0, 10, { traceId: T, toolCalls: [{ id: 'a', name: 'calc', arguments: '{}' }] }),
      callRecord('r', 1, 30, { traceId: T, toolCalls: [{ id: 'b', name: 'calc', arguments: '{}' }] }),
      callRecord('r', 2, 50, { traceId: 'b'.repeat(32), toolCalls: [{ id: 'c', name: 'calc', arguments: '{}' }] }),
    ];
    const spans = [toolSpan('r', 'late', 40, { traceId: T, toolName: 'calc' }), toolSpan('r', 'early', 15, { traceId: T, toolName: 'calc' })];
    const j = joinToolSpans(calls, spans);
    expect(j.get(requestKey(0, 0, 0))).toMatchObject({ method: 'trace_and_name', span: { spanId: 'early' } });
    expect(j.get(requestKey(1, 0, 0))).toMatchObject({ method: 'trace_and_name', span: { spanId: 'late' } });
    expect(j.has(requestKey(2, 0, 0))).toBe(false);
  });

  it('does not join by trace to a call that ended after the span started, or to another tool name', () => {
    const calls = [callRecord('r', 0, 100, { traceId: T, toolCalls: [{ id: 'a', name: 'calc', arguments: '{}' }] })];
    expect(joinToolSpans(calls, [toolSpan('r', 's', 50, { traceId: T, toolName: 'calc' })]).size).toBe(0);
    expect(joinToolSpans(calls, [toolSpan('r', 's', 150, { traceId: T, toolName: 'search' })]).size).toBe(0);
  });

  it.each([
    ['chat tool message', { messages: [{ role: 'tool', tool_call_id: 'call_x', content: ' 42 ' }] }],
    ['chat tool message with text parts', { messages: [{ role: 'tool', tool_call_id: 'call_x', content: [{ type: 'text', text: '42' }] }] }],
    ['responses function_call_output', { input: [{ type: 'function_call_output', call_id: 'call_x', output: '42' }] }],
    ['anthropic tool_result block', { messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_x', content: '42' }] }] }],
  ])('else joins by the tool result in a later request (%s)', (_, request) => {
    const calls = [callRecord('r', 0, 10, { toolCalls: [{ id: 'call_x', name: 'calc', arguments: '{}' }] }), callRecord('r', 1, 30, { request })];
    const j = joinToolSpans(calls, [toolSpan('r', 's', 20, { traceId: 'c'.repeat(32), toolName: 'calc', result: '42' })]);
    expect(j.get(requestKey(0, 0, 0))).toMatchObject({ method: 'tool_result', span: { spanId: 's' } });
  });

  it('uses each span and each requested call once', () => {
    const calls = [callRecord('r', 0, 10, { traceId: T, toolCalls: [{ id: 'a', name: 'calc', arguments: '{}' }] })];
    const spans = [toolSpan('r', 's1', 20, { traceId: T, toolCallId: 'a', toolName: 'calc' }), toolSpan('r', 's2', 21, { traceId: T, toolName: 'calc' })];
    const j = joinToolSpans(calls, spans);
    expect(j.size).toBe(1);
    expect(j.get(requestKey(0, 0, 0))!.span.spanId).toBe('s1');
  });

  it('joins a span that does not know its tool name by same trace and the same arguments (key order aside)', () => {
    const calls = [
      callRecord('r', 0, 10, { traceId: T, toolCalls: [{ id: 'a', name: 'search', arguments: '{"q":"x","n":1}' }] }),
      callRecord('r', 1, 30, { traceId: T, toolCalls: [{ id: 'b', name: 'search', arguments: '{"q":"y","n":1}' }] }),
    ];
    const spans = [
      toolSpan('r', 'unnamed', 40, { traceId: T, toolName: null, arguments: '{"n":1,"q":"x"}' }),
      toolSpan('r', 'no-args', 41, { traceId: T, toolName: null, arguments: null }),
    ];
    const j = joinToolSpans(calls, spans);
    expect(j.get(requestKey(0, 0, 0))).toMatchObject({ method: 'trace_and_arguments', span: { spanId: 'unnamed' } });
    expect(j.has(requestKey(1, 0, 0))).toBe(false);
    // Never across traces.
    expect(joinToolSpans(calls, [toolSpan('r', 's', 40, { traceId: 'c'.repeat(32), toolName: null, arguments: '{"q":"x","n":1}' })]).size).toBe(0);
  });
});
