import { holdPartial, type ToolCallOut, type ToolStream } from './parser-kit';

// DeepSeek's tool-call tokens (ordinary added tokens, so they stay in the sampled text).
const CALLS_BEGIN = '<｜tool▁calls▁begin｜>';
const CALL_BEGIN = '<｜tool▁call▁begin｜>';
const CALL_END = '<｜tool▁call▁end｜>';

/**
 * One call's text between its begin and end tokens. DeepSeek-V3 (and R1, V3-0324):
 * `function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n````; DeepSeek-V3.1: `NAME<｜tool▁sep｜>ARGUMENTS`.
 * The type, the name and the fence lines are single lines, as in vLLM's patterns.
 */
const BODY = {
  v3: /^[^\n]*<｜tool▁sep｜>([^\n]*)\n```json\n([\s\S]*)\n```$/,
  'v3.1': /^([^\n]*?)<｜tool▁sep｜>([\s\S]*)$/,
} as const;

/**
 * vLLM's `deepseek_v3` tool-call parser (DeepSeek-V3, V3-0324, R1), or with `'v3.1'` its
 * `deepseek_v31` one. The model writes its calls after the answer text as
 * `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`
 * (V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`). Output without
 * `<｜tool▁calls▁begin｜>` is all content. The content is the text before it; text between, around
 * and after the calls is dropped (vLLM drops it). Each `<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>` is a
 * call; its arguments are given as the model wrote them (vLLM does not re-serialize them), once
 * they parse as JSON. A call that does not have the format, or whose arguments do not parse, is
 * given back as content, with a note (vLLM drops it, or passes the broken arguments on). A last
 * call left open at the end of the output (the answer was cut) is read when it is complete but
 * for its end token, and given back as content otherwise (vLLM drops it). vLLM's patterns take
 * arguments on one line; arguments written over several lines are read here too.
 */
export class DeepSeekV3ToolParser implements ToolStream {
  private inCalls = false;
  private held = '';
  private readonly noteList: string[] = [];
  private readonly body: RegExp;

  constructor(format: 'v3' | 'v3.1' = 'v3') {
    this.body = BODY[format];
  }

  get notes(): readonly string[] {
    return this.noteList;
  }

  push(text: string): { content: string; calls: ToolCallOut[] } {
    let buf = this.held + text;
    this.held = '';
    let content = '';
    const calls: ToolCallOut[] = [];
    if (!this.inCalls) {
      const at = buf.indexOf(CALLS_BEGIN);
      if (at < 0) {
        const [safe, held] = holdPartial(buf, CALLS_BEGIN);
        this.held = held;
        return { content: safe, calls };
      }
      content = buf.slice(0, at);
      buf = buf.slice(at + CALLS_BEGIN.length);
      this.inCalls = true;
    }
    for (;;) {
      const start = buf.indexOf(CALL_BEGIN);
      if (start < 0) {
        // Text between and after calls (`\n`, `<｜tool▁calls▁end｜>`): dropped, but a call may be starting.
        this.held = holdPartial(buf, CALL_BEGIN)[1];
        break;
      }
      const close = buf.indexOf(CALL_END, start);
      if (close < 0) {
        this.held = buf.slice(start);
        break;
      }
      content += this.call(buf.slice(start + CALL_BEGIN.length, close), calls, buf.slice(start, close + CALL_END.length));
      buf = buf.slice(close + CALL_END.length);
    }
    return { content, calls };
  }

  end(): { content: string; calls: ToolCallOut[] } {
    const rest = this.held;
    this.held = '';
    const calls: ToolCallOut[] = [];
    if (!this.inCalls) return { content: rest, calls };
    if (!rest.startsWith(CALL_BEGIN)) return { content: '', calls };
    const content = this.call(rest.slice(CALL_BEGIN.length), calls, rest);
    return { content, calls };
  }

  /** Reads one call's text into `calls`; the raw text to show as content when it does not parse. */
  private call(body: string, calls: ToolCallOut[], raw: string): string {
    const m = this.body.exec(body);
    if (m && m[1] !== '' && parses(m[2])) {
      calls.push({ name: m[1], arguments: m[2] });
      return '';
    }
    this.noteList.push('tool_call_unparsed');
    return raw;
  }
}

function parses(json: string): boolean {
  try {
    JSON.parse(json);
    return true;
  } catch {
    return false;
  }
}
