/**
 * A deterministic stand-in for a model tokenizer and chat template, so the fake model server
 * can answer with token ids the way vLLM does and tests can predict them exactly. A prompt is
 * rendered ChatML-style; an assistant turn renders the same way in the response and when it is
 * sent back in a later prompt, so multi-turn prompts continue the previous prompt + response.
 */
export const IM_START = 1;
export const IM_END = 2;
const ROLE_IDS: Record<string, number> = { system: 3, user: 4, assistant: 5, tool: 6, developer: 7 };

/** Splits text into word and whitespace pieces; each piece is one token. */
export function pieces(text: string): string[] {
  return text.match(/\s+|[^\s]+/g) ?? [];
}

export function tokenId(piece: string): number {
  let h = 2166136261;
  for (let i = 0; i < piece.length; i++) {
    h ^= piece.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return 100 + ((h >>> 0) % 50_000);
}

export function tokenize(text: string): number[] {
  return pieces(text).map(tokenId);
}

/** The logprob the fake model reports for a token: deterministic, negative, finite. */
export function logprobOf(id: number, position: number): number {
  return -(((id * 31 + position * 7) % 997) / 1000) - 0.001;
}

export interface TemplateToolCall {
  name: string;
  arguments: string;
}

export function renderAssistant(content: string | null, toolCalls: TemplateToolCall[]): string {
  let text = content ?? '';
  for (const tc of toolCalls) text += `<tool_call>${tc.name} ${tc.arguments}</tool_call>`;
  return text;
}

/** Tokens of an assistant turn's body plus the end marker, as the model generates it. */
export function assistantTokens(content: string | null, toolCalls: TemplateToolCall[]): number[] {
  return [...tokenize(renderAssistant(content, toolCalls)), IM_END];
}

interface ChatMessage {
  role?: unknown;
  content?: unknown;
  tool_calls?: unknown;
}

function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content
      .map((p) => (typeof p === 'object' && p !== null && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : ''))
      .join('');
  }
  return '';
}

function toolCallsOf(m: ChatMessage): TemplateToolCall[] {
  // Anthropic: tool_use blocks in the assistant's content.
  if (Array.isArray(m.content)) {
    return (m.content as { type?: string; name?: string; input?: unknown }[])
      .filter((b) => b?.type === 'tool_use')
      .map((b) => ({ name: b.name ?? '', arguments: JSON.stringify(b.input ?? {}) }));
  }
  if (!Array.isArray(m.tool_calls)) return [];
  return m.tool_calls.map((tc) => {
    const fn = (tc as { function?: { name?: string; arguments?: string } }).function ?? {};
    return { name: fn.name ?? '', arguments: fn.arguments ?? '' };
  });
}

/** `<|im_start|>role …<|im_end|>` per message, then an open assistant turn. */
export function renderPrompt(messages: ChatMessage[]): number[] {
  const ids: number[] = [];
  for (const m of messages) {
    const role = typeof m.role === 'string' ? m.role : 'user';
    ids.push(IM_START, ROLE_IDS[role] ?? 8);
    // Appended one by one: a spread of a 256k-token message would overflow the call stack.
    const add = (xs: number[]) => {
      for (const x of xs) ids.push(x);
    };
    if (role === 'assistant') add(assistantTokens(m.content === null || m.content === undefined ? null : contentText(m.content), toolCallsOf(m)));
    else add([...tokenize(contentText(m.content)), IM_END]);
  }
  ids.push(IM_START, ROLE_IDS.assistant);
  return ids;
}
