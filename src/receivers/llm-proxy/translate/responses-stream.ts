import type { ChatDelta, ChatUsage } from './chat-answer';
import { ChatStreamTranslator } from './chat-stream';
import type { ResponsesContext } from './responses-request';
import {
  functionCallItem,
  logprobsOf,
  messageItem,
  outputTextPart,
  reasoningItem,
  responseObject,
  responsesIds,
  statusOf,
  validJson,
} from './responses-response';
import type { Json } from '../../../formats/json';
import { sseEvent } from '../../../formats/sse';
import { extend } from '../../../model/extend';

type Open =
  | { kind: 'reasoning'; index: number; text: string }
  | { kind: 'message'; index: number; text: string; logprobs: Json[] }
  | { kind: 'function'; index: number; toolIndex: number };

interface ToolState {
  index: number;
  id: string;
  callId: string;
  name: string;
  arguments: string;
  open: boolean;
}

/**
 * Turns a chat-completions stream into the Responses API event stream, chunk by chunk:
 * `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
 * its content events (`response.content_part.added`, `response.output_text.delta` / `.done`,
 * `response.content_part.done`; `response.reasoning_text.*`; `response.function_call_arguments.delta`
 * / `.done`) and `response.output_item.done`, then `response.completed` (or `response.incomplete`
 * for `finish_reason: length`), every event with its `sequence_number`.
 *
 * The terminal event waits for `end()`, because the usage chunk follows the finish chunk. A
 * stream that ends before a finish reason, an error chunk in the stream, or `fail()` ends the
 * stream with an `error` event, which the SDKs raise as an error. Nothing is sent after the
 * terminal event.
 */
export class ChatStreamToResponsesEvents extends ChatStreamTranslator {
  private seq = 0;
  private ids = responsesIds(null, '');
  private createdAt = 0;
  private model: string | null = null;
  private readonly items: Json[] = [];
  private open: Open | null = null;
  private readonly tools = new Map<number, ToolState>();

  constructor(private readonly ctx: ResponsesContext) {
    super();
  }

  /**
   * SSE text that ends the stream with an `error` event, e.g. when the upstream connection broke.
   * The event carries the Responses API's fields (`code`, `message`, `param`) and an `error`
   * object: the openai SDK raises any event whose data has `error` as an APIError, so both the
   * plain SDK and the Agents SDK fail the call instead of reading a partial response as final.
   */
  fail(message: string, code = 'server_error'): string {
    return this.stop(() => this.emit('error', { code, message, param: null, error: { type: 'server_error', code, message, param: null } }));
  }

  protected upstreamFailed(message: string): string {
    return this.fail(message, 'server_error');
  }

  protected start(d: ChatDelta): string {
    this.ids = responsesIds(d.id, this.ctx.idSeed);
    this.createdAt = d.created ?? 0;
    this.model = d.model;
    const response = responseObject(
      { id: this.ids.response, createdAt: this.createdAt, model: this.model, status: 'in_progress', output: [], usage: null },
      this.ctx,
    );
    return this.emit('response.created', { response }) + this.emit('response.in_progress', { response });
  }

  protected delta(d: ChatDelta): string {
    let out = '';
    if (d.reasoning !== '') {
      if (this.open?.kind !== 'reasoning') out += this.close() + this.openReasoning();
      const open = this.open as Extract<Open, { kind: 'reasoning' }>;
      open.text += d.reasoning;
      out += this.emit('response.reasoning_text.delta', { item_id: this.items[open.index].id, output_index: open.index, content_index: 0, delta: d.reasoning });
    }
    if (d.content !== '') {
      if (this.open?.kind !== 'message') out += this.close() + this.openMessage();
      const open = this.open as Extract<Open, { kind: 'message' }>;
      const logprobs = this.ctx.includeLogprobs ? logprobsOf(d.logprobs) : [];
      open.text += d.content;
      open.logprobs.push(...logprobs);
      out += this.emit('response.output_text.delta', {
        item_id: this.items[open.index].id,
        output_index: open.index,
        content_index: 0,
        delta: d.content,
        logprobs,
      });
    }
    for (const tc of d.toolCalls) {
      let tool = this.tools.get(tc.index);
      if (!tool) {
        out += this.close();
        const index = this.items.length;
        tool = { index, id: this.ids.functionCall(index), callId: tc.id ?? this.ids.callId(tc.index), name: tc.name ?? '', arguments: '', open: true };
        this.tools.set(tc.index, tool);
        this.items.push(functionCallItem(tool.id, { id: tool.callId, name: tool.name, arguments: '' }, tool.callId, 'in_progress'));
        this.open = { kind: 'function', index, toolIndex: tc.index };
        out += this.emit('response.output_item.added', { output_index: index, item: this.items[index] });
      } else if (tool.name === '' && tc.name) {
        tool.name = tc.name;
      }
      if (tc.arguments === '') continue;
      tool.arguments += tc.arguments;
      // Late fragments of an item already closed still reach the final response, not the events.
      if (tool.open) out += this.emit('response.function_call_arguments.delta', { item_id: tool.id, output_index: tool.index, delta: tc.arguments });
    }
    return out;
  }

  protected finish(): string {
    return this.close();
  }

  protected terminal(finishReason: string, usage: ChatUsage): string {
    const out = this.close();
    this.foldLateArguments();
    const { status, incompleteReason } = statusOf(finishReason);
    const response = responseObject(
      { id: this.ids.response, createdAt: this.createdAt, model: this.model, status, output: this.items, usage, incompleteReason },
      this.ctx,
    );
    return out + this.emit(status === 'completed' ? 'response.completed' : 'response.incomplete', { response });
  }

  private openReasoning(): string {
    const index = this.items.length;
    const item = reasoningItem(this.ids.reasoning(index), '', 'in_progress');
    this.items.push(item);
    this.open = { kind: 'reasoning', index, text: '' };
    return (
      this.emit('response.output_item.added', { output_index: index, item: extend(item, { content: [] }) }) +
      this.emit('response.content_part.added', { item_id: item.id, output_index: index, content_index: 0, part: { type: 'reasoning_text', text: '' } })
    );
  }

  private openMessage(): string {
    const index = this.items.length;
    const item = messageItem(this.ids.message(index), '', null, 'in_progress');
    this.items.push(item);
    this.open = { kind: 'message', index, text: '', logprobs: [] };
    return (
      this.emit('response.output_item.added', { output_index: index, item: extend(item, { content: [] }) }) +
      this.emit('response.content_part.added', {
        item_id: item.id,
        output_index: index,
        content_index: 0,
        part: outputTextPart('', this.ctx.includeLogprobs ? [] : null),
      })
    );
  }

  /** Ends the open item, if any: its `.done` events with the full text or arguments. */
  private close(): string {
    const open = this.open;
    if (!open) return '';
    this.open = null;
    const id = this.items[open.index].id as string;
    if (open.kind === 'reasoning') {
      const item = reasoningItem(id, open.text, 'completed');
      this.items[open.index] = item;
      return (
        this.emit('response.reasoning_text.done', { item_id: id, output_index: open.index, content_index: 0, text: open.text }) +
        this.emit('response.content_part.done', {
          item_id: id,
          output_index: open.index,
          content_index: 0,
          part: { type: 'reasoning_text', text: open.text },
        }) +
        this.emit('response.output_item.done', { output_index: open.index, item })
      );
    }
    if (open.kind === 'message') {
      const logprobs = this.ctx.includeLogprobs ? open.logprobs : null;
      const item = messageItem(id, open.text, logprobs, 'completed');
      this.items[open.index] = item;
      return (
        this.emit('response.output_text.done', { item_id: id, output_index: open.index, content_index: 0, text: open.text, logprobs: logprobs ?? [] }) +
        this.emit('response.content_part.done', { item_id: id, output_index: open.index, content_index: 0, part: outputTextPart(open.text, logprobs) }) +
        this.emit('response.output_item.done', { output_index: open.index, item })
      );
    }
    const tool = this.tools.get(open.toolIndex)!;
    tool.open = false;
    if (!validJson(tool.arguments)) this.note(`malformed_tool_arguments:${tool.callId}`);
    return (
      this.emit('response.function_call_arguments.done', { item_id: id, output_index: open.index, name: tool.name, arguments: tool.arguments }) +
      this.emit('response.output_item.done', { output_index: open.index, item: this.finalToolItem(tool) })
    );
  }

  private finalToolItem(tool: ToolState): Json {
    const item = functionCallItem(tool.id, { id: tool.callId, name: tool.name, arguments: tool.arguments }, tool.callId, 'completed');
    this.items[tool.index] = item;
    return item;
  }

  /** Argument fragments that arrived after their item closed reach the terminal snapshot. */
  private foldLateArguments(): void {
    for (const tool of this.tools.values()) if (!tool.open) this.finalToolItem(tool);
  }

  private emit(type: string, payload: Json): string {
    return sseEvent(type, { type, sequence_number: this.seq++, ...payload });
  }
}
