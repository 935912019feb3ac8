import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { routingSchema, type RoutingConfig } from '../../../src/config/schema';
import { serverLoad, UpstreamPool } from '../../../src/receivers/llm-proxy/upstream-pool';
import { silentLogger } from '../../../src/telemetry/logger';
import { createMetrics, type Metrics } from '../../../src/telemetry/metrics';

// Placement is decided without connecting (a request opens the connection), so replicas here may
// be addresses nothing listens on: nothing is sent to them.

const pools: UpstreamPool[] = [];
function pool(urls: string[], routing: Partial<RoutingConfig> = {}, resolve?: (h: string) => Promise<string[]>, metrics: Metrics = createMetrics()) {
  const p = new UpstreamPool(urls, routingSchema.parse({ scrape_interval_ms: 0, ...routing }), { logger: silentLogger, metrics, resolve });
  pools.push(p);
  return p;
}
afterEach(() => {
  for (const p of pools.splice(0)) p.close();
});

const FOUR = [1, 2, 3, 4].map((i) => `http://10.0.0.${i}:8000/v1`);

async function metricValue(metrics: Metrics, name: string, labels: string): Promise<number> {
  const text = await metrics.registry.metrics();
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels}`));
  return line === undefined ? 0 : Number(line.split(' ').pop());
}

describe('upstream pool: placement', () => {
  it('sticky: a rollout stays on one replica; new rollouts spread evenly over idle replicas', () => {
    const p = pool(FOUR);
    const first = new Map<string, string>();
    for (let i = 0; i < 16; i++) {
      const r = p.pick(`roll-${i}`);
      first.set(`roll-${i}`, r.id);
      p.release(r);
    }
    const perReplica = new Map<string, number>();
    for (const id of first.values()) perReplica.set(id, (perReplica.get(id) ?? 0) + 1);
    expect([...perReplica.values()]).toEqual([4, 4, 4, 4]);
    for (let round = 0; round < 3; round++)
      for (const [key, id] of first) {
        const r = p.pick(key);
        expect(r.id).toBe(id);
        p.release(r);
      }
    expect(p.state().placements).toBe(16);
  });

  it('sticky: a first call goes to the replica with the fewest calls in flight', () => {
    const p = pool(FOUR);
    const busy = [p.pick('a'), p.pick('b'), p.pick('c')];
    expect(new Set(busy.map((r) => r.id)).size).toBe(3);
    const next = p.pick('d');
    expect(busy.map((r) => r.id)).not.toContain(next.id);
  });

  it('sticky: an overloaded replica sheds the rollout to the least loaded one, counted as a move', async () => {
    const metrics = createMetrics();
    const p = pool(FOUR.slice(0, 2), { overload_factor: 1.5, overload_min_load: 3 }, undefined, metrics);
    const home = p.pick('hot');
    p.release(home);
    // Calls of the rollout pile up in flight on its replica: three stay (under overload_min_load)…
    const pinned = [];
    for (let i = 0; i < 3; i++) pinned.push(p.pick('hot'));
    expect(new Set(pinned.map((r) => r.id))).toEqual(new Set([home.id]));
    // …then it carries 3 against a mean of 1.5 (3 >= max(3, 1.5 x 1.5)): the next call moves.
    const moved = p.pick('hot');
    expect(moved.id).not.toBe(home.id);
    expect(await metricValue(metrics, 'lightning_sidecar_upstream_placement_moves_total', '{reason="overloaded"}')).toBe(1);
    // …and the rollout now lives there.
    expect(p.pick('hot').id).toBe(moved.id);
  });

  it('round_robin and random spread calls of one rollout over every replica', () => {
    for (const policy of ['round_robin', 'random'] as const) {
      const p = pool(FOUR, { policy });
      const seen = new Map<string, number>();
      for (let i = 0; i < 400; i++) {
        const r = p.pick('same-rollout');
        seen.set(r.id, (seen.get(r.id) ?? 0) + 1);
        p.release(r);
      }
      expect(seen.size).toBe(4);
      if (policy === 'round_robin') expect([...seen.values()]).toEqual([100, 100, 100, 100]);
      else for (const n of seen.values()) expect(n).toBeGreaterThan(50);
    }
  });

  it('keeps at most max_placements rollouts, forgetting the least recently used', () => {
    const p = pool(FOUR, { max_placements: 10 });
    for (let i = 0; i < 25; i++) p.release(p.pick(`r${i}`));
    expect(p.state().placements).toBe(10);
    expect(p.state().replicas.reduce((n, r) => n + r.placements, 0)).toBe(10);
  });

  it('failover marks the replica down and moves the rollout; none left: null', async () => {
    const metrics = createMetrics();
    const p = pool(FOUR.slice(0, 2), { probe_interval_ms: 60_000 }, undefined, metrics);
    const a = p.pick('r');
    const b = p.failover('r', a, new Set([a]), Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }));
    expect(b).not.toBeNull();
    expect(b!.id).not.toBe(a.id);
    expect(p.state().replicas.find((r) => r.id === a.id)).toMatchObject({ up: false, in_flight: 0 });
    expect(await metricValue(metrics, 'lightning_sidecar_upstream_placement_moves_total', '{reason="replica_down"}')).toBe(1);
    expect(await metricValue(metrics, 'lightning_sidecar_upstream_replica_up', `{replica="${a.id}"}`)).toBe(0);
    // The rollout's next call goes where it moved; the last replica failing leaves nowhere to go.
    p.release(b!);
    const again = p.pick('r');
    expect(again.id).toBe(b!.id);
    expect(p.failover('r', again, new Set([a, again]), new Error('reset'))).toBeNull();
  });
});

describe('upstream pool: DNS', () => {
  it('a name resolves to one replica per address; re-resolution adds at once, removes after three refreshes, keeps them when DNS fails', async () => {
    let answer: string[] | Error = ['10.1.0.1', '10.1.0.2'];
    const metrics = createMetrics();
    const p = pool(
      ['http://vllm-headless.test:8000/v1'],
      { dns_refresh_ms: 0 },
      async () => {
        if (answer instanceof Error) throw answer;
        return answer;
      },
      metrics,
    );
    await p.start();
    const ids = () =>
      p
        .state()
        .replicas.map((r) => r.id)
        .sort();
    expect(ids()).toEqual(['10.1.0.1:8000', '10.1.0.2:8000']);
    // The Host header stays the name's.
    expect(p.list()[0].client.origin).toMatchObject({ hostname: '10.1.0.1', hostHeader: 'vllm-headless.test:8000' });
    const placed = p.pick('r1');
    p.release(placed);

    answer = ['10.1.0.1', '10.1.0.2', '10.1.0.3'];
    await p.refreshDns();
    expect(ids()).toEqual(['10.1.0.1:8000', '10.1.0.2:8000', '10.1.0.3:8000']);

    answer = new Error('ENOTFOUND');
    for (let i = 0; i < 5; i++) await p.refreshDns();
    expect(ids()).toHaveLength(3);

    const gone = placed.id;
    answer = ['10.1.0.1', '10.1.0.2', '10.1.0.3'].filter((a) => `${a}:8000` !== gone);
    await p.refreshDns();
    await p.refreshDns();
    expect(ids()).toContain(gone);
    await p.refreshDns();
    expect(ids()).not.toContain(gone);
    expect(ids()).toHaveLength(2);
    // The rollout placed on the removed replica moves on its next call.
    expect(p.pick('r1').id).not.toBe(gone);
    expect(await metricValue(metrics, 'lightning_sidecar_upstream_placement_moves_total', '{reason="replica_removed"}')).toBe(1);
  });

  it('a name that does not resolve is connected to by name, and is down while other replicas serve', async () => {
    const p = pool(['http://10.2.0.1:8000/v1', 'http://not-yet.test:8000/v1'], { dns_refresh_ms: 0 }, async (h) => {
      throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${h}`), { code: 'ENOTFOUND' });
    });
    await p.start();
    expect(p.state().replicas).toEqual([
      expect.objectContaining({ id: '10.2.0.1:8000', up: true }),
      expect.objectContaining({ id: 'not-yet.test:8000', up: false }),
    ]);
    for (let i = 0; i < 8; i++) expect(p.pick(`r${i}`).id).toBe('10.2.0.1:8000');
  });
});

describe('upstream pool: names and membership', () => {
  it('resolves http:// names (auto), connects to https:// names and localhost by name, and never to addresses for resolve_names: never', async () => {
    const asked: string[] = [];
    const resolve = async (h: string) => (asked.push(h), ['10.3.0.1', '10.3.0.2']);
    const ids = async (url: string, resolveNames?: RoutingConfig['resolve_names']) => {
      const p = pool([url], { dns_refresh_ms: 0, ...(resolveNames ? { resolve_names: resolveNames } : {}) }, resolve);
      await p.start();
      return p.state().replicas.map((r) => r.id);
    };
    expect(await ids('http://vllm-headless.test:8000/v1')).toEqual(['10.3.0.1:8000', '10.3.0.2:8000']);
    expect(await ids('https://api.example.test/v1')).toEqual(['api.example.test:443']);
    expect(await ids('http://localhost:8000/v1')).toEqual(['localhost:8000']);
    expect(await ids('http://vllm-headless.test:8000/v1', 'never')).toEqual(['vllm-headless.test:8000']);
    expect(await ids('https://api.example.test/v1', 'always')).toEqual(['10.3.0.1:443', '10.3.0.2:443']);
    expect(asked).toEqual(['vllm-headless.test', 'api.example.test']);
  });

  it('one refresh at a time: calls while one runs share it', async () => {
    let calls = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const p = pool(['http://slow-dns.test:8000/v1'], { dns_refresh_ms: 0 }, async () => {
      calls++;
      await gate;
      return ['10.4.0.1'];
    });
    const all = Promise.all([p.refreshDns(), p.refreshDns(), p.refreshDns()]);
    release();
    await all;
    expect(calls).toBe(1);
    await p.refreshDns();
    expect(calls).toBe(2);
  });

  it('an address that leaves and comes back starts with no rollouts placed; those placed on it move when they call again', async () => {
    let answer = ['10.5.0.1', '10.5.0.2'];
    const metrics = createMetrics();
    const p = pool(['http://flappy.test:8000/v1'], { dns_refresh_ms: 0 }, async () => answer, metrics);
    await p.start();
    const homes = new Map<string, string>();
    for (let i = 0; i < 6; i++) {
      const r = p.pick(`r${i}`);
      homes.set(`r${i}`, r.id);
      p.release(r);
    }
    answer = ['10.5.0.1'];
    for (let i = 0; i < 3; i++) await p.refreshDns();
    expect(p.state().replicas.map((r) => r.id)).toEqual(['10.5.0.1:8000']);
    answer = ['10.5.0.1', '10.5.0.2'];
    await p.refreshDns();
    const placements = () => Object.fromEntries(p.state().replicas.map((r) => [r.id, r.placements]));
    expect(placements()).toEqual({ '10.5.0.1:8000': 3, '10.5.0.2:8000': 0 });
    expect(p.state().placements).toBe(3);
    for (const [key, home] of homes) {
      const r = p.pick(key);
      p.release(r);
      if (home === '10.5.0.1:8000') expect(r.id).toBe(home);
    }
    expect(placements()).toEqual({ '10.5.0.1:8000': 3, '10.5.0.2:8000': 3 });
    expect(await metricValue(metrics, 'lightning_sidecar_upstream_placement_moves_total', '{reason="replica_removed"}')).toBe(3);
  });

  it('a single replica is never marked down: there is nowhere else to go', () => {
    const p = pool(['http://10.6.0.1:8000/v1']);
    const r = p.pick('r');
    expect(p.failover('r', r, new Set([r]), Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }))).toBeNull();
    expect(p.state().replicas[0].up).toBe(true);
  });
});

describe('upstream pool: the replicas own load', () => {
  it('reads vLLM and SGLang gauges, summed over label sets', () => {
    const vllm = [
      '# HELP vllm:num_requests_running Number of requests in model execution batches.',
      '# TYPE vllm:num_requests_running gauge',
      'vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 7.0',
      'vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 5.0',
      'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0',
      'vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.42',
      'vllm:num_requests_running_total 99',
    ].join('\n');
    expect(serverLoad(vllm)).toEqual({ running: 12, waiting: 3, kvUsage: 0.42 });
    expect(serverLoad('sglang:num_running_reqs{model_name="m"} 4\nsglang:num_queue_reqs{model_name="m"} 2\nsglang:token_usage{model_name="m"} 0.5\n')).toEqual({
      running: 4,
      waiting: 2,
      kvUsage: 0.5,
    });
    expect(serverLoad('process_cpu_seconds_total 12\n')).toBeNull();
  });

  it("scrapes each replica's /metrics and places new rollouts away from a busy one", async () => {
    const servers: http.Server[] = [];
    const serve = async (running: number): Promise<number> => {
      const s = http.createServer((req, res) => {
        if (req.url === '/metrics') res.end(`vllm:num_requests_running{model_name="m"} ${running}\nvllm:num_requests_waiting{model_name="m"} 0\n`);
        else res.writeHead(404).end();
      });
      servers.push(s);
      await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
      return (s.address() as AddressInfo).port;
    };
    try {
      const busy = await serve(40);
      const idle = await serve(1);
      const p = pool([`http://127.0.0.1:${busy}/v1`, `http://127.0.0.1:${idle}/v1`], { scrape_interval_ms: 50 });
      await p.start();
      const until = Date.now() + 3000;
      while (p.list().some((r) => r.scraped === null) && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      expect(p.list().map((r) => r.scraped?.running)).toEqual([40, 1]);
      for (let i = 0; i < 6; i++) expect(p.pick(`r${i}`).id).toBe(`127.0.0.1:${idle}`);
    } finally {
      for (const s of servers) s.close();
    }
  });
});
