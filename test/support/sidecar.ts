import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config/load';
import { createApp, type App, type AppDeps } from '../../src/service/app';
import type { EpisodeSummary, Trajectory, Transition } from '../../src/model/records';
import { createLogger } from '../../src/telemetry/logger';
import { createMetrics } from '../../src/telemetry/metrics';
import { startFakeModelServer, type FakeModelServer } from './fake-model-server';

export interface TestSidecar {
  app: App;
  /** `http://127.0.0.1:PORT` */
  origin: string;
  /** `http://127.0.0.1:PORT/v1`, what an agent puts in OPENAI_BASE_URL. */
  baseUrl: string;
  telemetryOrigin: string;
  dataDir: string;
  logs: string[];
  transitions(): Transition[];
  trajectories(): Trajectory[];
  episodes(): EpisodeSummary[];
  waitForEpisodes(n: number, timeoutMs?: number): Promise<EpisodeSummary[]>;
  stop(): Promise<void>;
}

/** Starts the whole sidecar in-process on port 0, with a temp data dir and captured logs. */
export async function startSidecar(upstreamUrl: string, overrides: Record<string, unknown> = {}, deps: Partial<AppDeps> = {}): Promise<TestSidecar> {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-test-'));
  const base = {
    receivers: {
      // Tests name the flavor they exercise; the product default (auto) probes the upstream, which
      // would show up among the fake server's requests.
      llm_proxy: { endpoint: '127.0.0.1:0', upstream_url: upstreamUrl, upstream_flavor: 'openai' },
      otlp: { protocols: { grpc: { endpoint: '127.0.0.1:0' }, http: { endpoint: '127.0.0.1:0' } } },
    },
    processors: { episodes: { tool_span_wait_ms: 0, tick_interval_ms: 20 } },
    // The suite reads transitions as well as trajectories; a test of the product default says so.
    exporters: { records: 'both' },
    service: { data_dir: dataDir, telemetry: { endpoint: '127.0.0.1:0' }, log_level: 'debug' },
  };
  const config = loadConfig({ env: {}, overrides: merge(base, overrides) });
  const logs: string[] = [];
  const app = createApp(config, { logger: createLogger({ level: 'debug', write: (l) => logs.push(l) }), metrics: createMetrics(), ...deps });
  await app.start();
  const origin = `http://127.0.0.1:${app.proxy.port()}`;
  const read = <T>(kind: string): T[] => readNdjson<T>(path.join(dataDir, kind));
  const sidecar: TestSidecar = {
    app,
    origin,
    baseUrl: `${origin}/v1`,
    telemetryOrigin: `http://127.0.0.1:${app.telemetry.port()}`,
    dataDir,
    logs,
    transitions: () => read<Transition>('transitions'),
    trajectories: () => read<Trajectory>('trajectories'),
    episodes: () => read<EpisodeSummary>('episodes'),
    async waitForEpisodes(n, timeoutMs = 5000) {
      const until = Date.now() + timeoutMs;
      for (;;) {
        const eps = sidecar.episodes();
        if (eps.length >= n) return eps;
        if (Date.now() > until) throw new Error(`expected ${n} episodes, have ${eps.length} after ${timeoutMs} ms`);
        await new Promise((r) => setTimeout(r, 20));
      }
    },
    async stop() {
      await app.shutdown();
      // Kept next to the data for the suite-wide secrets scan (test/support/secrets-scan.js).
      writeFileSync(path.join(dataDir, 'sidecar.log'), logs.join('\n'));
    },
  };
  return sidecar;
}

function merge(a: Record<string, unknown>, b: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...a };
  for (const [k, v] of Object.entries(b)) {
    const cur = out[k];
    out[k] = isObj(cur) && isObj(v) ? merge(cur, v) : v;
  }
  return out;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Posts a final reward through the rollout API. */
export async function postReward(origin: string, rolloutId: string, value: number, extra: Record<string, unknown> = {}): Promise<Response> {
  return fetch(`${origin}/lightning/v1/rollouts/${rolloutId}/reward`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ value, ...extra }),
  });
}

/**
 * A vLLM-like fake model server and an in-process sidecar in front of it for a `describe` block:
 * started in beforeAll, stopped in afterAll. Read `.upstream` / `.sidecar` inside tests.
 */
export function useSidecar(overrides: Record<string, unknown> = {}): { readonly upstream: FakeModelServer; readonly sidecar: TestSidecar } {
  const f = {} as { upstream: FakeModelServer; sidecar: TestSidecar };
  beforeAll(async () => {
    f.upstream = await startFakeModelServer({ flavor: 'vllm' });
    f.sidecar = await startSidecar(f.upstream.url, merge({ receivers: { llm_proxy: { upstream_flavor: 'vllm' } } }, overrides));
  });
  afterAll(async () => {
    await f.sidecar?.stop();
    await f.upstream?.close();
  });
  return f;
}

/** Every record of the `.ndjson` files of a file exporter's folder, in file order (none when it is not there). */
export function readNdjson<T>(dir: string): T[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith('.ndjson'))
    .sort()
    .flatMap((f) =>
      readFileSync(path.join(dir, f), 'utf8')
        .split('\n')
        .filter((l) => l.trim() !== ''),
    )
    .map((l) => JSON.parse(l) as T);
}

/** Posts the rollout's final reward (1), waits (up to 20 s) for its episode, and returns its trajectories. */
export async function rewardedTrajectories(sidecar: TestSidecar, rollout: string): Promise<Trajectory[]> {
  const posted = await postReward(sidecar.origin, rollout, 1);
  if (posted.status !== 202) throw new Error(`reward for ${rollout}: HTTP ${posted.status}`);
  const deadline = Date.now() + 20_000;
  while (!sidecar.episodes().some((e) => e.rollout_id === rollout)) {
    if (Date.now() > deadline) throw new Error(`no episode for ${rollout}`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return sidecar.trajectories().filter((t) => t.rollout_id === rollout);
}

/** A sample's value on the sidecar's `/metrics` (`line`: its name and labels as printed), or null when it is not there. */
export async function metricSample(sidecar: TestSidecar, line: string): Promise<number | null> {
  const text = await (await fetch(`${sidecar.telemetryOrigin}/metrics`)).text();
  const hit = text.split('\n').find((l) => l.startsWith(`${line} `));
  return hit === undefined ? null : Number(hit.slice(line.length + 1));
}
