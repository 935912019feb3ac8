import { ThinkBlockParser } from './think-block';

/**
 * Ids of DeepSeek-V3's vocabulary (R1, V3.1 and V3 share it) that a prompt can end with: `</think>`
 * (thinking turned off by the template), `<｜Assistant｜>` and the ends of tool outputs (the
 * template opened no think block).
 */
const THINK_END = 128799;
const NO_BLOCK_OPENED = new Set([
  128804, // <｜Assistant｜>
  128811, // <｜tool▁outputs▁end｜>
  128813, // <｜tool▁output▁end｜>
]);

/**
 * vLLM's `deepseek_r1` reasoning parser: the text before `</think>` is reasoning, the rest is
 * content; newlines are kept as sampled. The output starts inside reasoning (DeepSeek-R1's
 * template ends the prompt with `<think>\n`, V3.1's thinking mode with `<think>`); a `<think>` it
 * starts with anyway is dropped; without `</think>` it stays reasoning (the answer was cut). That
 * is vLLM's rule, and it holds for any prompt that does not end as below (the R1 distills' and
 * other templates, whose ids are not DeepSeek-V3's).
 *
 * The prompt's last id (DeepSeek-V3's vocabulary) decides otherwise in two cases, where vLLM's
 * `deepseek_r1` would call the whole answer reasoning. A prompt ending with `</think>` (V3.1 with
 * thinking off) closed the block: the output is all content (as vLLM's `deepseek_v3` reasoning
 * parser gives it with thinking off). A prompt ending with `<｜Assistant｜>` (R1-0528's and V3's
 * templates, which let the model open the block itself) or with the end of tool outputs (after a
 * tool result no template opens one) opened none: the output is reasoning only when it starts with
 * `<think>`, and otherwise all content.
 */
export class DeepSeekR1ReasoningParser extends ThinkBlockParser {
  constructor(prompt: ArrayLike<number>) {
    const last = prompt.length > 0 ? prompt[prompt.length - 1] : -1;
    super(last === THINK_END ? 'content' : NO_BLOCK_OPENED.has(last) ? 'start' : 'open');
  }
}
