import OpenAI from 'openai';
import { postReward, useSidecar } from '../support/sidecar';

/**
 * A reward reaches the trainer's output or gets a 4xx that says why: never a 202 that goes
 * nowhere. Late (its episode closed) is 409, no episode of that rollout attempt is 404; over OTLP
 * the span is rejected in the partial success. Each outcome is counted and logged.
 */
describe('rewards that cannot reach an episode', () => {
  const f = useSidecar({ processors: { episodes: { tool_span_wait_ms: 0, idle_timeout_ms: 1_500 } } });

  async function call(rolloutId: string, attemptId = '0'): Promise<void> {
    const client = new OpenAI({ baseURL: `${f.sidecar.origin}/rollout/${rolloutId}/attempt/${attemptId}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    await client.chat.completions.create({ model: 'policy', messages: [{ role: 'user', content: `hello from ${rolloutId}` }] });
  }

  async function closed(rolloutId: string): Promise<void> {
    const deadline = Date.now() + 10_000;
    while (!f.sidecar.episodes().some((e) => e.rollout_id === rolloutId)) {
      if (Date.now() > deadline) throw new Error(`episode ${rolloutId} did not close`);
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  function otlpReward(rolloutId: string, value: number): Promise<Response> {
    const span = {
      traceId: 'ab'.repeat(16),
      spanId: 'cd'.repeat(8),
      name: 'reward',
      kind: 1,
      startTimeUnixNano: '1',
      endTimeUnixNano: '2',
      attributes: [
        { key: 'lightning.rollout_id', value: { stringValue: rolloutId } },
        { key: 'lightning.reward', value: { doubleValue: value } },
        { key: 'lightning.reward.final', value: { boolValue: true } },
      ],
    };
    return fetch(`http://127.0.0.1:${f.sidecar.app.otlp!.httpPort()}/v1/traces`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ resourceSpans: [{ scopeSpans: [{ spans: [span] }] }] }),
    });
  }

  async function metrics(): Promise<string> {
    return (await fetch(`${f.sidecar.telemetryOrigin}/metrics`)).text();
  }

  it('a reward after its episode closed gets 409 with when and how it closed; the episode keeps its reward', async () => {
    await call('late-1');
    expect((await postReward(f.sidecar.origin, 'late-1', 1, { final: true })).status).toBe(202);
    await closed('late-1');

    const again = await postReward(f.sidecar.origin, 'late-1', 0.5, { final: true });
    expect(again.status).toBe(409);
    const body = (await again.json()) as { error: { message: string; type: string; code: string } };
    expect(body.error).toMatchObject({ type: 'conflict', code: 'episode_closed' });
    expect(body.error.message).toMatch(/a reward for rollout 'late-1' attempt '0' came after its episode closed \(completed at .*, final_reward 1\)/);
    expect(body.error.message).toContain('send other rewards before the final one');

    const end = await fetch(`${f.sidecar.origin}/lightning/v1/rollouts/late-1/end`, { method: 'POST', body: '{}' });
    expect(end.status).toBe(409);
    const agl = await fetch(`${f.sidecar.origin}/api/rollouts/late-1/attempt/0/events`, {
      method: 'POST',
      body: JSON.stringify({ event_type: 'reward', data: { value: 0.2 } }),
    });
    expect(agl.status).toBe(409);

    // Nothing new was written for it: one episode, the first reward.
    await call('late-1-witness');
    expect((await postReward(f.sidecar.origin, 'late-1-witness', 1)).status).toBe(202);
    await closed('late-1-witness');
    expect(f.sidecar.episodes().filter((e) => e.rollout_id === 'late-1')).toEqual([expect.objectContaining({ final_reward: 1, transitions: 1 })]);

    const text = await metrics();
    expect(text).toMatch(/lightning_sidecar_rewards_total\{source="rollout_api",kind="reward",outcome="episode_closed"\} 1\n/);
    expect(text).toMatch(/lightning_sidecar_rewards_total\{source="rollout_api",kind="end",outcome="episode_closed"\} 1\n/);
    expect(text).toMatch(/lightning_sidecar_rewards_total\{source="agentlightning_events",kind="reward",outcome="episode_closed"\} 1\n/);
    expect(text).toMatch(/lightning_sidecar_rewards_total\{source="rollout_api",kind="reward",outcome="applied"\} [2-9]/);
    expect(f.sidecar.logs.some((l) => l.includes('"level":"warn"') && l.includes("a reward for rollout 'late-1'"))).toBe(true);
  });

  it('a reward for a rollout attempt that made no call gets 404 and writes no empty episode', async () => {
    const ghost = await postReward(f.sidecar.origin, 'ghost-1', 1);
    expect(ghost.status).toBe(404);
    expect(((await ghost.json()) as { error: { code: string; message: string } }).error).toMatchObject({
      code: 'unknown_rollout',
      message: expect.stringContaining('no call of that rollout attempt went through this sidecar'),
    });

    // The wrong attempt of a live rollout is as unknown: before, it silently made an episode of its own.
    await call('attempts', '1');
    const wrong = await postReward(f.sidecar.origin, 'attempts', 1, { attempt_id: '0' });
    expect(wrong.status).toBe(404);
    expect((await postReward(f.sidecar.origin, 'attempts', 1, { attempt_id: '1' })).status).toBe(202);
    await closed('attempts');
    expect(f.sidecar.episodes().filter((e) => e.rollout_id === 'ghost-1' || e.rollout_id === 'attempts')).toEqual([
      expect.objectContaining({ rollout_id: 'attempts', attempt_id: '1', final_reward: 1 }),
    ]);
    expect(await metrics()).toMatch(/lightning_sidecar_rewards_total\{source="rollout_api",kind="reward",outcome="unknown_rollout"\} 2\n/);
  });

  it('a reward after an idle timeout says to raise idle_timeout_ms', async () => {
    await call('idle-1');
    await closed('idle-1');
    expect(f.sidecar.episodes().find((e) => e.rollout_id === 'idle-1')?.episode_status).toBe('timed_out');
    const late = await postReward(f.sidecar.origin, 'idle-1', 1);
    expect(late.status).toBe(409);
    expect(((await late.json()) as { error: { message: string } }).error.message).toMatch(
      /timed_out at .*, final_reward null\) and cannot be applied; it had been idle for processors\.episodes\.idle_timeout_ms \(1500 ms\)/,
    );
  });

  it('over OTLP, a late reward span is rejected in the partial success, not silently accepted', async () => {
    await call('late-otlp');
    expect((await otlpReward('late-otlp', 1)).status).toBe(200);
    await closed('late-otlp');
    const res = await otlpReward('late-otlp', 0);
    expect(res.status).toBe(200);
    const body = (await res.json()) as { partialSuccess?: { rejectedSpans: string; errorMessage: string } };
    expect(body.partialSuccess).toEqual({
      rejectedSpans: '1',
      errorMessage: expect.stringMatching(/^1 span\(s\) rejected: a reward for rollout 'late-otlp' attempt '0' came after its episode closed/),
    });
    const text = await metrics();
    expect(text).toMatch(/lightning_sidecar_rewards_total\{source="span",kind="reward",outcome="episode_closed"\} 1\n/);
    expect(text).toMatch(/lightning_sidecar_otlp_spans_total\{transport="http",outcome="rejected",reason="not_applicable"\} 1\n/);
    expect(f.sidecar.episodes().filter((e) => e.rollout_id === 'late-otlp')).toEqual([expect.objectContaining({ final_reward: 1 })]);
  });
});
