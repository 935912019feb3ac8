import type { AttributeValue, Span } from '../../model/span';

export type ToolOutcome = 'ok' | 'error';

export interface ToolSpanInfo {
  /** Which convention recognised it: gen_ai | openinference | traceloop | vercel | mcp | name-pattern | langsmith. */
  convention: string;
  toolName: string | null;
  toolCallId: string | null;
  arguments: string | null;
  result: string | null;
  truncated: boolean;
  outcome: ToolOutcome;
  errorType: string | null;
  agentName: string | null;
}

export interface RewardInfo {
  source: 'agentlightning.annotation' | 'lightning.reward';
  /** First = primary. */
  rewards: { name: string; value: number }[];
  /** The episode's final reward: it may close the episode. */
  final: boolean;
  /** Not final, but the episode's final reward if no later reward says otherwise (agent-lightning: the last reward is final). */
  provisional: boolean;
}

export type SpanClass =
  { kind: 'tool'; tool: ToolSpanInfo } | { kind: 'reward'; reward: RewardInfo } | { kind: 'agent'; agent: { name: string } } | { kind: 'other' };

/** GenAI agent spans (`invoke_agent` / `create_agent`): the agent whose LLM calls run inside them. */
const AGENT_OPERATIONS = new Set(['invoke_agent', 'create_agent']);

const str = (v: AttributeValue | undefined): string | null =>
  typeof v === 'string' && v !== '' ? v : typeof v === 'number' || typeof v === 'boolean' ? String(v) : null;

/** Which convention marks a span as a tool execution (reference §4.6, in priority order). */
function toolConvention(span: Span): string | null {
  const a = span.attributes;
  if (a['gen_ai.operation.name'] === 'execute_tool')
    return a['mcp.method.name'] === 'tools/call' ? 'mcp' : a['traceloop.span.kind'] !== undefined ? 'traceloop' : 'gen_ai';
  if (a['openinference.span.kind'] === 'TOOL') return 'openinference';
  const tl = a['traceloop.span.kind'];
  if (tl === 'tool' || (tl === 'task' && span.name.startsWith('execute_tool '))) return 'traceloop';
  if (span.name === 'ai.toolCall') return 'vercel';
  if (a['mcp.method.name'] === 'tools/call') return 'mcp';
  if (span.name.startsWith('execute_tool ') || span.name.endsWith('.tool')) return 'name-pattern';
  if (a['langsmith.span.kind'] === 'tool') return 'langsmith';
  return null;
}

function nameFromSpanName(name: string): string | null {
  if (name.startsWith('execute_tool ')) return name.slice('execute_tool '.length).trim() || null;
  if (name.startsWith('tools/call ')) return name.slice('tools/call '.length).trim() || null;
  if (name.endsWith('.tool') && name.length > 5) return name.slice(0, -5);
  return null;
}

function first(span: Span, keys: readonly string[]): string | null {
  for (const k of keys) {
    const v = span.attributes[k];
    if (v === undefined || v === null) continue;
    if (typeof v === 'string') return v;
    return JSON.stringify(v, (_k, x) => (x instanceof Uint8Array ? Buffer.from(x).toString('base64') : x));
  }
  return null;
}

function cap(s: string | null, max: number): { value: string | null; truncated: boolean } {
  if (s === null || s.length <= max) return { value: s, truncated: false };
  return { value: s.slice(0, max), truncated: true };
}

/** LangChain.js tool classes: instrumentations that name spans by class give these instead of the tool's name. */
const LANGCHAIN_TOOL_CLASSES = new Set(['DynamicStructuredTool', 'DynamicTool', 'StructuredTool', 'Tool']);

/**
 * A LangChain tool's output serialized as a `ToolMessage` (Traceloop's LangChain instrumentation
 * records it so): `{"lc":1,"type":"constructor","id":[…,"ToolMessage"],"kwargs":{tool_call_id,name,content,status}}`.
 */
function langchainToolMessage(output: string | null): { toolCallId: string | null; name: string | null; content: string | null; failed: boolean } | null {
  if (output === null || !output.startsWith('{"lc":')) return null;
  try {
    const o = JSON.parse(output) as { id?: unknown; kwargs?: Record<string, unknown> };
    if (!Array.isArray(o.id) || o.id[o.id.length - 1] !== 'ToolMessage' || !o.kwargs) return null;
    const k = o.kwargs;
    const content = typeof k.content === 'string' ? k.content : k.content === undefined ? null : JSON.stringify(k.content);
    return {
      toolCallId: typeof k.tool_call_id === 'string' ? k.tool_call_id : null,
      name: typeof k.name === 'string' ? k.name : null,
      content,
      failed: k.status === 'error',
    };
  } catch {
    return null;
  }
}

/** Traceloop's LangChain input `{"args":["{\"q\":1}"]}` → the tool's arguments. */
function langchainArgs(input: string | null): string | null {
  if (input === null || !input.startsWith('{"args":')) return input;
  try {
    const first = (JSON.parse(input) as { args?: unknown[] }).args?.[0];
    return typeof first === 'string' ? first : first === undefined ? input : JSON.stringify(first);
  } catch {
    return input;
  }
}

function toolInfo(span: Span, convention: string, maxPayloadChars: number): ToolSpanInfo {
  const a = span.attributes;
  let toolName =
    str(a['gen_ai.tool.name']) ?? str(a['tool.name']) ?? str(a['ai.toolCall.name']) ?? str(a['traceloop.entity.name']) ?? nameFromSpanName(span.name);
  let toolCallId = str(a['gen_ai.tool.call.id']) ?? str(a['tool.id']) ?? str(a['ai.toolCall.id']);
  let rawArgs = first(span, ['gen_ai.tool.call.arguments', 'input.value', 'ai.toolCall.args', 'ai.toolCall.input', 'traceloop.entity.input']);
  let rawResult = first(span, ['gen_ai.tool.call.result', 'output.value', 'ai.toolCall.result', 'ai.toolCall.output', 'traceloop.entity.output']);
  let messageFailed = false;
  if (toolName !== null && LANGCHAIN_TOOL_CLASSES.has(toolName)) {
    // Named by class: the real name and call id are in the serialized ToolMessage, when there is one.
    const msg = langchainToolMessage(rawResult);
    toolName = msg?.name ?? null;
    toolCallId ??= msg?.toolCallId ?? null;
    if (msg) rawResult = msg.content;
    messageFailed = msg?.failed ?? false;
    rawArgs = langchainArgs(rawArgs);
  }
  const args = cap(rawArgs, maxPayloadChars);
  const result = cap(rawResult, maxPayloadChars);
  const exception = span.events.find((e) => e.name === 'exception');
  const errorType = str(a['error.type']) ?? (exception ? (str(exception.attributes['exception.type']) ?? 'exception') : null);
  const failed = span.status.code === 2 || a['error.type'] !== undefined || exception !== undefined || messageFailed;
  return {
    convention,
    toolName,
    toolCallId,
    arguments: args.value,
    result: result.value,
    truncated: args.truncated || result.truncated,
    outcome: failed ? 'error' : 'ok',
    errorType: failed ? (errorType ?? (span.status.message || 'error')) : null,
    agentName: str(a['gen_ai.agent.name']),
  };
}

function finiteNumber(v: AttributeValue | undefined): number | null {
  const n = typeof v === 'number' ? v : typeof v === 'string' && v.trim() !== '' ? Number(v) : NaN;
  return Number.isFinite(n) ? n : null;
}

/**
 * agent-lightning's `agentlightning.annotation` span with `agentlightning.reward.<i>.name|value`.
 * agent-lightning takes the last reward found as the final one, so these are provisional.
 */
function annotationReward(span: Span): RewardInfo {
  const byIndex = new Map<number, { name?: string; value?: number | null }>();
  for (const [k, v] of Object.entries(span.attributes)) {
    const m = /^agentlightning\.reward\.(\d+)\.(name|value)$/.exec(k);
    if (!m) continue;
    const entry = byIndex.get(Number(m[1])) ?? {};
    if (m[2] === 'name') entry.name = str(v) ?? undefined;
    else entry.value = finiteNumber(v);
    byIndex.set(Number(m[1]), entry);
  }
  const legacy = finiteNumber(span.attributes.reward);
  const rewards = [...byIndex.entries()]
    .sort((x, y) => x[0] - y[0])
    .filter(([, e]) => e.value !== null && e.value !== undefined)
    .map(([i, e]) => ({ name: e.name ?? (i === 0 ? 'primary' : `reward_${i}`), value: e.value as number }));
  if (rewards.length === 0 && legacy !== null) rewards.push({ name: 'primary', value: legacy });
  return { source: 'agentlightning.annotation', rewards, final: false, provisional: true };
}

/** Ours: `lightning.reward` (number), `lightning.reward.name`, `lightning.reward.final` (bool; provisional when absent). */
function lightningReward(span: Span): RewardInfo {
  const value = finiteNumber(span.attributes['lightning.reward']);
  const finalAttr = span.attributes['lightning.reward.final'];
  const final = finalAttr === true || finalAttr === 'true';
  return {
    source: 'lightning.reward',
    rewards: value === null ? [] : [{ name: str(span.attributes['lightning.reward.name']) ?? 'primary', value }],
    final,
    provisional: !final && finalAttr === undefined,
  };
}

/**
 * Classifies a span. Cheap for the common case: a few attribute lookups decide 'other'.
 */
export function classifySpan(span: Span, options: { maxPayloadChars?: number } = {}): SpanClass {
  if (span.name === 'agentlightning.annotation') return { kind: 'reward', reward: annotationReward(span) };
  if (span.attributes['lightning.reward'] !== undefined) return { kind: 'reward', reward: lightningReward(span) };
  const convention = toolConvention(span);
  if (convention) return { kind: 'tool', tool: toolInfo(span, convention, options.maxPayloadChars ?? 4096) };
  const agent = span.attributes['gen_ai.agent.name'];
  if (typeof agent === 'string' && agent !== '' && AGENT_OPERATIONS.has(span.attributes['gen_ai.operation.name'] as string))
    return { kind: 'agent', agent: { name: agent.slice(0, 128) } };
  return { kind: 'other' };
}
