import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../support/sidecar';

describe('a full journal', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, { service: { journal: { max_bytes: 40_000, segment_bytes: 4096, high_watermark: 0.5 } } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  it('above its high watermark: keeps serving agents, counts lost captures, turns /readyz unready; rewards still close episodes and free space', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/fill/v1`, apiKey: 'k', maxRetries: 0 });
    // Fill the journal with captures of an open episode (nothing can be released while it is open).
    for (let i = 0; i < 60 && !sidecar.app.pipeline.journal.full; i++) {
      await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(400) }] });
    }
    expect(sidecar.app.pipeline.journal.full).toBe(true);
    const served = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'still served?' }] });
    expect(served.choices[0].message.content).toBe('Hello from the fake model.');
    await new Promise((r) => setImmediate(r));
    const drops = await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_capture_drops_total');
    expect(drops).toMatch(/reason="journal_full"\} [1-9]/);

    // OTLP is refused with a retryable status while the journal is above its high watermark.
    const span = {
      traceId: 'ab'.repeat(16),
      spanId: 'cd'.repeat(8),
      name: 'execute_tool t',
      kind: 1,
      startTimeUnixNano: '1',
      endTimeUnixNano: '2',
      attributes: [
        { key: 'gen_ai.operation.name', value: { stringValue: 'execute_tool' } },
        { key: 'lightning.rollout_id', value: { stringValue: 'fill' } },
      ],
    };
    const otlp = await fetch(`http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ resourceSpans: [{ scopeSpans: [{ spans: [span] }] }] }),
    });
    expect(otlp.status).toBe(503);
    expect(otlp.headers.get('retry-after')).toBe('1');

    const ready = await fetch(`${sidecar.telemetryOrigin}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { failing: Record<string, string> }).failing.journal).toContain('high watermark');
    expect((await fetch(`${sidecar.telemetryOrigin}/healthz`)).status).toBe(200);

    // A reward may use the room above the high watermark: the episode closes, is exported, its segments go.
    const reward = await fetch(`${sidecar.origin}/lightning/v1/rollouts/fill/reward`, { method: 'POST', body: '{"value":1}' });
    expect(reward.status).toBe(202);
    await sidecar.waitForEpisodes(1);
    for (let i = 0; i < 100 && (await fetch(`${sidecar.telemetryOrigin}/readyz`)).status !== 200; i++) await new Promise((r) => setTimeout(r, 20));
    expect((await fetch(`${sidecar.telemetryOrigin}/readyz`)).status).toBe(200);
    expect(sidecar.app.pipeline.journal.full).toBe(false);
  });

  it('at its hard limit refuses the rollout API with 503 + Retry-After', async () => {
    const tiny = await startSidecar(upstream.url, { service: { journal: { max_bytes: 16 * 1024, segment_bytes: 64 * 1024, high_watermark: 1 } } });
    try {
      // One call (a reward needs a rollout to reach), then rewards that do not close it until the journal is full.
      const call = await fetch(`${tiny.origin}/rollout/r/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'policy', messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(call.status).toBe(200);
      let last: Response | null = null;
      for (let i = 0; i < 400; i++) {
        last = await fetch(`${tiny.origin}/lightning/v1/rollouts/r/reward`, { method: 'POST', body: '{"value":1,"final":false}' });
        if (last.status !== 202) break;
      }
      expect(last!.status).toBe(503);
      expect(last!.headers.get('retry-after')).toBe('1');
      expect(((await last!.json()) as { error: { code: string } }).error.code).toBe('JOURNAL_FULL');
    } finally {
      await tiny.stop();
    }
  });
  it('unwritable (its directory replaced by a file): agents are still served, /readyz is unready with the cause; ready again once writes succeed', async () => {
    const s = await startSidecar(upstream.url, { service: { journal: { segment_bytes: 2048 } } });
    const dir = path.join(s.dataDir, 'journal');
    try {
      const client = new OpenAI({ baseURL: `${s.origin}/rollout/unwritable/v1`, apiKey: 'k', maxRetries: 0 });
      const call = () => client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'y'.repeat(1500) }] });
      await call();
      expect((await fetch(`${s.telemetryOrigin}/readyz`)).status).toBe(200);
      // The next segment cannot be created: the journal path is now a regular file.
      renameSync(dir, `${dir}.moved`);
      writeFileSync(dir, 'not a directory');
      const served = await call();
      expect(served.choices[0].message.content).toBe('Hello from the fake model.');
      let ready = await fetch(`${s.telemetryOrigin}/readyz`);
      for (let i = 0; i < 100 && ready.status === 200; i++) {
        await new Promise((r) => setTimeout(r, 20));
        ready = await fetch(`${s.telemetryOrigin}/readyz`);
      }
      expect(ready.status).toBe(503);
      expect(((await ready.json()) as { failing: Record<string, string> }).failing.journal).toMatch(/last write failed: (ENOTDIR|EEXIST|ENOENT)/);
      const drops = await s.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_capture_drops_total');
      expect(drops).toMatch(/reason="journal_unwritable"\} [1-9]/);

      // Put the directory back: the next write succeeds and readiness returns without a restart.
      rmSync(dir);
      renameSync(`${dir}.moved`, dir);
      mkdirSync(dir, { recursive: true });
      await call();
      for (let i = 0; i < 100 && ready.status !== 200; i++) {
        await new Promise((r) => setTimeout(r, 20));
        ready = await fetch(`${s.telemetryOrigin}/readyz`);
      }
      expect(ready.status).toBe(200);
    } finally {
      await s.stop();
    }
  });
});
