import { holdPartial, type ReasoningStream } from './parser-kit';

const OPEN = '<think>';
const CLOSE = '</think>';
/** Qwen3's `<think>` and newline ids: a prompt ending with them opened the think block. */
const THINK = 151667;
const NEWLINE = 198;

/**
 * vLLM's `qwen3` reasoning parser: the text inside `<think>…</think>` is reasoning, the rest is
 * content; newlines are kept as sampled. An output that starts with `<think>` (the hybrid Qwen3
 * models) or follows a prompt that opened the think block (Qwen3-Thinking-2507's template ends
 * with `<think>\n`) is reasoning until `</think>`; without `</think>` it stays reasoning (the
 * answer was cut). An output that does not start with `<think>` after a prompt that did not open
 * one (thinking off, Instruct models) is all content.
 */
export class Qwen3ReasoningParser implements ReasoningStream {
  private state: 'start' | 'reasoning' | 'content';
  private held = '';
  reasoned = false;

  constructor(prompt: ArrayLike<number>) {
    const n = prompt.length;
    const opens = n >= 2 && prompt[n - 2] === THINK && prompt[n - 1] === NEWLINE;
    this.state = opens ? 'reasoning' : 'start';
    this.reasoned = opens;
  }

  push(text: string): { reasoning: string; content: string } {
    let buf = this.held + text;
    this.held = '';
    let reasoning = '';
    let content = '';
    for (;;) {
      if (this.state === 'start') {
        if (buf.startsWith(OPEN)) {
          this.state = 'reasoning';
          this.reasoned = true;
          buf = buf.slice(OPEN.length);
          continue;
        }
        if (OPEN.startsWith(buf)) {
          this.held = buf;
          break;
        }
        this.state = 'content';
        continue;
      }
      if (this.state === 'reasoning') {
        const at = buf.indexOf(CLOSE);
        if (at >= 0) {
          reasoning += buf.slice(0, at);
          buf = buf.slice(at + CLOSE.length);
          this.state = 'content';
          continue;
        }
        const [safe, held] = holdPartial(buf, CLOSE);
        reasoning += safe;
        this.held = held;
        break;
      }
      content += buf;
      break;
    }
    return { reasoning, content };
  }

  end(): { reasoning: string; content: string } {
    const rest = this.held;
    this.held = '';
    return this.state === 'reasoning' ? { reasoning: rest, content: '' } : { reasoning: '', content: rest };
  }
}
