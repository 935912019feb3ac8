import type { REASONING_PARSERS as REASONING_NAMES, TOOL_CALL_PARSERS as TOOL_NAMES } from '../../../config/schema';
import { DeepSeekR1ReasoningParser } from './deepseek-r1-reasoning';
import { DeepSeekV3ToolParser } from './deepseek-v3-tools';
import { GptOssReasoningParser, GptOssToolParser } from './gpt-oss-harmony';
import { HermesToolParser } from './hermes-tools';
import type { ReasoningStream, ToolStream } from './parser-kit';
import { Qwen3CoderToolParser } from './qwen3-coder-tools';
import { Qwen3ReasoningParser } from './qwen3-reasoning';

/** The output parsers token-in knows, by vLLM's names (see parser-kit.ts); the config lists the same names. */
/** A reasoning parser for an answer to `prompt` (whose end may have opened the think block). */
export const REASONING_PARSERS: Record<(typeof REASONING_NAMES)[number], (prompt: ArrayLike<number>) => ReasoningStream> = {
  qwen3: (prompt) => new Qwen3ReasoningParser(prompt),
  deepseek_r1: (prompt) => new DeepSeekR1ReasoningParser(prompt),
  openai_gptoss: () => new GptOssReasoningParser(),
};

/** A tool-call parser for a request with `tools` (the request's own; some parsers type arguments by their schemas). */
export const TOOL_CALL_PARSERS: Record<(typeof TOOL_NAMES)[number], (tools: readonly unknown[] | undefined) => ToolStream> = {
  hermes: () => new HermesToolParser(),
  qwen3_coder: (tools) => new Qwen3CoderToolParser(tools),
  deepseek_v3: () => new DeepSeekV3ToolParser(),
  deepseek_v31: () => new DeepSeekV3ToolParser('v3.1'),
  openai: () => new GptOssToolParser(),
};

/** Reasoning parsers that read the model's special tokens: the completions text must keep them (`skip_special_tokens: false`). */
export const READS_SPECIAL_TOKENS: ReadonlySet<string> = new Set(['openai_gptoss']);
