import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { mkdtempSync } from 'node:fs';
import OpenAI from 'openai';
import { loadConfig } from '../../src/config/load';
import { createApp } from '../../src/service/app';
import { createLogger } from '../../src/telemetry/logger';
import { createMetrics } from '../../src/telemetry/metrics';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

// How the sidecar finds out that its model server gives token ids (upstream_flavor auto), and
// what it says when it cannot: a replica down at start must not hide the others, a call made the
// moment the sidecar starts must be asked for ids, and a sidecar that records calls without ids
// must say so in its log.

const AUTO = { receivers: { llm_proxy: { upstream_flavor: 'auto', routing: { probe_interval_ms: 100, scrape_interval_ms: 0 } } } };

/** A port nothing listens on (a replica that is down). */
async function closedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

async function chat(baseURL: string, content: string): Promise<void> {
  const client = new OpenAI({ baseURL, apiKey: 'sk-test', maxRetries: 0 });
  await client.chat.completions.create({ model: 'fake-model', messages: [{ role: 'user', content }] });
}

async function until(check: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('identifying the model server', () => {
  const servers: FakeModelServer[] = [];
  const sidecars: TestSidecar[] = [];
  afterEach(async () => {
    await Promise.all(sidecars.splice(0).map((s) => s.stop()));
    await Promise.all(servers.splice(0).map((s) => s.close()));
  });

  it('two replicas, the first down at start: identified through the second; every call has ids from the first on', async () => {
    const down = await closedPort();
    const up = await startFakeModelServer({ flavor: 'vllm', strict: true });
    servers.push(up);
    const sidecar = await startSidecar(`http://127.0.0.1:${down}/v1,${up.url}`, AUTO);
    sidecars.push(sidecar);
    const state = sidecar.app.proxy.upstream();
    expect(state).toMatchObject({ flavor: 'vllm', source: 'detected' });
    expect(state.evidence).toContain(`127.0.0.1:${up.port}`);
    for (let i = 0; i < 3; i++) {
      const rollout = `replica-down-${i}`;
      await chat(`${sidecar.origin}/rollout/${rollout}/v1`, `Compute ${i}+1.`);
      await postReward(sidecar.origin, rollout, 1);
    }
    const episodes = await sidecar.waitForEpisodes(3, 10_000);
    expect(episodes.every((e) => e.trajectory_ids.length === 1)).toBe(true);
    const transitions = sidecar.transitions();
    expect(transitions).toHaveLength(3);
    for (const t of transitions) {
      expect(t.seq).toBe(0);
      expect(t.response_token_ids?.length).toBeGreaterThan(0);
      expect(t.prompt_token_ids?.length).toBeGreaterThan(0);
    }
    expect(sidecar.logs.some((l) => l.includes('episodes close without trajectories'))).toBe(false);
  }, 30_000);

  it('every replica down at start: the first call once one is up waits for the identification and has ids', async () => {
    const port = await closedPort();
    const sidecar = await startSidecar(`http://127.0.0.1:${port}/v1`, AUTO);
    sidecars.push(sidecar);
    expect(sidecar.app.proxy.upstream()).toMatchObject({ source: 'unknown' });
    const server = await startFakeModelServer({ flavor: 'vllm', strict: true, port });
    servers.push(server);
    // Past the one-second spacing of call-started probes after the failed start.
    await new Promise((r) => setTimeout(r, 1100));
    await chat(`${sidecar.origin}/rollout/late-up/v1`, 'Compute 2+2.');
    await postReward(sidecar.origin, 'late-up', 1);
    await sidecar.waitForEpisodes(1, 10_000);
    const [t] = sidecar.transitions();
    expect(t.response_token_ids?.length).toBeGreaterThan(0);
    expect(t.injected.length).toBeGreaterThan(0);
    expect(sidecar.trajectories()).toHaveLength(1);
    // The probe came before the call, on the server's own routes.
    const paths = server.requests.map((r) => `${r.method} ${r.path}`);
    expect(paths.indexOf('GET /v1/models')).toBeGreaterThanOrEqual(0);
    expect(paths.indexOf('GET /v1/models')).toBeLessThan(paths.indexOf('POST /v1/chat/completions'));
  }, 30_000);

  it('a shutdown while a call waits for the identification lets that call finish', async () => {
    const port = await closedPort();
    const sidecar = await startSidecar(`http://127.0.0.1:${port}/v1`, AUTO);
    // Stopped below; not in `sidecars`.
    const server = await startFakeModelServer({ flavor: 'vllm', strict: true, port, delayMs: 300 });
    servers.push(server);
    await new Promise((r) => setTimeout(r, 1100));
    const call = chat(`${sidecar.origin}/rollout/shutdown-wait/v1`, 'Compute 1+1.').then(
      () => 'answered',
      (err: Error) => err.message,
    );
    // The call is waiting for the probe it started (two 300 ms answers) when the shutdown begins.
    await until(() => server.requests.some((r) => r.path === '/v1/models'), 5_000, 'the probe');
    const stopped = sidecar.stop();
    expect(await call).toBe('answered');
    await stopped;
    expect(server.requests.filter((r) => r.method === 'POST')).toHaveLength(1);
  }, 30_000);

  it('a call made the moment the proxy listens, while the first identification is under way, is asked for ids', async () => {
    // A server slow to answer (300 ms a request): the identification is still under way when the call comes.
    const server = await startFakeModelServer({ flavor: 'vllm', strict: true, delayMs: 300 });
    servers.push(server);
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-test-'));
    const config = loadConfig({
      env: {},
      overrides: {
        receivers: {
          llm_proxy: { endpoint: '127.0.0.1:0', upstream_url: server.url, upstream_flavor: 'auto' },
          otlp: { protocols: { grpc: { endpoint: '127.0.0.1:0' }, http: { endpoint: '127.0.0.1:0' } } },
        },
        processors: { episodes: { tool_span_wait_ms: 0, tick_interval_ms: 20 } },
        exporters: { records: 'both' },
        service: { data_dir: dataDir, telemetry: { endpoint: '127.0.0.1:0' } },
      },
    });
    const app = createApp(config, { logger: createLogger({ level: 'warn', write: () => {} }), metrics: createMetrics() });
    const started = app.start();
    try {
      let port = 0;
      await until(
        () => {
          try {
            port = app.proxy.port();
            return port > 0;
          } catch {
            return false;
          }
        },
        10_000,
        'the proxy to listen',
      );
      expect(app.proxy.upstream()).toMatchObject({ source: 'unknown', evidence: 'not probed yet' });
      await chat(`http://127.0.0.1:${port}/rollout/first-instant/v1`, 'Compute 1+1.');
      await started;
      const call = server.requests.find((r) => r.method === 'POST');
      expect(call?.json).toMatchObject({ return_token_ids: true });
    } finally {
      await started.catch(() => {});
      await app.shutdown();
    }
  }, 30_000);

  it('a server that gives no ids: the log warns that episodes close without trajectories, with the reason and the setting, once per period', async () => {
    const server = await startFakeModelServer({ flavor: 'openai', strict: true });
    servers.push(server);
    const sidecar = await startSidecar(server.url, AUTO);
    sidecars.push(sidecar);
    expect(sidecar.app.proxy.upstream()).toMatchObject({ flavor: 'openai', source: 'detected' });
    const warnings = () =>
      sidecar.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => String(l.msg).startsWith('episodes close without trajectories'));
    const episode = async (rollout: string, n: number) => {
      await chat(`${sidecar.origin}/rollout/${rollout}/v1`, 'Compute 1+1.');
      await postReward(sidecar.origin, rollout, 1);
      await sidecar.waitForEpisodes(n, 10_000);
    };
    await episode('no-ids-0', 1);
    await episode('no-ids-1', 2);
    await episode('no-ids-2', 3);
    expect(sidecar.trajectories()).toHaveLength(0);
    await until(() => warnings().length > 0, 5_000, 'the warning');
    const first = warnings();
    expect(first).toHaveLength(1);
    expect(first[0]).toMatchObject({ level: 'warn', reason: expect.stringContaining('flavor openai') });
    expect(String(first[0].msg)).toContain('LIGHTNING_UPSTREAM_FLAVOR');
    // The next period: one more line, saying how many were held back.
    await new Promise((r) => setTimeout(r, 10_100));
    await episode('no-ids-3', 4);
    await until(() => warnings().length > 1, 5_000, 'the second warning');
    expect(warnings()).toHaveLength(2);
    expect(warnings()[1]).toMatchObject({ suppressed_since_last: 2 });
  }, 40_000);

  it('a server configured as plain OpenAI on purpose: no warning about missing ids', async () => {
    const server = await startFakeModelServer({ flavor: 'openai', strict: true });
    servers.push(server);
    const sidecar = await startSidecar(server.url, { receivers: { llm_proxy: { upstream_flavor: 'openai' } } });
    sidecars.push(sidecar);
    await chat(`${sidecar.origin}/rollout/openai-on-purpose/v1`, 'Compute 1+1.');
    await postReward(sidecar.origin, 'openai-on-purpose', 1);
    await sidecar.waitForEpisodes(1, 10_000);
    expect(sidecar.transitions()[0].response_token_ids).toBeNull();
    expect(sidecar.logs.some((l) => l.includes('episodes close without trajectories'))).toBe(false);
  }, 30_000);
});
