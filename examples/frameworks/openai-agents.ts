/**
 * The OpenAI Agents SDK (`@openai/agents`), unchanged but for where its model provider points.
 * `useResponses: false` picks the chat-completions model, which carries token ids from vLLM and
 * SGLang; the Responses model works too (its calls have ids only when the sidecar translates them,
 * docs/translation.md). The SDK's own tracing goes to OpenAI's trace API, not OTLP, so it is off;
 * tool spans are OTel `execute_tool` spans written in the tools (the tool call id is
 * `details.toolCall.callId`).
 *
 *   node build/examples/frameworks/openai-agents.js
 */
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { Agent, OpenAIProvider, Runner, setTracingDisabled, tool } from '@openai/agents';
import { z } from 'zod';
import { MODEL, newRolloutId, OTLP, reportReward, SIDECAR } from './settings';
import { calculator, executeTool } from './tool-span';

async function main(): Promise<void> {
  setTracingDisabled(true);
  const rolloutId = newRolloutId('openai-agents');
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'agents-sdk-agent', 'lightning.rollout_id': rolloutId }),
    spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: `${OTLP}/v1/traces` }))],
  });
  const tracer = provider.getTracer('agent');

  const calc = tool({
    name: 'calculator',
    description: 'evaluates a + b, a - b, a * b or a / b',
    parameters: z.object({ expression: z.string() }),
    execute: async ({ expression }, _ctx, details) => executeTool(tracer, 'calculator', details?.toolCall?.callId, () => calculator(expression)),
  });
  const agent = new Agent({ name: 'calculator-agent', instructions: 'Use the calculator.', model: MODEL, tools: [calc] });
  const runner = new Runner({
    modelProvider: new OpenAIProvider({ baseURL: `${SIDECAR}/rollout/${rolloutId}/v1`, apiKey: process.env.OPENAI_API_KEY ?? 'sk-local', useResponses: false }),
  });
  const result = await runner.run(agent, 'What is 2+2?');
  const answer = String(result.finalOutput ?? '');
  console.log(`answer: ${answer}`);
  await provider.forceFlush();
  await reportReward(rolloutId, /4/.test(answer) ? 1 : 0);
  await provider.shutdown();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
