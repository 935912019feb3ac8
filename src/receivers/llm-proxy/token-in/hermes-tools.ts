import { holdPartial, type ToolCallOut, type ToolStream } from './parser-kit';

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

/**
 * vLLM's `hermes` tool-call parser (Hermes 2 Pro, Qwen2.5, Qwen3): each
 * `<tool_call>{"name": …, "arguments": {…}}</tool_call>` is a call; a last one left open at the
 * end of the output is read too. The content is the text before the first call; text between
 * and after calls is dropped (vLLM drops it). Arguments are written back as Python's
 * `json.dumps` writes them (`", "` and `": "`), as vLLM's parser does. A call whose JSON does not
 * parse is given back as content, with a note.
 */
export class HermesToolParser implements ToolStream {
  private inCalls = false;
  private held = '';
  private readonly noteList: string[] = [];

  get notes(): readonly string[] {
    return this.noteList;
  }

  push(text: string): { content: string; calls: ToolCallOut[] } {
    let buf = this.held + text;
    this.held = '';
    let content = '';
    const calls: ToolCallOut[] = [];
    if (!this.inCalls) {
      const at = buf.indexOf(OPEN);
      if (at < 0) {
        const [safe, held] = holdPartial(buf, OPEN);
        this.held = held;
        return { content: safe, calls };
      }
      content = buf.slice(0, at);
      buf = buf.slice(at);
      this.inCalls = true;
    }
    for (;;) {
      const start = buf.indexOf(OPEN);
      if (start < 0) {
        // Text after a call: dropped, but a tag may be starting.
        this.held = holdPartial(buf, OPEN)[1];
        break;
      }
      const close = buf.indexOf(CLOSE, start);
      if (close < 0) {
        this.held = buf.slice(start);
        break;
      }
      content += this.call(buf.slice(start + OPEN.length, close), calls, buf.slice(start, close + CLOSE.length));
      buf = buf.slice(close + CLOSE.length);
    }
    return { content, calls };
  }

  end(): { content: string; calls: ToolCallOut[] } {
    const rest = this.held;
    this.held = '';
    const calls: ToolCallOut[] = [];
    if (!this.inCalls) return { content: rest, calls };
    if (!rest.startsWith(OPEN)) return { content: '', calls };
    const content = this.call(rest.slice(OPEN.length), calls, rest);
    return { content, calls };
  }

  /** Parses one call's body into `calls`; the raw text to show as content when it does not parse. */
  private call(body: string, calls: ToolCallOut[], raw: string): string {
    try {
      const v = JSON.parse(body) as { name?: unknown; arguments?: unknown };
      if (typeof v.name !== 'string') throw new Error('no name');
      calls.push({ name: v.name, arguments: pythonJson(v.arguments ?? {}) });
      return '';
    } catch {
      this.noteList.push('tool_call_unparsed');
      return raw;
    }
  }
}

/** JSON as Python's `json.dumps(v, ensure_ascii=False)` writes it: `", "` between members, `": "` after keys. */
export function pythonJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return `[${v.map(pythonJson).join(', ')}]`;
  return `{${Object.entries(v as Record<string, unknown>)
    .map(([k, x]) => `${JSON.stringify(k)}: ${pythonJson(x)}`)
    .join(', ')}}`;
}
