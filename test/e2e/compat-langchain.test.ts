import { registerInstrumentations } from '@opentelemetry/instrumentation';
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici';
import { ChatOpenAI } from '@langchain/openai';
import * as traceloop from '@traceloop/node-server-sdk';
import { createAgent, tool } from 'langchain';
import { z } from 'zod';
import { resetOtelGlobals } from '../support/otel-globals';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest, type Turn } from '../support/fake-model-server';
import { logprobOf, renderPrompt } from '../support/fake-tokenizer';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * LangChain.js (`langchain` v1 `createAgent`, `@langchain/openai`), unchanged but for the base
 * URL, with tool spans from Traceloop's OpenLLMetry SDK (`@traceloop/node-server-sdk`, LangChain
 * instrumentation) exported over OTLP/HTTP to the sidecar. Undici instrumentation makes the model
 * calls carry `traceparent`, which ties the tool spans to the rollout and the calls.
 */

function script(r: ReceivedRequest): Turn {
  const messages = (r.json?.messages ?? []) as { role: string }[];
  const results = messages.filter((m) => m.role === 'tool').length;
  if (results === 0) return { toolCalls: [{ name: 'calculator', arguments: { expression: '6*7' } }] };
  if (results === 1) return { toolCalls: [{ name: 'web_search', arguments: { query: 'meaning of 42' } }] };
  return { content: 'It is 42; the search failed.' };
}

describe('LangChain.js agent with Traceloop (OpenLLMetry) tool spans', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    resetOtelGlobals();
    process.env.TRACELOOP_TELEMETRY = 'false';
    upstream = await startFakeModelServer({ flavor: 'vllm', script });
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } }, processors: { episodes: { tool_span_wait_ms: 500 } } });
    traceloop.initialize({
      appName: 'langchain-agent',
      baseUrl: `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}`,
      apiKey: 'unused-locally',
      disableBatch: true,
      traceloopSyncEnabled: false,
      silenceInitializationMessage: true,
      instrumentModules: { langchain: true },
    });
    registerInstrumentations({ instrumentations: [new UndiciInstrumentation()] });
  });
  afterAll(async () => {
    await traceloop.forceFlush().catch(() => {});
    resetOtelGlobals();
    await sidecar.stop();
    await upstream.close();
  });

  it('records each call with exact token ids, joins the tool spans with AIR rewards, credits the reward', async () => {
    const rolloutId = 'langchain-1';
    const model = new ChatOpenAI({
      model: 'policy',
      apiKey: 'sk-langchain-key',
      maxRetries: 0,
      configuration: { baseURL: `${sidecar.origin}/rollout/${rolloutId}/v1` },
    });
    const calculator = tool(async () => '42', { name: 'calculator', description: 'evaluates arithmetic', schema: z.object({ expression: z.string() }) });
    const webSearch = tool(
      async () => {
        throw new Error('search backend returned 503');
      },
      { name: 'web_search', description: 'searches the web', schema: z.object({ query: z.string() }) },
    );
    const agent = createAgent({ model, tools: [calculator, webSearch] });
    const result = await traceloop.withWorkflow({ name: 'calc_agent' }, () =>
      agent.invoke({ messages: [{ role: 'user', content: 'What is 6*7, and what does it mean?' }] }),
    );
    const last = result.messages[result.messages.length - 1];
    expect(last.content).toBe('It is 42; the search failed.');
    await traceloop.forceFlush();
    expect((await postReward(sidecar.origin, rolloutId, 1)).status).toBe(202);
    await sidecar.waitForEpisodes(1);

    const ts = sidecar.transitions();
    expect(ts.map((t) => t.seq)).toEqual([0, 1, 2]);
    for (const [i, t] of ts.entries()) {
      expect(t.prompt_token_ids).toEqual(renderPrompt((upstream.requests[i].json as { messages: never[] }).messages));
      expect(t.response_logprobs).toEqual(t.response_token_ids!.map((id, p) => logprobOf(id, p)));
      expect(t.final_reward).toBe(1);
    }
    // The calls carried the workflow's trace (undici instrumentation).
    expect(new Set(ts.map((t) => t.trace_id)).size).toBe(1);
    expect(ts[0].trace_id).toMatch(/^[0-9a-f]{32}$/);
    // Traceloop names LangChain tool spans by class ("DynamicStructuredTool"): the successful one
    // carries the serialized ToolMessage (call id, name), the failed one only its arguments.
    expect(ts[0].tool_calls).toEqual([expect.objectContaining({ name: 'calculator', status: 'ok', reward: 0.1, join: 'tool_call_id' })]);
    expect(ts[1].tool_calls).toEqual([expect.objectContaining({ name: 'web_search', status: 'error', reward: -0.5, join: 'trace_and_arguments' })]);
    expect(ts.map((t) => t.reward.toFixed(2))).toEqual(['1.10', '0.50', '1.00']);
  });
});
