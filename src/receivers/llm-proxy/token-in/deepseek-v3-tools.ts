import { DelimitedToolParser, type ToolCallOut } from './parser-kit';

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
export class DeepSeekV3ToolParser extends DelimitedToolParser {
  private readonly body: RegExp;

  constructor(format: 'v3' | 'v3.1' = 'v3') {
    super(CALLS_BEGIN, false, CALL_BEGIN, CALL_END);
    this.body = BODY[format];
  }

  /** Reads one call's text into `calls`; the raw text to show as content when it does not parse. */
  protected call(body: string, calls: ToolCallOut[], raw: string): string {
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
