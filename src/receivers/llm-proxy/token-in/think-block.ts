import { holdPartial, type ReasoningStream } from './parser-kit';

const OPEN = '<think>';
const CLOSE = '</think>';

/**
 * Where an answer starts, as the prompt left it: `open` (inside a think block the prompt opened; a
 * `<think>` the output starts with anyway is dropped), `start` (reasoning only if the output starts
 * with `<think>`, else all content), `reasoning` (inside a block, taken as it comes), `content`
 * (the prompt closed the block: all content).
 */
export type ThinkStart = 'open' | 'start' | 'reasoning' | 'content';

/**
 * The text inside `<think>…</think>` is reasoning, the rest content, newlines kept as sampled;
 * without `</think>` the reasoning runs to the end (the answer was cut). The reasoning parsers of
 * models that think in such a block (qwen3-reasoning.ts, deepseek-r1-reasoning.ts) differ only in
 * where an answer starts, which they read from the prompt's last ids.
 */
export class ThinkBlockParser implements ReasoningStream {
  private state: ThinkStart;
  private held = '';
  reasoned: boolean;

  constructor(start: ThinkStart) {
    this.state = start;
    this.reasoned = start === 'open' || start === 'reasoning';
  }

  push(text: string): { reasoning: string; content: string } {
    let buf = this.held + text;
    this.held = '';
    let reasoning = '';
    let content = '';
    for (;;) {
      if (this.state === 'open' || this.state === 'start') {
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
        this.state = this.state === 'open' ? 'reasoning' : 'content';
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
    return this.state === 'open' || this.state === 'reasoning' ? { reasoning: rest, content: '' } : { reasoning: '', content: rest };
  }
}
