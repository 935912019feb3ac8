/**
 * The Anthropic SDK (streamed tool use). Its base URL is the sidecar with the rollout in the path
 * (the SDK appends `/v1/messages`). Tool spans here carry the rollout on the OTel resource
 * (`lightning.rollout_id`) instead of relying on `traceparent`: the other way to attribute them.
 *
 * The Messages format has no token-id fields: such calls are recorded with null ids unless the
 * sidecar translates them for a vLLM or SGLang upstream (docs/translation.md).
 *
 *   node build/examples/frameworks/anthropic-sdk.js
 */
import Anthropic from '@anthropic-ai/sdk';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { MODEL, newRolloutId, OTLP, reportReward, SIDECAR } from './settings';
import { calculator, executeTool } from './tool-span';

async function main(): Promise<void> {
  const rolloutId = newRolloutId('anthropic-sdk');
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'anthropic-agent', 'lightning.rollout_id': rolloutId }),
    spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: `${OTLP}/v1/traces` }))],
  });
  const tracer = provider.getTracer('agent');
  const client = new Anthropic({ baseURL: `${SIDECAR}/rollout/${rolloutId}`, apiKey: process.env.ANTHROPIC_API_KEY ?? 'sk-ant-local' });
  const tools: Anthropic.Tool[] = [
    {
      name: 'calculator',
      description: 'evaluates a + b, a - b, a * b or a / b',
      input_schema: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
    },
  ];
  const messages: Anthropic.MessageParam[] = [{ role: 'user', content: 'What is 2+2? Use the calculator.' }];
  let answer = '';
  for (let step = 0; step < 6; step++) {
    const msg = await client.messages.stream({ model: MODEL, max_tokens: 512, messages, tools }).finalMessage();
    messages.push({ role: 'assistant', content: msg.content });
    const uses = msg.content.filter((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use');
    if (uses.length === 0) {
      answer = msg.content.map((b) => (b.type === 'text' ? b.text : '')).join('');
      break;
    }
    const results: Anthropic.ToolResultBlockParam[] = [];
    for (const u of uses) {
      const { expression } = u.input as { expression: string };
      results.push({ type: 'tool_result', tool_use_id: u.id, content: await executeTool(tracer, u.name, u.id, () => calculator(expression)) });
    }
    messages.push({ role: 'user', content: results });
  }
  console.log(`answer: ${answer}`);
  await provider.forceFlush();
  await reportReward(rolloutId, /4/.test(answer) ? 1 : 0);
  await provider.shutdown();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
