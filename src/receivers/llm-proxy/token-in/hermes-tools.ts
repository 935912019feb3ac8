import { DelimitedToolParser, type ToolCallOut } from './parser-kit';

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
export class HermesToolParser extends DelimitedToolParser {
  constructor() {
    super(OPEN, true, OPEN, CLOSE);
  }

  /** Parses one call's body into `calls`; the raw text to show as content when it does not parse. */
  protected call(body: string, calls: ToolCallOut[], raw: string): string {
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
