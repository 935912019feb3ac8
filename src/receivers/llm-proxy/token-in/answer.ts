import { randomBytes } from 'node:crypto';
import type { ReasoningStream, ToolCallOut, ToolStream } from './parser-kit';
import { extend } from '../../../model/extend';

/** What the agent's chat answer is built from: the completions answer's text, read as it comes. */
export interface ChatPieces {
  reasoning: string;
  content: string;
  calls: (ToolCallOut & { id: string })[];
}

/**
 * Turns the model's sampled text into a chat completion's message, a delta at a time, with the
 * reasoning and tool-call parsers: as vLLM's chat route answers with `--reasoning-parser` and
 * `--tool-call-parser`. Whole answers are one delta and `end()`.
 */
export class SampledText {
  private readonly pieces: ChatPieces = { reasoning: '', content: '', calls: [] };

  constructor(
    private readonly reasoning: ReasoningStream,
    private readonly tools: ToolStream | null,
  ) {}

  get notes(): readonly string[] {
    return this.tools?.notes ?? [];
  }

  /** What this text delta adds. */
  push(text: string): ChatPieces {
    return this.take(this.reasoning.push(text), false);
  }

  /** What was held back, at the end of the output. */
  end(): ChatPieces {
    return this.take(this.reasoning.end(), true);
  }

  /** Everything so far, as a chat message. */
  message(): Record<string, unknown> {
    const p = this.pieces;
    const reasoning = this.reasoning.reasoned ? p.reasoning : null;
    return {
      role: 'assistant',
      content: p.content === '' ? null : p.content,
      reasoning_content: reasoning,
      reasoning,
      tool_calls: p.calls.map(chatToolCall),
    };
  }

  get toolCalls(): number {
    return this.pieces.calls.length;
  }

  private take(r: { reasoning: string; content: string }, last: boolean): ChatPieces {
    let content = r.content;
    let calls: ToolCallOut[] = [];
    if (this.tools) {
      const t = this.tools.push(content);
      content = t.content;
      calls = t.calls;
      if (last) {
        const e = this.tools.end();
        content += e.content;
        calls = [...calls, ...e.calls];
      }
    }
    const withIds = calls.map((c) => extend(c, { id: `chatcmpl-tool-${randomBytes(16).toString('hex')}` }));
    this.pieces.reasoning += r.reasoning;
    this.pieces.content += content;
    this.pieces.calls.push(...withIds);
    return { reasoning: r.reasoning, content, calls: withIds };
  }
}

/** A parsed tool call as chat completions gives it (whole in a message, or in one stream delta). */
function chatToolCall(c: ChatPieces['calls'][number]): Record<string, unknown> {
  return { id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } };
}

/** The chat finish reason: `tool_calls` when calls were parsed, else the server's. */
export function chatFinish(serverFinish: string | null, toolCalls: number): string {
  return toolCalls > 0 ? 'tool_calls' : (serverFinish ?? 'stop');
}

/** One chat stream event (`data: …\n\n`) for a choice delta, or the usage chunk (`delta` null). */
export function chatChunk(
  head: { id: string; created: number; model: unknown },
  delta: Record<string, unknown> | null,
  finish: string | null,
  usage?: unknown,
): string {
  const choices = delta === null ? [] : [{ index: 0, delta, logprobs: null, finish_reason: finish }];
  const chunk: Record<string, unknown> = { id: head.id, object: 'chat.completion.chunk', created: head.created, model: head.model, choices };
  if (usage !== undefined) chunk.usage = usage;
  return `data: ${JSON.stringify(chunk)}\n\n`;
}

/** The chat deltas for what a text delta added (reasoning, content, each completed tool call). */
export function deltasOf(p: ChatPieces, toolIndex: number): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  if (p.reasoning !== '') out.push({ reasoning_content: p.reasoning, reasoning: p.reasoning });
  if (p.content !== '') out.push({ content: p.content });
  p.calls.forEach((c, i) => out.push({ tool_calls: [{ index: toolIndex + i, ...chatToolCall(c) }] }));
  return out;
}
