import { createRequire } from 'node:module';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, run, setTracingDisabled, tool, type Model } from '@openai/agents';
import { z } from 'zod';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest, type Turn } from '../support/fake-model-server';
import { logprobOf } from '../support/fake-tokenizer';
import { inToolSpan } from '../support/tool-span';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * The OpenAI Agents SDK (`@openai/agents`), unchanged, with its chat-completions and Responses
 * models, streamed and not. Its own tracing goes to OpenAI's trace API (not OTLP) and is disabled
 * here; tool spans come from OTel `execute_tool` spans written in the tools, as an OTel-instrumented
 * agent emits them (the SDK has no OTLP exporter of its own to point at the sidecar).
 */

// The SDK's own openai dependency (v7), as an application using the SDK gets it.
const OpenAI = createRequire(require.resolve('@openai/agents-openai'))('openai').OpenAI as new (o: {
  baseURL: string;
  apiKey: string;
  maxRetries: number;
}) => unknown;

/** Calculator first, then web_search (which fails), then the answer; chat messages or Responses input. */
function script(r: ReceivedRequest): Turn {
  const body = r.json ?? {};
  const items = (Array.isArray(body.messages) ? body.messages : Array.isArray(body.input) ? body.input : []) as { role?: string; type?: string }[];
  const results = items.filter((m) => m.role === 'tool' || m.type === 'function_call_output').length;
  if (results === 0) return { toolCalls: [{ name: 'calculator', arguments: { expression: '6*7' } }] };
  if (results === 1) return { toolCalls: [{ name: 'web_search', arguments: { query: 'meaning of 42' } }] };
  return { content: 'It is 42; the search failed.' };
}

describe('OpenAI Agents SDK (@openai/agents) through the sidecar', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    process.env.OPENAI_AGENTS_DISABLE_TRACING = '1';
    setTracingDisabled(true);
    upstream = await startFakeModelServer({ flavor: 'vllm', script });
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', translate: [] } },
      processors: { episodes: { tool_span_wait_ms: 300 } },
    });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  const cases: [string, 'chat' | 'responses', boolean][] = [
    ['chat-completions model', 'chat', false],
    ['chat-completions model, streamed', 'chat', true],
    ['Responses model', 'responses', false],
    ['Responses model, streamed', 'responses', true],
  ];

  it.each(cases)('%s: a two-tool agent; transitions with exact token ids, AIR on the tool calls, credited reward', async (_label, api, stream) => {
    const rolloutId = `agents-${api}-${stream ? 's' : 'j'}`;
    const provider = new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': 'agents-sdk-agent', 'lightning.rollout_id': rolloutId }),
      spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces` }))],
    });
    const tracer = provider.getTracer('agent');
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rolloutId}/v1`, apiKey: 'sk-agents-sdk-key', maxRetries: 0 });
    const model = (api === 'chat' ? new OpenAIChatCompletionsModel(client as never, 'policy') : new OpenAIResponsesModel(client as never, 'policy')) as Model;
    const calculator = tool({
      name: 'calculator',
      description: 'evaluates arithmetic',
      parameters: z.object({ expression: z.string() }),
      execute: async (_input, _ctx, details) => inToolSpan(tracer, 'calculator', details?.toolCall?.callId, () => '42'),
    });
    const webSearch = tool({
      name: 'web_search',
      description: 'searches the web',
      parameters: z.object({ query: z.string() }),
      execute: async (_input, _ctx, details) =>
        inToolSpan(tracer, 'web_search', details?.toolCall?.callId, () => {
          throw new Error('search backend returned 503');
        }),
    });
    const agent = new Agent({ name: 'calc-agent', instructions: 'Use tools.', model, tools: [calculator, webSearch] });
    const first = upstream.requests.length;
    let output: unknown;
    if (stream) {
      const result = await run(agent, 'What is 6*7, and what does it mean?', { stream: true });
      for await (const _event of result) {
        // consume the stream as an application would
      }
      await result.completed;
      output = result.finalOutput;
    } else {
      output = (await run(agent, 'What is 6*7, and what does it mean?')).finalOutput;
    }
    expect(output).toBe('It is 42; the search failed.');
    await provider.forceFlush();
    expect((await postReward(sidecar.origin, rolloutId, 1)).status).toBe(202);
    const before = sidecar.episodes().filter((e) => e.rollout_id === rolloutId).length;
    for (let i = 0; i < 250 && sidecar.episodes().filter((e) => e.rollout_id === rolloutId).length === before; i++) await new Promise((r) => setTimeout(r, 20));

    const sent = upstream.requests.slice(first);
    expect(sent).toHaveLength(3);
    expect(sent.every((r) => r.path === (api === 'chat' ? '/v1/chat/completions' : '/v1/responses'))).toBe(true);
    const ts = sidecar.transitions().filter((t) => t.rollout_id === rolloutId);
    expect(ts.map((t) => [t.seq, t.api, t.streamed])).toEqual([0, 1, 2].map((s) => [s, api === 'chat' ? 'chat.completions' : 'responses', stream]));
    for (const t of ts) {
      if (api === 'chat') {
        expect(t.response_token_ids!.length).toBeGreaterThan(0);
        expect(t.response_logprobs).toEqual(t.response_token_ids!.map((id, p) => logprobOf(id, p)));
        expect(t.prompt_token_ids!.length).toBeGreaterThan(0);
      } else {
        // The Responses API has no token-id fields (vLLM returns them on chat/completions only):
        // recorded as null and counted, never invented.
        expect([t.prompt_token_ids, t.response_token_ids]).toEqual([null, null]);
      }
      expect([t.final_reward, t.credit]).toEqual([1, 1]);
    }
    expect(ts[0].tool_calls).toEqual([expect.objectContaining({ name: 'calculator', status: 'ok', reward: 0.1, join: 'tool_call_id' })]);
    expect(ts[1].tool_calls).toEqual([expect.objectContaining({ name: 'web_search', status: 'error', reward: -0.5, join: 'tool_call_id' })]);
    expect(ts.map((t) => t.reward.toFixed(2))).toEqual(['1.10', '0.50', '1.00']);
    expect(ts[2].is_last).toBe(true);
    await provider.shutdown();
  });
});
