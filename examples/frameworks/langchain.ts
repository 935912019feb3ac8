/**
 * LangChain.js (`langchain` v1 `createAgent`, `@langchain/openai`), unchanged but for the base
 * URL, with tool spans from Traceloop's OpenLLMetry SDK. The run is one Traceloop workflow, and the
 * undici instrumentation puts its `traceparent` on the model calls, which ties Traceloop's tool
 * spans to the rollout. Traceloop
 * names LangChain tool spans by class (`DynamicStructuredTool`): the sidecar finds the tool's name
 * and call id in the tool message it recorded.
 *
 *   node build/examples/frameworks/langchain.js
 */
import { ChatOpenAI } from '@langchain/openai';
import { registerInstrumentations } from '@opentelemetry/instrumentation';
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici';
import * as traceloop from '@traceloop/node-server-sdk';
import { createAgent, tool } from 'langchain';
import { z } from 'zod';
import { MODEL, newRolloutId, OTLP, reportReward, SIDECAR } from './settings';
import { calculator } from './tool-span';

async function main(): Promise<void> {
  process.env.TRACELOOP_TELEMETRY ??= 'false';
  traceloop.initialize({
    appName: 'langchain-agent',
    baseUrl: OTLP,
    apiKey: 'unused-locally',
    disableBatch: true,
    traceloopSyncEnabled: false,
    silenceInitializationMessage: true,
    instrumentModules: { langchain: true },
  });
  registerInstrumentations({ instrumentations: [new UndiciInstrumentation()] });

  const rolloutId = newRolloutId('langchain');
  const model = new ChatOpenAI({
    model: MODEL,
    apiKey: process.env.OPENAI_API_KEY ?? 'sk-local',
    configuration: { baseURL: `${SIDECAR}/rollout/${rolloutId}/v1` },
  });
  const calc = tool(async ({ expression }) => calculator(expression), {
    name: 'calculator',
    description: 'evaluates a + b, a - b, a * b or a / b',
    schema: z.object({ expression: z.string() }),
  });
  const agent = createAgent({ model, tools: [calc] });
  // One workflow span around the run: the model calls and the tool spans share its trace.
  const result = await traceloop.withWorkflow({ name: 'calculator_agent' }, () =>
    agent.invoke({ messages: [{ role: 'user', content: 'What is 2+2? Use the calculator.' }] }),
  );
  const last = result.messages[result.messages.length - 1];
  const answer = typeof last.content === 'string' ? last.content : JSON.stringify(last.content);
  console.log(`answer: ${answer}`);
  await traceloop.forceFlush();
  await reportReward(rolloutId, /4/.test(answer) ? 1 : 0);
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
