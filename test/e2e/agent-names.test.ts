import OpenAI from 'openai';
import { startAgentTracing } from '../support/otel-globals';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Where an agent's name comes from (docs/frameworks.md, "Agent names"): the `x-agent-name` header,
 * else baggage `lightning.agent_name`, else the innermost GenAI `invoke_agent` span of the call's
 * trace; selective capture uses that name, whichever it came from.
 */
describe('agent names: an agent named only by its invoke_agent spans is selected by include_agents', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  let tracing: ReturnType<typeof startAgentTracing>;

  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      processors: { capture: { include_agents: ['writer'] }, episodes: { tool_span_wait_ms: 300 } },
    });
    tracing = startAgentTracing('sql-agents', `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces`);
  });

  afterAll(async () => {
    await tracing.stop();
    await sidecar.stop();
    await upstream.close();
  });

  it('names each call from its agent span and trains only the included agent; a header still wins over a span', async () => {
    const tracer = tracing.provider.getTracer('sql-agents');
    // No agent header: the only name a call has is the GenAI agent span it runs in.
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/names-1/v1`, apiKey: 'k', maxRetries: 0 });
    const ask = (content: string, headers?: Record<string, string>) =>
      client.chat.completions.create({ model: 'policy', messages: [{ role: 'user', content }] }, headers ? { headers } : undefined);
    const inAgent = (name: string, body: () => Promise<unknown>) =>
      tracer.startActiveSpan(`invoke_agent ${name}`, { attributes: { 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.agent.name': name } }, async (span) => {
        try {
          await body();
        } finally {
          span.end();
        }
      });
    await tracer.startActiveSpan(
      'invoke_agent orchestrator',
      { attributes: { 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.agent.name': 'orchestrator' } },
      async (root) => {
        await inAgent('writer', () => ask('write SQL for: how many singers?'));
        await inAgent('critic', () => ask('check: SELECT count(*) FROM singer'));
        await inAgent('writer', () => ask('rewrite it given the check'));
        // Inside the writer's span, but the header names another agent: the header wins.
        await inAgent('writer', () => ask('a side question', { 'x-agent-name': 'critic' }));
        root.end();
      },
    );
    await tracing.provider.forceFlush();
    expect(upstream.requests).toHaveLength(4);
    expect((await postReward(sidecar.origin, 'names-1', 1)).status).toBe(202);
    const [episode] = await sidecar.waitForEpisodes(1);

    const ts = sidecar.transitions();
    expect(ts.map((t) => [t.seq, t.agent_name])).toEqual([
      [0, 'writer'],
      [2, 'writer'],
    ]);
    expect(ts.map((t) => t.reward)).toEqual([1, 1]);
    expect(episode).toMatchObject({ transitions: 2, transition_ids: ts.map((t) => t.transition_id) });
    expect(sidecar.trajectories().flatMap((t) => t.turns.map((turn) => turn.transition_id))).toEqual(ts.map((t) => t.transition_id));
  });
});
