import Anthropic from '@anthropic-ai/sdk';
import { context, SpanStatusCode, trace, type Tracer } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { NodeSDK } from '@opentelemetry/sdk-node';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import OpenAI from 'openai';
import type { Transition } from '../../src/model/records';
import { resetOtelGlobals } from '../support/otel-globals';
import { inToolSpan } from '../support/tool-span';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest, type Turn } from '../support/fake-model-server';
import { logprobOf, renderPrompt } from '../support/fake-tokenizer';
import { postReward, startSidecar, useSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Framework compatibility with the SDKs people call models with directly: the plain openai SDK under
 * @opentelemetry/sdk-node auto-instrumentation, the Anthropic SDK (streamed tool use), an agent
 * written for agent-lightning, a multi-agent setup with selective capture, and GRPO groups.
 * The agents change nothing but their base URL (and, for tool spans, the OTel exporter endpoint).
 */

/** Counts tool results in an OpenAI or Anthropic request: asks calculator, then web_search, then answers. */
function twoTools(r: ReceivedRequest): Turn {
  const messages = (r.json?.messages ?? []) as { role: string; content?: unknown }[];
  const results = messages.filter(
    (m) => m.role === 'tool' || (Array.isArray(m.content) && m.content.some((b) => (b as { type?: string }).type === 'tool_result')),
  ).length;
  if (results === 0) return { toolCalls: [{ name: 'calculator', arguments: { expression: '6*7' } }] };
  if (results === 1) return { toolCalls: [{ name: 'web_search', arguments: { query: 'meaning of 42' } }] };
  return { content: 'It is 42; the search failed.' };
}

/** A tool run in an OTel GenAI `execute_tool` span; web_search fails. */
function runTool(tracer: Tracer, name: string, callId: string): string {
  return inToolSpan(tracer, name, callId, () => {
    if (name === 'web_search') throw new Error('search backend returned 503');
    return '42';
  });
}

/** What every multi-step tool-using case checks: order, exact token ids, AIR on the right calls, credit. */
function expectTwoToolEpisode(ts: Transition[], sent: ReceivedRequest[], rolloutId: string, finalReward: number): void {
  expect(ts.map((t) => t.transition_id)).toEqual([`${rolloutId}/0/0`, `${rolloutId}/0/1`, `${rolloutId}/0/2`]);
  for (const [i, t] of ts.entries()) {
    if (t.api === 'chat.completions') {
      expect(t.prompt_token_ids).toEqual(renderPrompt((sent[i].json as { messages: never[] }).messages));
      expect(t.response_token_ids!.length).toBeGreaterThan(0);
      expect(t.response_logprobs).toEqual(t.response_token_ids!.map((id, p) => logprobOf(id, p)));
    } else {
      // The Anthropic Messages format has no token-id fields (vLLM's /v1/messages returns none):
      // recorded as null and counted, never invented.
      expect([t.prompt_token_ids, t.response_token_ids]).toEqual([null, null]);
    }
    expect(t.final_reward).toBe(finalReward);
    expect(t.credit).toBe(finalReward);
  }
  const [askCalc, askSearch, answer] = ts;
  expect(askCalc.tool_calls).toEqual([expect.objectContaining({ name: 'calculator', status: 'ok', reward: 0.1, join: 'tool_call_id' })]);
  expect(askSearch.tool_calls).toEqual([expect.objectContaining({ name: 'web_search', status: 'error', reward: -0.5, join: 'tool_call_id' })]);
  expect([askCalc.intermediate_reward, askSearch.intermediate_reward, answer.intermediate_reward]).toEqual([0.1, -0.5, null]);
  expect(askCalc.reward).toBeCloseTo(finalReward + 0.1);
  expect(askSearch.reward).toBeCloseTo(finalReward - 0.5);
  expect(answer.is_last).toBe(true);
}

describe('with @opentelemetry/sdk-node auto-instrumentation (undici → traceparent) and hand-written execute_tool spans', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  let sdk: NodeSDK;
  let tracer: Tracer;
  let processor: SimpleSpanProcessor;

  beforeAll(async () => {
    resetOtelGlobals();
    upstream = await startFakeModelServer({ flavor: 'vllm', script: twoTools });
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', translate: [] } },
      processors: { episodes: { tool_span_wait_ms: 300 } },
    });
    processor = new SimpleSpanProcessor(new OTLPTraceExporter({ url: `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces` }));
    sdk = new NodeSDK({
      resource: resourceFromAttributes({ 'service.name': 'sdk-node-agent' }),
      spanProcessors: [processor],
      instrumentations: [new UndiciInstrumentation()],
    });
    sdk.start();
    tracer = trace.getTracer('agent');
  });
  afterAll(async () => {
    await sdk.shutdown();
    resetOtelGlobals();
    await sidecar.stop();
    await upstream.close();
  });

  it.each([false, true])('plain openai SDK agent, two tools (one fails), stream=%s', async (stream) => {
    const rolloutId = `plain-${stream}`;
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rolloutId}/v1`, apiKey: 'sk-plain', maxRetries: 0 });
    const tools: OpenAI.Chat.ChatCompletionTool[] = ['calculator', 'web_search'].map((name) => ({
      type: 'function',
      function: { name, parameters: { type: 'object', properties: {} } },
    }));
    const before = sidecar.episodes().length;
    const first = upstream.requests.length;
    const traceId = await tracer.startActiveSpan('invoke_agent plain', async (root) => {
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 6*7, and what does it mean?' }];
      for (let step = 0; step < 4; step++) {
        const message = stream
          ? (await client.chat.completions.stream({ model: 'policy', messages, tools }).finalChatCompletion()).choices[0].message
          : (await client.chat.completions.create({ model: 'policy', messages, tools })).choices[0].message;
        messages.push(message as OpenAI.Chat.ChatCompletionMessageParam);
        if (!message.tool_calls?.length) break;
        for (const call of message.tool_calls)
          if (call.type === 'function') messages.push({ role: 'tool', tool_call_id: call.id, content: await runTool(tracer, call.function.name, call.id) });
      }
      root.end();
      return root.spanContext().traceId;
    });
    await processor.forceFlush();
    expect((await postReward(sidecar.origin, rolloutId, 0.5)).status).toBe(202);
    await sidecar.waitForEpisodes(before + 1);
    const ts = sidecar.transitions().filter((t) => t.rollout_id === rolloutId);
    expect(ts.map((t) => [t.streamed, t.trace_id])).toEqual([
      [stream, traceId],
      [stream, traceId],
      [stream, traceId],
    ]);
    expectTwoToolEpisode(ts, upstream.requests.slice(first), rolloutId, 0.5);
  });

  it('Anthropic SDK, streamed tool use over several turns', async () => {
    const rolloutId = 'anthropic-stream';
    const client = new Anthropic({ baseURL: `${sidecar.origin}/rollout/${rolloutId}`, apiKey: 'sk-ant-compat', maxRetries: 0 });
    const tools = ['calculator', 'web_search'].map((name) => ({ name, description: name, input_schema: { type: 'object' as const, properties: {} } }));
    const before = sidecar.episodes().length;
    const first = upstream.requests.length;
    const toolUseIds: string[] = [];
    await tracer.startActiveSpan('invoke_agent claude', async (root) => {
      const messages: Anthropic.MessageParam[] = [{ role: 'user', content: 'What is 6*7, and what does it mean?' }];
      for (let step = 0; step < 4; step++) {
        const msg = await client.messages.stream({ model: 'claude-policy', max_tokens: 512, messages, tools }).finalMessage();
        messages.push({ role: 'assistant', content: msg.content });
        const uses = msg.content.filter((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use');
        if (uses.length === 0) break;
        const results: Anthropic.ToolResultBlockParam[] = [];
        for (const u of uses) {
          toolUseIds.push(u.id);
          results.push({ type: 'tool_result', tool_use_id: u.id, content: await runTool(tracer, u.name, u.id) });
        }
        messages.push({ role: 'user', content: results });
      }
      root.end();
    });
    await processor.forceFlush();
    expect((await postReward(sidecar.origin, rolloutId, 1)).status).toBe(202);
    await sidecar.waitForEpisodes(before + 1);
    const ts = sidecar.transitions().filter((t) => t.rollout_id === rolloutId);
    expect(ts.map((t) => [t.api, t.streamed])).toEqual([
      ['anthropic.messages', true],
      ['anthropic.messages', true],
      ['anthropic.messages', true],
    ]);
    expect(ts.slice(0, 2).map((t) => t.tool_calls[0].id)).toEqual(toolUseIds);
    expect(ts.map((t) => t.finish_reason)).toEqual(['tool_use', 'tool_use', 'end_turn']);
    expectTwoToolEpisode(ts, upstream.requests.slice(first), rolloutId, 1);
    expect(await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_calls_missing_token_ids_total')).toMatch(
      /api="anthropic.messages"\} 3/,
    );
  });
});

describe('an agent written for agent-lightning', () => {
  const f = useSidecar();

  it('uses /rollout/{rid}/attempt/{aid}/v1, emits agentlightning.annotation reward spans, and reports the final reward on the v1 events route', async () => {
    const [rid, aid] = ['agl-rollout-7', 'attempt-2'];
    // agent-lightning hands the agent an endpoint with the rollout and attempt in the path.
    const client = new OpenAI({ baseURL: `${f.sidecar.origin}/rollout/${rid}/attempt/${aid}/v1`, apiKey: 'agl-key', maxRetries: 0 });
    const tools: OpenAI.Chat.ChatCompletionTool[] = [{ type: 'function', function: { name: 'calculator', parameters: { type: 'object', properties: {} } } }];
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 2+2?' }];
    for (let step = 0; step < 3; step++) {
      const message = (await client.chat.completions.create({ model: 'policy', messages, tools })).choices[0].message;
      messages.push(message);
      if (!message.tool_calls?.length) break;
      for (const call of message.tool_calls) messages.push({ role: 'tool', tool_call_id: call.id, content: '4' });
    }
    // emit_reward(): a zero-duration `agentlightning.annotation` span; the legacy runner stamps the
    // rollout and attempt on the resource of the spans it exports.
    const provider = new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': 'agl-runner', 'agentlightning.rollout_id': rid, 'agentlightning.attempt_id': aid }),
      spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: `http://127.0.0.1:${f.sidecar.app.otlp!.httpPort()}/v1/traces` }))],
    });
    const span = provider
      .getTracer('agentlightning')
      .startSpan(
        'agentlightning.annotation',
        { attributes: { 'agentlightning.reward.0.name': 'primary', 'agentlightning.reward.0.value': 0.25 } },
        context.active(),
      );
    span.setStatus({ code: SpanStatusCode.OK });
    span.end();
    await provider.forceFlush();
    await new Promise((r) => setTimeout(r, 100));
    // v1: the rollout's reward as an event; it closes the episode.
    const ev = await fetch(`${f.sidecar.origin}/api/rollouts/${rid}/attempt/${aid}/events`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ event_type: 'reward', data: { value: 0.8 } }),
    });
    expect(ev.status).toBe(202);
    const [episode] = await f.sidecar.waitForEpisodes(1);
    await provider.shutdown();
    expect(episode).toMatchObject({ rollout_id: rid, attempt_id: aid, final_reward: 0.8, episode_status: 'completed', transitions: 2 });
    expect(episode.rewards).toEqual(
      expect.arrayContaining([expect.objectContaining({ value: 0.25, final: false }), expect.objectContaining({ value: 0.8, final: true })]),
    );
    const ts = f.sidecar.transitions();
    expect(ts.map((t) => t.transition_id)).toEqual([`${rid}/${aid}/0`, `${rid}/${aid}/1`]);
    expect(ts.map((t) => t.reward)).toEqual([0.8, 0.8]);
    expect(f.upstream.requests.map((r) => r.path)).toEqual(['/v1/chat/completions', '/v1/chat/completions']);
  });
});

describe('multi-agent selective capture (text-to-SQL: writer, checker, rewriter; only writer and rewriter are trained)', () => {
  const f = useSidecar({ processors: { capture: { include_agents: ['writer', 're*'] } } });

  it('records only the selected agents, serves all of them, and credits the episode reward to the selected calls', async () => {
    const agent = (name: string) =>
      new OpenAI({
        baseURL: `${f.sidecar.origin}/rollout/sql-1/v1`,
        apiKey: 'k',
        maxRetries: 0,
        defaultHeaders: { 'x-agent-name': name, 'x-group-id': 'spider-dev-17' },
      });
    const ask = async (name: string, content: string) =>
      (await agent(name).chat.completions.create({ model: 'policy', messages: [{ role: 'user', content }] })).choices[0].message.content;
    const answers = [
      await ask('writer', 'write SQL for: how many singers?'),
      await ask('checker', 'check: SELECT count(*) FROM singer'),
      await ask('rewriter', 'rewrite given the check'),
      await ask('checker', 'check again'),
    ];
    expect(answers.every((a) => typeof a === 'string' && a.length > 0)).toBe(true);
    expect(f.upstream.requests).toHaveLength(4);
    expect((await postReward(f.sidecar.origin, 'sql-1', 1)).status).toBe(202);
    const [episode] = await f.sidecar.waitForEpisodes(1);
    const ts = f.sidecar.transitions();
    expect(ts.map((t) => t.agent_name)).toEqual(['writer', 'rewriter']);
    expect(ts.map((t) => t.group_id)).toEqual(['spider-dev-17', 'spider-dev-17']);
    expect(ts.map((t) => t.reward)).toEqual([1, 1]);
    expect(ts[1].is_last).toBe(true);
    expect(episode).toMatchObject({ transitions: 2, transition_ids: ts.map((t) => t.transition_id), group_id: 'spider-dev-17' });
  });
});

describe('GRPO groups', () => {
  const f = useSidecar();

  it('N concurrent rollouts of one task share group_id; the episodes output shows when the group is complete', async () => {
    const N = 4;
    const rewards = [1, 0, 0.5, 0];
    const groupDone = (): string[] =>
      f.sidecar
        .episodes()
        .filter((e) => e.group_id === 'task-42')
        .map((e) => e.rollout_id);
    await Promise.all(
      rewards.map(async (reward, i) => {
        const client = new OpenAI({
          baseURL: `${f.sidecar.origin}/rollout/task-42-s${i}/v1`,
          apiKey: 'k',
          maxRetries: 0,
          defaultHeaders: { 'x-group-id': 'task-42' },
        });
        await client.chat.completions.create({ model: 'policy', messages: [{ role: 'user', content: 'solve task 42' }] });
        await client.chat.completions.stream({ model: 'policy', messages: [{ role: 'user', content: 'and check it' }] }).finalChatCompletion();
        expect((await postReward(f.sidecar.origin, `task-42-s${i}`, reward)).status).toBe(202);
      }),
    );
    const episodes = await f.sidecar.waitForEpisodes(N);
    expect(groupDone().sort()).toEqual(['task-42-s0', 'task-42-s1', 'task-42-s2', 'task-42-s3']);
    const ts = f.sidecar.transitions();
    expect(ts).toHaveLength(2 * N);
    expect(new Set(ts.map((t) => t.group_id))).toEqual(new Set(['task-42']));
    for (const [i, reward] of rewards.entries()) {
      const mine = ts.filter((t) => t.rollout_id === `task-42-s${i}`);
      expect(mine.map((t) => t.reward)).toEqual([reward, reward]);
      expect(episodes.find((e) => e.rollout_id === `task-42-s${i}`)).toMatchObject({ final_reward: reward, transition_ids: mine.map((t) => t.transition_id) });
    }
  });
});
