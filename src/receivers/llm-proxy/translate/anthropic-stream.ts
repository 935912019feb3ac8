import { argumentsObject, type ChatDelta, type ChatUsage } from './chat-answer';
import { ChatStreamTranslator } from './chat-stream';
import type { AnthropicContext } from './anthropic-request';
import { anthropicErrorType, anthropicMessageId, anthropicUsage, messageShell, stopReasonOf } from './anthropic-response';
import type { Json } from '../../../formats/json';
import { sseEvent } from '../../../formats/sse';
import { idBase } from './ids';

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
export class ChatStreamToAnthropicEvents extends ChatStreamTranslator {
  private messageId = '';
  private base = '';
  private model = '';
  private blockCount = 0;
  private textBlock: number | null = null;
  private readonly pending = new Map<number, PendingTool>();
  private readonly flushed = new Set<number>();
  private hadToolCalls = false;
  private stopReason: string | number | null = null;

  constructor(private readonly ctx: AnthropicContext) {
    super();
  }

  /** Anthropic's in-stream `error` event, typed by the HTTP status it stands for. */
  fail(message: string, status = 500): string {
    return this.stop(() => sseEvent('error', { type: 'error', error: { type: anthropicErrorType(status), message } }));
  }

  protected upstreamFailed(message: string, cut: boolean): string {
    return cut ? this.fail(message, 502) : this.fail(message, 500);
  }

  protected delta(d: ChatDelta): string {
    let out = '';
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
        this.note(`late_tool_arguments:${tc.index}`);
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
    return out;
  }

  protected finish(d: ChatDelta): string {
    this.stopReason = d.stopReason;
    return this.closeText() + this.flushTools();
  }

  protected terminal(finishReason: string, usage: ChatUsage): string {
    let out = this.closeText() + this.flushTools();
    if (this.blockCount === 0) {
      out += sseEvent('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
      out += sseEvent('content_block_stop', { type: 'content_block_stop', index: 0 });
      this.blockCount = 1;
    }
    const stop = stopReasonOf(finishReason, this.stopReason, this.hadToolCalls, this.ctx);
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
    return out;
  }

  protected start(d: ChatDelta): string {
    const { id, model } = d;
    this.base = idBase(id, this.ctx.idSeed);
    this.messageId = anthropicMessageId(id, this.ctx.idSeed);
    this.model = model ?? this.ctx.model ?? '';
    const usage = anthropicUsage({ promptTokens: this.promptTokens ?? 0, completionTokens: 0, cachedTokens: 0 });
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
      if (malformed) this.note(`malformed_tool_arguments:${tool.id}`);
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
