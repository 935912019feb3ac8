import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

function value(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(series + ' ') || (l.startsWith(series + '{') && l.slice(0, l.lastIndexOf(' ')) === series));
  return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : NaN;
}

describe('/metrics, /healthz, /readyz', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  const scrape = async () => {
    const res = await fetch(`${sidecar.telemetryOrigin}/metrics`);
    expect(res.headers.get('content-type')).toContain('text/plain');
    return res.text();
  };

  it('moves the named series with real traffic', async () => {
    const before = await scrape();
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/m1/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'one' }] });
    const s = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'two' }], stream: true });
    for await (const _ of s) void _;
    await postReward(sidecar.origin, 'm1', 1);
    await sidecar.waitForEpisodes(1);
    await new Promise((r) => setTimeout(r, 50));
    const after = await scrape();
    const delta = (series: string) => (value(after, series) || 0) - (value(before, series) || 0);
    expect(delta('lightning_sidecar_proxy_requests_total{api="chat.completions",status_class="2xx"}')).toBe(2);
    expect(delta('lightning_sidecar_proxy_request_duration_seconds_count{api="chat.completions",streamed="true"}')).toBe(1);
    expect(delta('lightning_sidecar_upstream_ttfb_seconds_count{api="chat.completions"}')).toBe(2);
    expect(delta('lightning_sidecar_proxy_added_latency_seconds_count{api="chat.completions"}')).toBe(2);
    // Observed in seconds: a call to a local fake server takes well under 0.5 s (in milliseconds
    // it would land above that bucket).
    const under = (text: string, series: string, le: string) =>
      [...text.matchAll(new RegExp(`^${series}_bucket\\{le="${le}",api="chat\\.completions"[^}]*\\} (\\d+)`, 'gm'))].reduce((n, m) => n + Number(m[1]), 0);
    for (const series of ['lightning_sidecar_proxy_request_duration_seconds', 'lightning_sidecar_upstream_ttfb_seconds'])
      expect(under(after, series, '0.5') - under(before, series, '0.5')).toBe(2);
    expect(delta('lightning_sidecar_streamed_chunks_total{api="chat.completions"}')).toBeGreaterThan(3);
    expect(delta('lightning_sidecar_tokens_total{kind="response"}')).toBeGreaterThan(0);
    expect(delta('lightning_sidecar_episodes_closed_total{status="completed"}')).toBe(1);
    expect(delta('lightning_sidecar_transitions_exported_total{exporter="file"}')).toBe(2);
    expect(delta('lightning_sidecar_export_lag_seconds_count')).toBe(2);
    expect(delta('lightning_sidecar_rollout_api_requests_total{route="reward",outcome="202"}')).toBe(1);
    expect(value(after, 'lightning_sidecar_journal_bytes')).toBeGreaterThan(0);
    expect(value(after, 'lightning_sidecar_open_episodes')).toBe(0);
  });

  it('counts calls without token ids once their transitions are built (the episode closed)', async () => {
    const plain = await startSidecar(upstream.url);
    try {
      await new OpenAI({ baseURL: `${plain.origin}/rollout/plain1/v1`, apiKey: 'k', maxRetries: 0 }).chat.completions.create({ model: 'm', messages: [] });
      await postReward(plain.origin, 'plain1', 0);
      await plain.waitForEpisodes(1);
      await new Promise((r) => setTimeout(r, 50));
      const text = await plain.app.metrics.registry.metrics();
      expect(value(text, 'lightning_sidecar_calls_missing_token_ids_total{api="chat.completions"}')).toBe(1);
    } finally {
      await plain.stop();
    }
  });

  it('answers /healthz and /readyz without calling the model server', async () => {
    const seen = upstream.requests.length;
    expect((await fetch(`${sidecar.telemetryOrigin}/healthz`)).status).toBe(200);
    const ready = await fetch(`${sidecar.telemetryOrigin}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready', failing: {}, degraded: {} });
    expect(upstream.requests.length).toBe(seen);
  });

  it('keeps labels bounded: no rollout ids or model strings', async () => {
    const text = await scrape();
    expect(text).not.toContain('m1');
    expect(text).not.toMatch(/rollout_id=/);
  });
});
