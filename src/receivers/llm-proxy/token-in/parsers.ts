import type { REASONING_PARSERS as REASONING_NAMES, TOOL_CALL_PARSERS as TOOL_NAMES } from '../../../config/schema';
import { HermesToolParser } from './hermes-tools';
import type { ReasoningStream, ToolStream } from './parser-kit';
import { Qwen3ReasoningParser } from './qwen3-reasoning';

/** The output parsers token-in knows, by vLLM's names (see parser-kit.ts); the config lists the same names. */
/** A reasoning parser for an answer to `prompt` (whose end may have opened the think block). */
export const REASONING_PARSERS: Record<(typeof REASONING_NAMES)[number], (prompt: ArrayLike<number>) => ReasoningStream> = {
  qwen3: (prompt) => new Qwen3ReasoningParser(prompt),
};

export const TOOL_CALL_PARSERS: Record<(typeof TOOL_NAMES)[number], () => ToolStream> = {
  hermes: () => new HermesToolParser(),
};
