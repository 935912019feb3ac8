import { argumentsObject, readChatChunk, usageOrCounts, type ChatUsage } from './chat-answer';
import type { AnthropicContext } from './anthropic-request';
import { anthropicErrorType, anthropicMessageId, anthropicUsage, messageShell, stopReasonOf } from './anthropic-response';
import { idBase, sseEvent, type Json } from './values';

interface PendingTool {
  toolIndex: number;
  id: string;
  name: string;
  arguments: string;
}

/**
 * Turns a chat-completions stream into Anthropic's Messages event stream: `message_start`, a
 * `ping`, then per content block `content_block_start`, `content_block_delta` (`text_delta`,
 * `input_json_delta`) and `content_block_stop`, then `message_delta` (stop reason, usage) and
 * `message_stop`, each with its `event:` line (the Anthropic SDK ignores events without one).
 *
 * Text streams as it comes. A `tool_use` block is sent whole when its call is complete (at the
 * next text, or the finish): its `input` must parse as an object, which cannot be known from a
 * prefix, so the arguments go out as one `input_json_delta` of valid JSON (`{}` for malformed
 * arguments, noted). The terminal events wait for `end()`, because the usage chunk follows the
 * finish chunk. An error chunk, a stream that ends before a finish reason, or `fail()` sends
 * Anthropic's `error` event, which the SDK raises as an APIError.
 */
export class ChatStreamToAnthropicEvents {
  private started = false;
  private finished = false;
  private messageId = '';
  private base = '';
  private model = '';
  private blockCount = 0;
  private textBlock: number | null = null;
  private readonly pending = new Map<number, PendingTool>();
  private readonly flushed = new Set<number>();
  private hadToolCalls = false;
  private finishReason: string | null = null;
  private stopReason: string | number | null = null;
  private usage: ChatUsage | null = null;
  private promptTokenCount: number | null = null;
  private tokenCount = 0;
  private readonly noteList: string[] = [];

  constructor(private readonly ctx: AnthropicContext) {}

  get done(): boolean {
    return this.finished;
  }

  get notes(): readonly string[] {
    return this.noteList;
  }

  push(chunk: Record<string, unknown>): string {
    if (this.finished) return '';
    const d = readChatChunk(chunk);
    if (d.error) return this.fail(d.error.message, 500);
    let out = '';
    if (d.promptTokenCount !== null) this.promptTokenCount = d.promptTokenCount;
    if (!this.started) out += this.start(d.id, d.model);
    this.tokenCount += d.tokenCount;
    if (d.usage) this.usage = d.usage;
    if (d.content !== '') {
      if (this.textBlock === null) {
        out += this.flushTools();
        this.textBlock = this.blockCount++;
        out += sseEvent('content_block_start', { type: 'content_block_start', index: this.textBlock, content_block: { type: 'text', text: '' } });
      }
      out += sseEvent('content_block_delta', { type: 'content_block_delta', index: this.textBlock, delta: { type: 'text_delta', text: d.content } });
    }
    for (const tc of d.toolCalls) {
      this.hadToolCalls = true;
      if (this.flushed.has(tc.index)) {
        this.noteList.push(`late_tool_arguments:${tc.index}`);
        continue;
      }
      let tool = this.pending.get(tc.index);
      if (!tool) {
        out += this.closeText();
        tool = { toolIndex: tc.index, id: tc.id ?? `toolu_${this.base}_${tc.index}`, name: tc.name ?? '', arguments: '' };
        this.pending.set(tc.index, tool);
      } else if (tool.name === '' && tc.name) {
        tool.name = tc.name;
      }
      tool.arguments += tc.arguments;
    }
    if (d.finishReason !== null) {
      this.finishReason = d.finishReason;
      this.stopReason = d.stopReason;
      out += this.closeText() + this.flushTools();
    }
    return out;
  }

  end(): string {
    if (this.finished) return '';
    if (!this.started) return this.fail('upstream stream ended without any chunk', 502);
    if (this.finishReason === null) return this.fail('upstream stream ended before the model finished', 502);
    let out = this.closeText() + this.flushTools();
    if (this.blockCount === 0) {
      out += sseEvent('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
      out += sseEvent('content_block_stop', { type: 'content_block_stop', index: 0 });
      this.blockCount = 1;
    }
    const stop = stopReasonOf(this.finishReason, this.stopReason, this.hadToolCalls, this.ctx);
    const usage = usageOrCounts({
      usage: this.usage,
      promptTokenCount: this.promptTokenCount,
      completionTokenCount: this.tokenCount > 0 ? this.tokenCount : null,
    });
    const u = anthropicUsage(usage);
    out += sseEvent('message_delta', {
      type: 'message_delta',
      delta: { stop_reason: stop.stopReason, stop_sequence: stop.stopSequence, stop_details: null },
      usage: {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_creation_input_tokens: null,
        cache_read_input_tokens: u.cache_read_input_tokens,
        server_tool_use: null,
      },
    });
    out += sseEvent('message_stop', { type: 'message_stop' });
    this.finished = true;
    return out;
  }

  /** Anthropic's in-stream `error` event, typed by the HTTP status it stands for. */
  fail(message: string, status = 500): string {
    if (this.finished) return '';
    this.finished = true;
    return sseEvent('error', { type: 'error', error: { type: anthropicErrorType(status), message } });
  }

  private start(id: string | null, model: string | null): string {
    this.started = true;
    this.base = idBase(id, this.ctx.idSeed);
    this.messageId = anthropicMessageId(id, this.ctx.idSeed);
    this.model = model ?? this.ctx.model ?? '';
    const usage = anthropicUsage({ promptTokens: this.promptTokenCount ?? 0, completionTokens: 0, cachedTokens: 0 });
    const message = messageShell(this.messageId, this.model, [], { stopReason: null, stopSequence: null }, usage);
    return sseEvent('message_start', { type: 'message_start', message }) + sseEvent('ping', { type: 'ping' });
  }

  private closeText(): string {
    if (this.textBlock === null) return '';
    const index = this.textBlock;
    this.textBlock = null;
    return sseEvent('content_block_stop', { type: 'content_block_stop', index });
  }

  /** Sends every pending tool call as a whole `tool_use` block, in call order. */
  private flushTools(): string {
    let out = '';
    const tools = [...this.pending.values()].sort((a, b) => a.toolIndex - b.toolIndex);
    for (const tool of tools) {
      const index = this.blockCount++;
      const { malformed } = argumentsObject(tool.arguments);
      if (malformed) this.noteList.push(`malformed_tool_arguments:${tool.id}`);
      const block: Json = { type: 'tool_use', id: tool.id, name: tool.name, input: {} };
      out += sseEvent('content_block_start', { type: 'content_block_start', index, content_block: block });
      out += sseEvent('content_block_delta', {
        type: 'content_block_delta',
        index,
        delta: { type: 'input_json_delta', partial_json: malformed ? '{}' : tool.arguments },
      });
      out += sseEvent('content_block_stop', { type: 'content_block_stop', index });
      this.flushed.add(tool.toolIndex);
    }
    this.pending.clear();
    return out;
  }
}
