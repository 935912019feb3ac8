import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startChildSidecar, type ChildSidecar } from '../support/child-sidecar';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { needsDebianTool } from '../support/debian-tool';
import { postReward } from '../support/sidecar';

/** Prometheus' own linter (Debian package `prometheus`; .ci/run installs it). */
const promtool = needsDebianTool('promtool', 'prometheus', 'test/telemetry/promtool.test.ts');

describe('/metrics by Prometheus rules (promtool check metrics)', () => {
  let upstream: FakeModelServer;
  let sidecar: ChildSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startChildSidecar({
      LIGHTNING_UPSTREAM_URL: upstream.url,
      LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
      LIGHTNING_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), 'lightning-promtool-')),
    });
  });
  afterAll(async () => {
    await sidecar?.kill();
    await upstream?.close();
  });

  async function traffic(): Promise<void> {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/p1/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'one' }] });
    const s = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'two' }], stream: true });
    for await (const _ of s) void _;
    expect((await postReward(sidecar.origin, 'p1', 1)).status).toBe(202);
    await new Promise((r) => setTimeout(r, 200));
  }

  (promtool ? it : it.skip)('finds nothing to report on a live page after traffic (skipped when promtool is not installed, outside CI)', async () => {
    await traffic();
    const text = await (await fetch(`${sidecar.telemetryOrigin}/metrics`)).text();
    // Every histogram has samples now, so each name is checked.
    for (const name of ['proxy_request_duration_seconds', 'upstream_ttfb_seconds', 'proxy_added_latency_seconds'])
      expect(text).toMatch(new RegExp(`^lightning_sidecar_${name}_count\\{[^}]*\\} [1-9]`, 'm'));
    const lint = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
    expect(lint.stdout + lint.stderr).toBe('');
    expect(lint.status).toBe(0);
  });

  it('names no metric with an abbreviated unit and no gauge with _total', async () => {
    const text = await (await fetch(`${sidecar.telemetryOrigin}/metrics`)).text();
    const types = [...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => ({ name: m[1], type: m[2] }));
    expect(types.length).toBeGreaterThan(30);
    expect(types.filter((t) => /_(ms|us|ns|msec|millis|kb|mb)(_|$)/.test(t.name)).map((t) => t.name)).toEqual([]);
    expect(types.filter((t) => t.type !== 'counter' && t.name.endsWith('_total')).map((t) => t.name)).toEqual([]);
  });
});
