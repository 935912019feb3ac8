import { readChatChunk, usageOrCounts, type ChatDelta, type ChatUsage } from './chat-answer';

/**
 * What the stream translators share: the bookkeeping of a chat-completions stream read chunk by
 * chunk. It reads each chunk, starts the translated stream at the first one, counts the prompt
 * and completion tokens and keeps the usage (which comes after the finish chunk), holds the
 * finish reason, and ends the stream exactly once: with the terminal events at `end()`, or with
 * an error event (an error chunk, a stream that ends before any chunk or before a finish reason,
 * or `fail()`). Nothing is sent after that. A subclass writes the events of its API.
 */
export abstract class ChatStreamTranslator {
  private started = false;
  private finished = false;
  private finishReason: string | null = null;
  private usage: ChatUsage | null = null;
  private promptTokenCount: number | null = null;
  private tokenCount = 0;
  private readonly noteList: string[] = [];

  /** True once the terminal (or error) event has been produced. */
  get done(): boolean {
    return this.finished;
  }

  /** Things worth recording about the translation (e.g. `malformed_tool_arguments:<call id>`). */
  get notes(): readonly string[] {
    return this.noteList;
  }

  /** SSE text for one parsed chat chunk (possibly ''). */
  push(chunk: Record<string, unknown>): string {
    if (this.finished) return '';
    const d = readChatChunk(chunk);
    if (d.error) return this.upstreamFailed(d.error.message, false);
    let out = '';
    if (d.promptTokenCount !== null) this.promptTokenCount = d.promptTokenCount;
    if (!this.started) {
      this.started = true;
      out += this.start(d);
    }
    this.tokenCount += d.tokenCount;
    if (d.usage) this.usage = d.usage;
    out += this.delta(d);
    if (d.finishReason !== null) {
      this.finishReason = d.finishReason;
      out += this.finish(d);
    }
    return out;
  }

  /** SSE text for the end of the upstream stream: the terminal events. */
  end(): string {
    if (this.finished) return '';
    if (!this.started) return this.upstreamFailed('upstream stream ended without any chunk', true);
    if (this.finishReason === null) return this.upstreamFailed('upstream stream ended before the model finished', true);
    const usage = usageOrCounts({
      usage: this.usage,
      promptTokenCount: this.promptTokenCount,
      completionTokenCount: this.tokenCount > 0 ? this.tokenCount : null,
    });
    const out = this.terminal(this.finishReason, usage);
    this.finished = true;
    return out;
  }

  /** The prompt's token count so far (from the chunks' prompt ids), if any chunk carried them. */
  protected get promptTokens(): number | null {
    return this.promptTokenCount;
  }

  protected note(note: string): void {
    this.noteList.push(note);
  }

  /** Ends the stream with `errorEvent()` unless it has ended; '' when it has. */
  protected stop(errorEvent: () => string): string {
    if (this.finished) return '';
    this.finished = true;
    return errorEvent();
  }

  /** The events that open the stream, at its first chunk (whose prompt token count is already in). */
  protected abstract start(d: ChatDelta): string;
  /** The events for a chunk's content and tool calls. */
  protected abstract delta(d: ChatDelta): string;
  /** The events closing what is open, at the chunk that carries the finish reason. */
  protected abstract finish(d: ChatDelta): string;
  /** The terminal events; `usage` is what the server sent, or the tokens counted. */
  protected abstract terminal(finishReason: string, usage: ChatUsage): string;
  /** The error event for an error chunk (`cut: false`) or a stream that ended early (`cut: true`). */
  protected abstract upstreamFailed(message: string, cut: boolean): string;
}
