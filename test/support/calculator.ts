import { tool } from '@openai/agents';
import { z } from 'zod';
import type { ReceivedRequest, Turn } from './fake-model-server';

/**
 * The calculator agent the suite's model servers play: ask the calculator for `2+2` when the last
 * message is the user's, answer once the tool result is in (chat `tool` message, Responses
 * `function_call_output`, Anthropic `tool_result`), and greet when no tools are offered.
 */
export function calculatorScript(r: ReceivedRequest, greeting = 'Hello from the fake model.'): Turn {
  const body = r.json ?? {};
  const messages = (Array.isArray(body.messages) ? body.messages : Array.isArray(body.input) ? body.input : []) as { role?: string; type?: string }[];
  const last = messages[messages.length - 1];
  const afterTool = last?.role === 'tool' || last?.type === 'function_call_output' || hasToolResult(last);
  if (afterTool) return { content: 'The answer is 4.' };
  if (!body.tools) return { content: greeting };
  return { toolCalls: [{ name: 'calculator', arguments: { expression: '2+2' } }] };
}

/** The greeting of the vLLM-like tests' calculator agent. */
export const VLLM_GREETING = 'Hello from vLLM.';

/** The calculator agent greeting as the vLLM-like tests expect. */
export const vllmCalculatorScript = (r: ReceivedRequest): Turn => calculatorScript(r, VLLM_GREETING);

function hasToolResult(m: unknown): boolean {
  const content = (m as { content?: unknown } | undefined)?.content;
  return Array.isArray(content) && content.some((b) => (b as { type?: string }).type === 'tool_result');
}

const DESCRIPTION = 'Evaluates an arithmetic expression.';

/** The calculator as a Responses API function tool (strict). */
export const calculatorResponsesTool = {
  type: 'function' as const,
  name: 'calculator',
  description: DESCRIPTION,
  parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'], additionalProperties: false },
  strict: true,
};

/** The calculator as an Anthropic Messages tool. */
export const calculatorAnthropicTool = {
  name: 'calculator',
  description: DESCRIPTION,
  input_schema: { type: 'object' as const, properties: { expression: { type: 'string' } }, required: ['expression'] },
};

/** Evaluates `a+b`-style integer arithmetic (+, -, *, /), left to right; anything else is `?`. */
export function evaluate(expression: string): string {
  const tokens = expression.replace(/\s+/g, '').match(/\d+|[+\-*/]/g);
  if (!tokens || tokens.join('') !== expression.replace(/\s+/g, '') || !/^\d+$/.test(tokens[0])) return '?';
  let value = Number(tokens[0]);
  for (let i = 1; i < tokens.length; i += 2) {
    const [op, operand] = [tokens[i], tokens[i + 1]];
    if (operand === undefined || !/^\d+$/.test(operand)) return '?';
    const n = Number(operand);
    value = op === '+' ? value + n : op === '-' ? value - n : op === '*' ? value * n : value / n;
  }
  return String(value);
}

/** The calculator as an @openai/agents function tool. */
export const calculatorAgentTool = () =>
  tool({
    name: 'calculator',
    description: DESCRIPTION,
    parameters: z.object({ expression: z.string() }),
    execute: async ({ expression }) => evaluate(expression),
  });
