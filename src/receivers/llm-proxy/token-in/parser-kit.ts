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
