/**
 * The plain `openai` SDK, with OpenTelemetry for tool spans. The agent's only change is its base
 * URL; the undici instrumentation puts `traceparent` on every model call, which is how the sidecar
 * ties the tool spans to the rollout and the calls.
 *
 *   node build/examples/frameworks/openai-sdk.js
 */
import { trace } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici';
import { NodeSDK } from '@opentelemetry/sdk-node';
import { SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import OpenAI from 'openai';
import { MODEL, newRolloutId, OTLP, reportReward, SIDECAR } from './settings';
import { calculator, executeTool } from './tool-span';

async function main(): Promise<void> {
  const processor = new SimpleSpanProcessor(new OTLPTraceExporter({ url: `${OTLP}/v1/traces` }));
  const sdk = new NodeSDK({ serviceName: 'openai-sdk-agent', spanProcessors: [processor], instrumentations: [new UndiciInstrumentation()] });
  sdk.start();
  const tracer = trace.getTracer('agent');

  const rolloutId = newRolloutId('openai-sdk');
  // The rollout in the path; x-group-id names the GRPO group, x-agent-name the agent.
  const client = new OpenAI({
    baseURL: `${SIDECAR}/rollout/${rolloutId}/v1`,
    apiKey: process.env.OPENAI_API_KEY ?? 'sk-local',
    defaultHeaders: { 'x-group-id': 'example-task', 'x-agent-name': 'calculator-agent' },
  });
  const tools: OpenAI.Chat.ChatCompletionTool[] = [
    {
      type: 'function',
      function: {
        name: 'calculator',
        description: 'evaluates a + b, a - b, a * b or a / b',
        parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
      },
    },
  ];
  const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 2+2? Use the calculator.' }];
  let answer = '';
  await tracer.startActiveSpan('invoke_agent calculator-agent', async (root) => {
    for (let step = 0; step < 6; step++) {
      const message = (await client.chat.completions.create({ model: MODEL, messages, tools })).choices[0].message;
      messages.push(message);
      if (!message.tool_calls?.length) {
        answer = message.content ?? '';
        break;
      }
      for (const call of message.tool_calls) {
        if (call.type !== 'function') continue;
        const { expression } = JSON.parse(call.function.arguments) as { expression: string };
        messages.push({ role: 'tool', tool_call_id: call.id, content: await executeTool(tracer, call.function.name, call.id, () => calculator(expression)) });
      }
    }
    root.end();
  });
  console.log(`answer: ${answer}`);
  await processor.forceFlush();
  await reportReward(rolloutId, /4/.test(answer) ? 1 : 0);
  await sdk.shutdown();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
