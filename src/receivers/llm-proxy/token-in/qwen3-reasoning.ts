import { ThinkBlockParser } from './think-block';

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
export class Qwen3ReasoningParser extends ThinkBlockParser {
  constructor(prompt: ArrayLike<number>) {
    const n = prompt.length;
    const opens = n >= 2 && prompt[n - 2] === THINK && prompt[n - 1] === NEWLINE;
    super(opens ? 'reasoning' : 'start');
  }
}
