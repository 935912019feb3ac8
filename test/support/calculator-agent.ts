import OpenAI from 'openai';
import { CALCULATOR_TOOLS, type ChatMessage } from './qwen3-server';
import type { TestSidecar } from './sidecar';

/** The calculator tool the agent runs: `a op b` of integers. */
export function calculator(expression: string): string {
  const m = /^(-?\d+)\s*([-+*/])\s*(-?\d+)$/.exec(expression.trim());
  if (!m) return 'error';
  const [a, b] = [Number(m[1]), Number(m[3])];
  return String(m[2] === '+' ? a + b : m[2] === '-' ? a - b : m[2] === '*' ? a * b : a / b);
}

/** One chat call's answer as the agent reads it, streamed (deltas added up) or not. */
export interface ChatAnswer {
  content: string | null;
  reasoning: string | null;
  finish: string | null;
  calls: { id: string; name: string; arguments: string }[];
}

export async function completeChat(client: OpenAI, body: OpenAI.ChatCompletionCreateParamsNonStreaming, stream: boolean): Promise<ChatAnswer> {
  if (!stream) {
    const c = (await client.chat.completions.create(body)).choices[0];
    return {
      content: c.message.content,
      reasoning: (c.message as { reasoning_content?: string | null }).reasoning_content ?? null,
      finish: c.finish_reason,
      calls: (c.message.tool_calls ?? []).flatMap((t) => (t.type === 'function' ? [{ id: t.id, name: t.function.name, arguments: t.function.arguments }] : [])),
    };
  }
  const out: ChatAnswer = { content: null, reasoning: null, finish: null, calls: [] };
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
    const c = chunk.choices[0];
    if (c?.finish_reason) out.finish = c.finish_reason;
    if (c?.delta.content) out.content = (out.content ?? '') + c.delta.content;
    const thought = (c?.delta as { reasoning_content?: string } | undefined)?.reasoning_content;
    if (thought) out.reasoning = (out.reasoning ?? '') + thought;
    for (const t of c?.delta.tool_calls ?? []) {
      out.calls[t.index] ??= { id: '', name: '', arguments: '' };
      if (t.id) out.calls[t.index].id = t.id;
      out.calls[t.index].name += t.function?.name ?? '';
      out.calls[t.index].arguments += t.function?.arguments ?? '';
    }
  }
  return out;
}

/** What the agent received on one call (tool-call ids left out: servers make them up at random). */
export interface Received {
  content: string | null;
  /** The reasoning the server parsed out (`reasoning_content`), when it did. */
  reasoning: string | null;
  finish: string | null;
  calls: { name: string; arguments: string }[];
}

/**
 * A tool-using agent on the real `openai` SDK, through a sidecar's rollout route: for each query, it
 * calls the model and runs the calculator for each tool call until an answer has none (at most 8
 * calls a query), streamed or not. Returns what it received, call by call.
 */
export async function runCalculatorAgent(
  sidecar: TestSidecar,
  rollout: string,
  o: {
    stream: boolean;
    queries: readonly string[];
    system?: string;
    model?: string;
    /** Sent on every call (e.g. `x-group-id`). */
    headers?: Record<string, string>;
    /** Runs a tool call (default: `calculator` of its expression). */
    tool?: (call: { id: string; name: string; expression: string }) => string;
  },
): Promise<Received[]> {
  const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rollout}/v1`, apiKey: 'sk-test', maxRetries: 0, defaultHeaders: o.headers });
  const tool = o.tool ?? ((c: { expression: string }) => calculator(c.expression));
  const messages: ChatMessage[] = [{ role: 'system', content: o.system ?? 'You are a careful calculator agent.' }];
  const received: Received[] = [];
  for (const q of o.queries) {
    messages.push({ role: 'user', content: q });
    for (let step = 0; step < 8; step++) {
      const body = { model: o.model ?? 'Qwen/Qwen3-8B', messages: messages as never, tools: CALCULATOR_TOOLS };
      const { content, reasoning, finish, calls } = await completeChat(client, body, o.stream);
      received.push({ content, reasoning, finish, calls: calls.map((c) => ({ name: c.name, arguments: c.arguments })) });
      const assistant: ChatMessage = { role: 'assistant', content };
      if (calls.length > 0) assistant.tool_calls = calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } }));
      messages.push(assistant);
      if (calls.length === 0) break;
      for (const c of calls)
        messages.push({
          role: 'tool',
          tool_call_id: c.id,
          content: tool({ id: c.id, name: c.name, expression: (JSON.parse(c.arguments) as { expression: string }).expression }),
        });
    }
  }
  return received;
}
