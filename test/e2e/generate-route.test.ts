import OpenAI from 'openai';
import { runCalculatorAgent } from '../support/calculator-agent';
import type { Trajectory } from '../../src/model/records';
import { CALCULATOR_TOOLS as TOOLS, maskStandIn, startQwen3Server, type ChatMessage, type Qwen3Server } from '../support/qwen3-server';
import { rewardedTrajectories, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Token-in over vLLM's token-in route `/inference/v1/generate`: a vLLM stand-in with Qwen3's real
 * template serves the route (with `--return-sampling-mask`: masks on non-streamed answers, as vLLM
 * gives them), an agent on the real `openai` SDK runs a tool loop through a sidecar that finds the
 * route by itself and one held to `/v1/completions`. The agent must get the same answers and tool
 * calls, the server the same prompts, each rollout must be one trajectory segment, and every
 * sampled id must lie in the mask the record holds for it, row for row what the server sent.
 */

const QUERIES = ['Compute 3*4 and 7+8.', 'Now compute 10-2.'];
const KEEP = 3;

function row(t: Trajectory, p: number): number[] {
  const m = t.sampling_mask!;
  return m.ids.slice(m.offsets[p], m.offsets[p + 1]);
}

describe("token-in over vLLM's /inference/v1/generate", () => {
  let server: Qwen3Server;
  let textless: Qwen3Server;
  const sidecars: TestSidecar[] = [];
  beforeAll(async () => {
    [server, textless] = await Promise.all([
      startQwen3Server({ generate: { masks: { keep: KEEP } }, weightVersions: (answer, n) => [{ version: `v${answer}`, start: 0, end: n }] }),
      startQwen3Server({ generate: { textless: true } }),
    ]);
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await Promise.all([server?.close(), textless?.close()]);
  });
  const sidecarFor = async (upstream: Qwen3Server, route: string): Promise<TestSidecar> => {
    const s = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: true, route } } },
      processors: { sampling: { masks: true, logprobs_mode: 'processed_logprobs' } },
    });
    sidecars.push(s);
    return s;
  };
  async function run(sidecar: TestSidecar, upstream: Qwen3Server, rollout: string, stream: boolean) {
    const [p0, r0] = [upstream.completionPrompts.length, upstream.requests.length];
    const received = await runCalculatorAgent(sidecar, rollout, { stream: stream, queries: QUERIES });
    const paths = upstream.requests.slice(r0).map((r) => r.path);
    return { received, paths, prompts: upstream.completionPrompts.slice(p0), trajectories: await rewardedTrajectories(sidecar, rollout) };
  }

  it.each([false, true])(
    'found by itself: the same answers and prompts as over completions, one segment (streamed: %s)',
    async (stream) => {
      const [auto, completions] = await Promise.all([sidecarFor(server, 'auto'), sidecarFor(server, 'completions')]);
      const a = await run(auto, server, `gr-auto-${stream}`, stream);
      const b = await run(completions, server, `gr-completions-${stream}`, stream);
      expect(a.received).toEqual(b.received);
      expect(a.prompts).toEqual(b.prompts);
      expect(a.prompts.length).toBeGreaterThan(3);
      // The one-token probe, then every call on the route; none on completions.
      const generated = a.paths.filter((p) => p === '/inference/v1/generate').length;
      expect(generated).toBe(a.prompts.length + 1);
      expect(a.paths).not.toContain('/v1/completions');
      expect(b.paths).not.toContain('/inference/v1/generate');
      expect(a.trajectories).toHaveLength(1);
      const [t] = a.trajectories;
      expect(t.token_ids).toEqual(b.trajectories[0].token_ids);
      expect(t.logprobs).toEqual(b.trajectories[0].logprobs);
      expect(t.turns.every((u) => u.has_logprobs)).toBe(true);
      // Weight versions come from the route's answers (the completions one carries them too).
      expect(t.weight_versions?.length).toBe(t.turns.length);
      const transitions = auto.transitions().filter((x) => x.rollout_id === `gr-auto-${stream}`);
      expect(transitions.map((x) => x.translation?.upstream_api)).toEqual(transitions.map(() => 'generate'));
      // The record says what the agent received: finish reasons and tool calls, call by call.
      expect(transitions.map((x) => [x.finish_reason, x.tool_calls.map((c) => c.name)])).toEqual(a.received.map((r) => [r.finish, r.calls.map((c) => c.name)]));
    },
    60_000,
  );

  it('records the masks the route gives (not streamed): every row the server sent, every sampled id in its row', async () => {
    const s = await sidecarFor(server, 'generate');
    const a = await run(s, server, 'gr-masks', false);
    const [t] = a.trajectories;
    expect(t.sampling_mask_complete).toBe(true);
    expect(t.sampling_mask_violations).toBe(0);
    expect(t.sampling_mask_coverage).toBe(1);
    expect(t.logprobs_mode).toBe('processed_logprobs');
    for (const turn of t.turns)
      for (let p = turn.response_start; p < turn.response_end; p++) {
        expect(row(t, p)).toEqual(maskStandIn(t.token_ids[p], p - turn.response_start, KEEP));
        expect(row(t, p)).toContain(t.token_ids[p]);
      }
    // vLLM does not stream masks: a streamed rollout's trajectory says they are missing.
    const streamed = await run(s, server, 'gr-masks-stream', true);
    expect(streamed.trajectories[0].sampling_mask_complete).toBe(false);
    expect(streamed.trajectories[0].sampling_mask!.missing).toEqual(streamed.trajectories[0].turns.map((u) => [u.response_start, u.response_end]));
  }, 60_000);

  it("with stops of the agent's own, a stop on the route (which does not say which stop ended it) is not taken for the model's end of turn", async () => {
    const s = await sidecarFor(server, 'generate');
    const client = new OpenAI({ baseURL: `${s.origin}/rollout/gr-stops/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const messages: ChatMessage[] = [{ role: 'user', content: 'Compute 3*4.' }];
    const first = (await client.chat.completions.create({ model: 'Qwen/Qwen3-8B', messages: messages as never, tools: TOOLS, stop: ['Observation:'] }))
      .choices[0].message;
    messages.push(
      { role: 'assistant', content: first.content, tool_calls: first.tool_calls as never },
      { role: 'tool', tool_call_id: first.tool_calls![0].id, content: '12' },
    );
    await client.chat.completions.create({ model: 'Qwen/Qwen3-8B', messages: messages as never, tools: TOOLS, stop: ['Observation:'] });
    await rewardedTrajectories(s, 'gr-stops');
    const transitions = s.transitions().filter((t) => t.rollout_id === 'gr-stops');
    expect(transitions.map((t) => t.token_in)).toEqual(['rendered:first_call', 'rendered:previous_cut']);
  }, 60_000);

  it('a server whose route answers without text (before output_mode) is served over completions', async () => {
    const s = await sidecarFor(textless, 'auto');
    const a = await run(s, textless, 'gr-textless', false);
    expect(a.paths.filter((p) => p === '/inference/v1/generate')).toHaveLength(1);
    expect(a.paths.filter((p) => p === '/v1/completions')).toHaveLength(a.prompts.length);
    expect(a.trajectories).toHaveLength(1);
  }, 60_000);
});
