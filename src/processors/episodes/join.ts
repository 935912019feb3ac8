import type { CallRecord, ToolSpanRecord } from '../../model/records';

export type JoinMethod = 'tool_call_id' | 'trace_and_name' | 'trace_and_arguments' | 'tool_result';

export interface RequestedToolCall {
  seq: number;
  choice: number;
  index: number;
  id: string | null;
  name: string | null;
  arguments: string | null;
  traceId: string | null;
  endedAt: number;
}

export interface Joined {
  span: ToolSpanRecord;
  method: JoinMethod;
}

export const requestKey = (seq: number, choice: number, index: number): string => `${seq}:${choice}:${index}`;

/**
 * Joins tool spans to the tool calls that asked for them (docs/frameworks.md), each span and each
 * requested call used at most once, in three passes:
 *  1. the span's tool call id equals a `tool_calls[].id` of a response;
 *  2. same trace and same tool name: the nearest call that ended before the span started;
 *  3. the span's result equals a tool-result message in a later request (`role: "tool"`,
 *     Responses `function_call_output`, Anthropic `tool_result`) whose call id names the call.
 */
export function joinToolSpans<C extends CallRecord>(
  calls: readonly C[],
  spans: readonly ToolSpanRecord[],
  requestOf: (call: C) => unknown = (c) => c.request,
): Map<string, Joined> {
  const requested: RequestedToolCall[] = [];
  const byId = new Map<string, RequestedToolCall>();
  for (const call of calls) {
    for (const choice of call.choices ?? []) {
      choice.toolCalls.forEach((tc, index) => {
        const r: RequestedToolCall = {
          seq: call.seq,
          choice: choice.index,
          index,
          id: tc.id,
          name: tc.name,
          arguments: tc.arguments,
          traceId: call.traceId,
          endedAt: call.endedAt,
        };
        requested.push(r);
        if (tc.id && !byId.has(tc.id)) byId.set(tc.id, r);
      });
    }
  }
  const out = new Map<string, Joined>();
  const taken = (r: RequestedToolCall) => out.has(requestKey(r.seq, r.choice, r.index));
  const assign = (r: RequestedToolCall, span: ToolSpanRecord, method: JoinMethod) => out.set(requestKey(r.seq, r.choice, r.index), { span, method });
  const ordered = [...spans].sort((a, b) => a.startedAt - b.startedAt || a.spanId.localeCompare(b.spanId));
  let rest: ToolSpanRecord[] = [];

  for (const span of ordered) {
    const r = span.toolCallId ? byId.get(span.toolCallId) : undefined;
    if (r && !taken(r) && (span.toolName === null || r.name === null || r.name === span.toolName)) assign(r, span, 'tool_call_id');
    else rest.push(span);
  }

  const left: ToolSpanRecord[] = [];
  for (const span of rest) {
    let best: RequestedToolCall | null = null;
    for (const r of requested) {
      if (taken(r) || r.traceId === null || r.traceId !== span.traceId || r.name !== span.toolName || r.endedAt > span.startedAt) continue;
      if (!best || r.endedAt > best.endedAt || (r.endedAt === best.endedAt && r.seq > best.seq)) best = r;
    }
    if (best) assign(best, span, 'trace_and_name');
    else left.push(span);
  }
  rest = left;

  // A span that does not know its tool's name (instrumentations that name spans by class): same
  // trace and the same arguments, the nearest call that ended before the span started.
  const unnamed: ToolSpanRecord[] = [];
  for (const span of rest) {
    const want = span.toolName === null ? normalizedJson(span.arguments ?? null) : null;
    let best: RequestedToolCall | null = null;
    if (want !== null) {
      for (const r of requested) {
        if (taken(r) || r.traceId === null || r.traceId !== span.traceId || r.endedAt > span.startedAt || normalizedJson(r.arguments) !== want) continue;
        if (!best || r.endedAt > best.endedAt || (r.endedAt === best.endedAt && r.seq > best.seq)) best = r;
      }
    }
    if (best) assign(best, span, 'trace_and_arguments');
    else unnamed.push(span);
  }
  rest = unnamed;

  if (rest.length > 0) {
    const results = toolResultsInRequests(calls, requestOf);
    for (const span of rest) {
      if (span.result === null) continue;
      const want = span.result.trim();
      const hit = results.find((x) => x.content === want && byId.has(x.callId) && !taken(byId.get(x.callId)!));
      if (!hit) continue;
      const r = byId.get(hit.callId)!;
      if (span.toolName !== null && r.name !== null && r.name !== span.toolName) continue;
      assign(r, span, 'tool_result');
    }
  }
  return out;
}

/** Tool results the agent sent back in later requests, with the call id they answer. */
export function toolResultsInRequests<C extends CallRecord>(
  calls: readonly C[],
  requestOf: (call: C) => unknown = (c) => c.request,
): { callId: string; content: string }[] {
  const out: { callId: string; content: string }[] = [];
  // Agents resend their history: the latest request holds every earlier tool result, so read from the end.
  const seen = new Set<string>();
  for (const call of [...calls].reverse()) {
    const req = requestOf(call) as { messages?: unknown; input?: unknown } | null;
    if (!req || typeof req !== 'object') continue;
    const items = [...(Array.isArray(req.messages) ? req.messages : []), ...(Array.isArray(req.input) ? req.input : [])] as Record<string, unknown>[];
    for (const m of items) {
      if (!m || typeof m !== 'object') continue;
      if (m.role === 'tool' && typeof m.tool_call_id === 'string') out.push({ callId: m.tool_call_id, content: text(m.content) });
      else if (m.type === 'function_call_output' && typeof m.call_id === 'string') out.push({ callId: m.call_id, content: text(m.output) });
      else if (Array.isArray(m.content)) {
        for (const b of m.content as Record<string, unknown>[]) {
          if (b && b.type === 'tool_result' && typeof b.tool_use_id === 'string') out.push({ callId: b.tool_use_id, content: text(b.content) });
        }
      }
    }
  }
  return out.filter((r) => {
    const key = `${r.callId}\u0000${r.content}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

function text(v: unknown): string {
  if (typeof v === 'string') return v.trim();
  if (Array.isArray(v))
    return v
      .map((p) => (p && typeof p === 'object' && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : ''))
      .join('')
      .trim();
  return v === undefined || v === null ? '' : JSON.stringify(v);
}

/** JSON text in a canonical form (keys sorted), or null when it is not JSON. */
function normalizedJson(s: string | null): string | null {
  if (s === null) return null;
  try {
    return JSON.stringify(sortKeys(JSON.parse(s)));
  } catch {
    return null;
  }
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object')
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, sortKeys((v as Record<string, unknown>)[k])]),
    );
  return v;
}
