/**
 * Output parsers for token-in: the model's sampled text turned back into what chat completions
 * would have answered, as vLLM does with `--reasoning-parser` and `--tool-call-parser`. Named as
 * vLLM names them; each is one module, driven as a stream (a whole answer is one push), so a
 * streamed and a whole answer split the same text the same way. Adding one: a module with a
 * class implementing the interface below, and a line in parsers.ts.
 */

/** Splits thinking from the answer, a text delta at a time. */
export interface ReasoningStream {
  /** The reasoning and content this delta adds (either may be ''). */
  push(text: string): { reasoning: string; content: string };
  /** What was held back at the end of the output. */
  end(): { reasoning: string; content: string };
  /** Reasoning was seen at all (else the answer's reasoning field is null). */
  readonly reasoned: boolean;
}

export interface ToolCallOut {
  name: string;
  /** JSON text, as the server's parser serializes it. */
  arguments: string;
}

/** Finds tool calls in the answer's content, a content delta at a time. */
export interface ToolStream {
  /** The content text to show and the tool calls completed by this delta. */
  push(text: string): { content: string; calls: ToolCallOut[] };
  end(): { content: string; calls: ToolCallOut[] };
  /** Things worth recording (e.g. a call whose JSON did not parse). */
  readonly notes: readonly string[];
}

/** Holds back the end of `buf` that could be the start of `tag`; returns [safe, held]. */
export function holdPartial(buf: string, tag: string): [string, string] {
  for (let n = Math.min(tag.length - 1, buf.length); n > 0; n--)
    if (tag.startsWith(buf.slice(buf.length - n))) return [buf.slice(0, buf.length - n), buf.slice(buf.length - n)];
  return [buf, ''];
}

/**
 * Tool calls written between an open and a close tag after the answer text, as several models
 * write them (hermes: `<tool_call>…</tool_call>`; DeepSeek: `<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>`
 * after `<｜tool▁calls▁begin｜>`). The content is the text before `section` (the first call's open
 * tag, or a marker of its own that `keepSection` false drops); text between and after calls is
 * dropped, as vLLM drops it. A last call left open at the end of the output is read too. What a
 * call says is the subclass's `call`, which gives back the raw text to show when it does not parse.
 */
export abstract class DelimitedToolParser implements ToolStream {
  private inCalls = false;
  private held = '';
  protected readonly noteList: string[] = [];

  constructor(
    private readonly section: string,
    private readonly keepSection: boolean,
    private readonly open: string,
    private readonly close: string,
  ) {}

  get notes(): readonly string[] {
    return this.noteList;
  }

  push(text: string): { content: string; calls: ToolCallOut[] } {
    let buf = this.held + text;
    this.held = '';
    let content = '';
    const calls: ToolCallOut[] = [];
    if (!this.inCalls) {
      const at = buf.indexOf(this.section);
      if (at < 0) {
        const [safe, held] = holdPartial(buf, this.section);
        this.held = held;
        return { content: safe, calls };
      }
      content = buf.slice(0, at);
      buf = buf.slice(this.keepSection ? at : at + this.section.length);
      this.inCalls = true;
    }
    for (;;) {
      const start = buf.indexOf(this.open);
      if (start < 0) {
        // Text between and after calls: dropped, but a call may be starting.
        this.held = holdPartial(buf, this.open)[1];
        break;
      }
      const close = buf.indexOf(this.close, start);
      if (close < 0) {
        this.held = buf.slice(start);
        break;
      }
      content += this.call(buf.slice(start + this.open.length, close), calls, buf.slice(start, close + this.close.length));
      buf = buf.slice(close + this.close.length);
    }
    return { content, calls };
  }

  end(): { content: string; calls: ToolCallOut[] } {
    const rest = this.held;
    this.held = '';
    const calls: ToolCallOut[] = [];
    if (!this.inCalls) return { content: rest, calls };
    if (!rest.startsWith(this.open)) return { content: '', calls };
    const content = this.call(rest.slice(this.open.length), calls, rest);
    return { content, calls };
  }

  /** Reads one call's text into `calls`; the raw text to show as content when it does not parse. */
  protected abstract call(body: string, calls: ToolCallOut[], raw: string): string;
}
