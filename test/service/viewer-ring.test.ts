import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * What the viewer costs: with nobody looking, closed episodes are not read for it and nothing is
 * kept; while a page polls, they are kept within `service.ui.max_bytes` (the oldest forgotten
 * first); once nobody has asked for `idle_ms`, keeping stops again. With `enabled: false` there is
 * no `/ui` at all.
 */

async function rollout(sidecar: TestSidecar, id: string): Promise<void> {
  const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${id}/v1`, apiKey: 'sk-test', maxRetries: 0 });
  await client.chat.completions.create({ model: 'fake-model', messages: [{ role: 'user', content: `hello from ${id}` }] });
  expect((await postReward(sidecar.origin, id, 1)).status).toBe(202);
  const deadline = Date.now() + 10_000;
  while (!sidecar.episodes().some((e) => e.rollout_id === id)) {
    if (Date.now() > deadline) throw new Error(`no episode for ${id}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('the viewer keeps closed episodes only while somebody looks, within its bytes', () => {
  let upstream: FakeModelServer;
  const sidecars: TestSidecar[] = [];
  beforeAll(async () => {
    upstream = await startFakeModelServer();
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await upstream.close();
  });
  const start = async (ui: Record<string, unknown>): Promise<TestSidecar> => {
    const s = await startSidecar(upstream.url, { service: { ui }, receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    sidecars.push(s);
    return s;
  };

  it('keeps nothing while nobody looks, then what a page sees, bounded by max_bytes', async () => {
    const sidecar = await start({ max_bytes: 8_000 });
    const viewer = sidecar.app.viewer!;
    for (let i = 0; i < 3; i++) await rollout(sidecar, `unseen-${i}`);
    expect(viewer.ring.size).toBe(0);
    expect(viewer.watching).toBe(false);

    const look = await fetch(`${sidecar.telemetryOrigin}/ui/api/now`);
    expect(look.status).toBe(200);
    expect(viewer.watching).toBe(true);
    for (let i = 0; i < 40; i++) await rollout(sidecar, `seen-${i}`);
    // Bounded: the newest kept, the oldest forgotten, never more than max_bytes.
    expect(viewer.ring.usedBytes).toBeLessThanOrEqual(8_000);
    expect(viewer.ring.size).toBeGreaterThan(0);
    expect(viewer.ring.size).toBeLessThan(40);
    const now = (await (await fetch(`${sidecar.telemetryOrigin}/ui/api/now`)).json()) as { closed: { rollout_id: string; export: string }[] };
    expect(now.closed[0].rollout_id).toBe('seen-39');
    expect(now.closed.some((c) => c.rollout_id.startsWith('unseen'))).toBe(false);
    expect(now.closed.every((c) => c.export === 'delivered')).toBe(true);
    // Without tokenizer files the trajectory view has each call's answer as recorded.
    const seen = sidecar.trajectories().find((t) => t.rollout_id === 'seen-39')!;
    const view = (await (await fetch(`${sidecar.telemetryOrigin}/ui/api/trajectory?id=${encodeURIComponent(seen.trajectory_id)}`)).json()) as {
      trajectory: { token_ids: number[]; turn_text: string[]; token_text?: string[] };
    };
    expect(view.trajectory.token_ids).toEqual(seen.token_ids);
    expect(view.trajectory.token_text).toBeUndefined();
    const answer = JSON.parse(upstream.responses[upstream.responses.length - 1].toString('utf8')) as { choices: { message: { content: string } }[] };
    expect(view.trajectory.turn_text).toEqual([answer.choices[0].message.content]);
  }, 60_000);

  it('stops keeping once nobody has looked for idle_ms', async () => {
    const sidecar = await start({ idle_ms: 2_000 });
    const viewer = sidecar.app.viewer!;
    await fetch(`${sidecar.telemetryOrigin}/ui/api/now`);
    await rollout(sidecar, 'while-looking');
    expect(viewer.ring.size).toBe(1);
    await new Promise((r) => setTimeout(r, 2_200));
    await rollout(sidecar, 'after-looking');
    expect(viewer.ring.size).toBe(1);
  }, 30_000);

  it('is not there when turned off', async () => {
    const sidecar = await start({ enabled: false });
    expect(sidecar.app.viewer).toBeNull();
    expect((await fetch(`${sidecar.telemetryOrigin}/ui`)).status).toBe(404);
    expect((await fetch(`${sidecar.telemetryOrigin}/ui/api/now`)).status).toBe(404);
  });
});
