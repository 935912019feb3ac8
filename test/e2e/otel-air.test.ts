import { SpanStatusCode, type Tracer } from '@opentelemetry/api';
import OpenAI from 'openai';
import { startAgentTracing } from '../support/otel-globals';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest, type Turn } from '../support/fake-model-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/** Asks for the calculator, then for web_search, then answers. */
function twoToolScript(r: ReceivedRequest): Turn {
  const messages = (r.json?.messages ?? []) as { role: string }[];
  const results = messages.filter((m) => m.role === 'tool').length;
  if (results === 0) return { toolCalls: [{ name: 'calculator', arguments: { expression: '6*7' } }] };
  if (results === 1) return { toolCalls: [{ name: 'web_search', arguments: { query: 'meaning of 42' } }] };
  return { content: 'It is 42, and the search failed.' };
}

const tools: OpenAI.Chat.ChatCompletionTool[] = ['calculator', 'web_search'].map((name) => ({
  type: 'function',
  function: { name, parameters: { type: 'object', properties: {} } },
}));

/** A tool run inside an OTel GenAI `execute_tool` span, as instrumented agents emit it. */
async function executeTool(tracer: Tracer, call: OpenAI.Chat.ChatCompletionMessageToolCall): Promise<string> {
  if (call.type !== 'function') throw new Error('unexpected tool type');
  return tracer.startActiveSpan(
    `execute_tool ${call.function.name}`,
    { attributes: { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': call.function.name, 'gen_ai.tool.call.id': call.id } },
    async (span) => {
      try {
        if (call.function.name === 'web_search') throw new Error('search backend returned 503');
        span.setAttribute('gen_ai.tool.call.result', '42');
        return '42';
      } catch (err) {
        span.recordException(err as Error);
        span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
        span.setAttribute('error.type', 'ToolError');
        return `error: ${(err as Error).message}`;
      } finally {
        span.end();
      }
    },
  );
}

describe('AIR end to end: an OTel-instrumented openai SDK agent', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  let tracing: ReturnType<typeof startAgentTracing>;

  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm', script: twoToolScript });
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      processors: { episodes: { tool_span_wait_ms: 300 } },
    });
    tracing = startAgentTracing('calc-agent', `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces`);
  });

  afterAll(async () => {
    await tracing.stop();
    await sidecar.stop();
    await upstream.close();
  });

  it('puts the failing tool’s penalty and the other tool’s success reward on the calls that asked for them', async () => {
    const tracer = tracing.provider.getTracer('calc-agent');
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/otel-1/v1`, apiKey: 'sk-otel', maxRetries: 0 });
    const traceId = await tracer.startActiveSpan('invoke_agent calc-agent', async (root) => {
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 6*7, and what does it mean?' }];
      for (let step = 0; step < 4; step++) {
        const message = (await client.chat.completions.create({ model: 'policy', messages, tools })).choices[0].message;
        messages.push(message);
        if (!message.tool_calls?.length) break;
        for (const call of message.tool_calls) messages.push({ role: 'tool', tool_call_id: call.id, content: await executeTool(tracer, call) });
      }
      root.end();
      return root.spanContext().traceId;
    });
    await tracing.provider.forceFlush();
    expect((await postReward(sidecar.origin, 'otel-1', 1)).status).toBe(202);
    await sidecar.waitForEpisodes(1);

    const ts = sidecar.transitions();
    expect(ts).toHaveLength(3);
    // undici instrumentation propagated traceparent through the proxy: the calls carry the agent's trace.
    expect(ts.map((t) => t.trace_id)).toEqual([traceId, traceId, traceId]);
    expect(upstream.requests[0].headers.traceparent).toMatch(new RegExp(`^00-${traceId}-`));
    const [askCalc, askSearch, answer] = ts;
    expect(askCalc.tool_calls).toEqual([
      expect.objectContaining({ name: 'calculator', status: 'ok', reward: 0.1, join: 'tool_call_id', span_id: expect.stringMatching(/^[0-9a-f]{16}$/) }),
    ]);
    expect(askSearch.tool_calls).toEqual([expect.objectContaining({ name: 'web_search', status: 'error', reward: -0.5, join: 'tool_call_id' })]);
    expect([askCalc.intermediate_reward, askSearch.intermediate_reward, answer.intermediate_reward]).toEqual([0.1, -0.5, null]);
    expect([askCalc.final_reward, askSearch.final_reward, answer.final_reward]).toEqual([1, 1, 1]);
    expect([askCalc.credit, askSearch.credit, answer.credit]).toEqual([1, 1, 1]);
    expect(askCalc.reward).toBeCloseTo(1.1);
    expect(askSearch.reward).toBeCloseTo(0.5);
    expect(answer.reward).toBe(1);
    const metrics = await sidecar.app.metrics.registry.metrics();
    expect(metrics).toMatch(/lightning_sidecar_tool_spans_total\{outcome="error"\} 1/);
    expect(metrics).toMatch(/lightning_sidecar_otlp_spans_total\{transport="http",outcome="accepted",reason="[^"]*"\} [1-9]/);
  });

  it('takes rewards from agent-lightning annotation spans (provisional, last wins) and lightning.reward spans (final)', async () => {
    const tracer = tracing.provider.getTracer('rewarder');
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/agl-span/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'policy', messages: [{ role: 'user', content: 'hi' }] });
    for (const value of [0.2, 0.9]) {
      tracer
        .startSpan('agentlightning.annotation', {
          attributes: { 'agentlightning.rollout_id': 'agl-span', 'agentlightning.reward.0.name': 'primary', 'agentlightning.reward.0.value': value },
        })
        .end();
    }
    await tracing.provider.forceFlush();
    expect((await fetch(`${sidecar.origin}/lightning/v1/rollouts/agl-span/end`, { method: 'POST', body: '{}' })).status).toBe(202);
    const eps = await sidecar.waitForEpisodes(2);
    expect(eps.find((e) => e.rollout_id === 'agl-span')).toMatchObject({ final_reward: 0.9, episode_status: 'completed' });

    // Named by header (a path prefix would win over it): a rollout of its own.
    const byHeader = new OpenAI({ baseURL: `${sidecar.origin}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-rollout-id': 'lr-span' } });
    await byHeader.chat.completions.create({ model: 'policy', messages: [{ role: 'user', content: 'again' }] });
    tracer.startSpan('score', { attributes: { 'lightning.rollout_id': 'lr-span', 'lightning.reward': 0.4, 'lightning.reward.final': true } }).end();
    await tracing.provider.forceFlush();
    const all = await sidecar.waitForEpisodes(3);
    expect(all.find((e) => e.rollout_id === 'lr-span')).toMatchObject({ final_reward: 0.4, episode_status: 'completed', transitions: 1 });
  });
});
