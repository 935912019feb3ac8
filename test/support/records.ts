import type { CallRecord, Correlation, ToolCallRequest, ToolSpanRecord } from '../../src/model/records';

/** Builders for pipeline records in unit tests. */
export const corr = (rolloutId: string, extra: Partial<Correlation> = {}): Correlation => ({
  rolloutId,
  attemptId: '0',
  groupId: null,
  agentName: null,
  source: 'path',
  ...extra,
});

export function callRecord(rolloutId: string, seq: number, endedAt: number, extra: Partial<CallRecord> & { toolCalls?: ToolCallRequest[] } = {}): CallRecord {
  const { toolCalls, ...rest } = extra;
  return {
    type: 'call',
    correlation: corr(rolloutId),
    seq,
    api: 'chat.completions',
    model: 'm',
    traceId: null,
    spanId: null,
    request: {},
    response: {},
    streamed: false,
    status: 'ok',
    httpStatus: 200,
    error: null,
    usage: null,
    promptTokenIds: [1, 2],
    choices: [
      {
        index: 0,
        finishReason: toolCalls?.length ? 'tool_calls' : 'stop',
        responseTokenIds: [3],
        responseLogprobs: [-0.1],
        promptTokenIds: null,
        toolCalls: toolCalls ?? [],
      },
    ],
    injected: [],
    truncated: false,
    startedAt: endedAt - 5,
    endedAt,
    latencyMs: 5,
    ttftMs: null,
    ...rest,
  };
}

export function toolSpan(rolloutId: string, spanId: string, startedAt: number, extra: Partial<ToolSpanRecord> = {}): ToolSpanRecord {
  return {
    type: 'tool_span',
    rolloutId,
    attemptId: '0',
    traceId: 't'.repeat(32),
    spanId,
    convention: 'gen_ai',
    toolName: 'calculator',
    toolCallId: null,
    result: null,
    outcome: 'ok',
    errorType: null,
    attributes: {},
    startedAt,
    endedAt: startedAt + 1,
    at: startedAt + 2,
    ...extra,
  };
}
