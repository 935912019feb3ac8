import http from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest } from '../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../support/sidecar';

// Several model-server replicas behind one sidecar (docs/routing.md): the agents are the real
// OpenAI SDK with retries off, so a call that succeeds was saved by the sidecar, not the client.

const TOKEN = 'routing-token-0123456789abcdef';

/** The rollout a request belongs to: each agent writes it into its user messages. */
function rolloutOf(r: ReceivedRequest): string | null {
  const messages = (r.json?.messages ?? []) as { content?: unknown }[];
  const m = /rollout=(\S+)/.exec(String(messages[0]?.content ?? ''));
  return m ? m[1] : null;
}

function chats(server: FakeModelServer): ReceivedRequest[] {
  return server.requests.filter((r) => r.path.startsWith('/v1/chat/completions'));
}

/** Which server got each rollout's calls (rollout → ports, in the rollout's order: its history grows by two messages a call). */
function placements(servers: FakeModelServer[]): Map<string, number[]> {
  const seen: { id: string; turn: number; port: number }[] = [];
  for (const s of servers)
    for (const r of chats(s)) {
      const id = rolloutOf(r);
      if (id !== null) seen.push({ id, turn: ((r.json?.messages as unknown[]) ?? []).length, port: s.port });
    }
  seen.sort((x, y) => x.turn - y.turn);
  const out = new Map<string, number[]>();
  for (const { id, port } of seen) out.set(id, [...(out.get(id) ?? []), port]);
  return out;
}

/** One agent: `calls` chat calls of one rollout, each after the last; `between` runs before each call after the first. */
async function agent(sidecar: TestSidecar, rollout: string, calls: number, between?: (i: number) => Promise<void>): Promise<string[]> {
  const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rollout}/v1`, apiKey: 'k', maxRetries: 0 });
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: `rollout=${rollout} hello` }];
  const answers: string[] = [];
  for (let i = 0; i < calls; i++) {
    if (i > 0) await between?.(i);
    const r = await client.chat.completions.create({ model: 'm', messages });
    answers.push(r.choices[0].message.content ?? '');
    messages.push({ role: 'assistant', content: r.choices[0].message.content ?? '' }, { role: 'user', content: `turn ${i + 1}` });
  }
  return answers;
}

async function metric(sidecar: TestSidecar, name: string, labels: string): Promise<number> {
  const text = await sidecar.app.metrics.registry.metrics();
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels}`));
  return line === undefined ? 0 : Number(line.split(' ').pop());
}

async function until(check: () => boolean | Promise<boolean>, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const routing = (extra: Record<string, unknown> = {}) => ({
  receivers: { llm_proxy: { routing: { probe_interval_ms: 100, scrape_interval_ms: 0, ...extra } } },
});

describe('routing over model-server replicas', () => {
  const servers: FakeModelServer[] = [];
  const sidecars: TestSidecar[] = [];
  async function replicas(n: number, options: Parameters<typeof startFakeModelServer>[0] = {}): Promise<FakeModelServer[]> {
    const started = await Promise.all(Array.from({ length: n }, () => startFakeModelServer({ flavor: 'openai', ...options })));
    servers.push(...started);
    return started;
  }
  async function sidecarFor(urls: string, overrides: Record<string, unknown> = {}, deps = {}): Promise<TestSidecar> {
    const s = await startSidecar(urls, overrides, deps);
    sidecars.push(s);
    return s;
  }
  afterEach(async () => {
    // Every request to a replica was counted out when it ended, whatever way it ended.
    for (const s of sidecars) await until(() => s.app.proxy.routing().replicas.every((r) => r.in_flight === 0), 3000, 'in-flight counts back to 0');
    for (const s of sidecars.splice(0)) await s.stop();
    for (const s of servers.splice(0)) await s.close();
  });

  it('sticky: every call of a rollout reaches one replica, rollouts spread evenly, and each transition names its replica', async () => {
    const rs = await replicas(3);
    // The idle timeout closes the episodes once the agents are done; long enough that a rollout
    // waiting for the others' first calls on a loaded machine is not closed early.
    const sidecar = await sidecarFor(rs.map((s) => s.url).join(','), { ...routing(), processors: { episodes: { idle_timeout_ms: 1500 } } });
    // Every rollout's first call is placed before any second call is in flight (which would count as load).
    let firsts = 0;
    let firstDone: () => void = () => {};
    const allFirst = new Promise<void>((resolve) => (firstDone = () => void (++firsts === 6 && resolve())));
    await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        agent(sidecar, `spread-${i}`, 4, async (call) => {
          if (call === 1) {
            firstDone();
            await allFirst;
          }
        }),
      ),
    );
    const placed = placements(rs);
    expect(placed.size).toBe(6);
    for (const ports of placed.values()) {
      expect(ports).toHaveLength(4);
      expect(new Set(ports).size).toBe(1);
    }
    // Six rollouts started together on three idle replicas: two each.
    expect(rs.map((s) => new Set(chats(s).map(rolloutOf)).size)).toEqual([2, 2, 2]);
    await sidecar.waitForEpisodes(6, 10_000);
    const transitions = sidecar.transitions();
    expect(transitions).toHaveLength(24);
    for (const t of transitions) expect(t.upstream_replica).toBe(`127.0.0.1:${placed.get(t.rollout_id)![0]}`);
    for (const s of rs) expect(await metric(sidecar, 'lightning_sidecar_upstream_replica_calls_total', `{replica="127.0.0.1:${s.port}"}`)).toBe(8);
    expect(await metric(sidecar, 'lightning_sidecar_upstream_placements', '')).toBe(6);
  });

  it('a replica killed mid-run: no call fails, its rollouts move, it is probed and used again when it is back', async () => {
    const turnOf = (r: ReceivedRequest) => ((r.json?.messages as unknown[]) ?? []).length;
    // The middle replica stops answering at each rollout's third call, and dies with those calls in flight.
    const rs = await Promise.all(
      [0, 1, 2].map((i) => startFakeModelServer({ flavor: 'openai', fault: (r) => (i === 1 && turnOf(r) >= 5 ? { kind: 'hang' } : null) })),
    );
    servers.push(...rs);
    const sidecar = await sidecarFor(rs.map((s) => s.url).join(','), routing());
    const victim = rs[1];
    const port = victim.port;
    const agents = Array.from({ length: 6 }, (_, i) => agent(sidecar, `kill-${i}`, 6));
    await until(() => chats(victim).some((r) => turnOf(r) >= 5), 5000, 'a call in flight on the victim');
    await victim.close();
    const results = await Promise.allSettled(agents);
    expect(results.filter((r) => r.status === 'rejected')).toEqual([]);
    // The calls that were in flight on it were answered by another replica: more requests than calls.
    expect(rs.reduce((n, s) => n + chats(s).length, 0)).toBeGreaterThan(36);
    // Each rollout the victim had began there and, once it moved (the call in flight at the kill
    // included), never came back: every call elsewhere is at a later turn than any it sent the victim.
    const moved = [...placements(rs).keys()].filter((id) => chats(victim).some((r) => rolloutOf(r) === id));
    expect(moved.length).toBe(2);
    for (const id of moved) {
      const on = (s: FakeModelServer) =>
        chats(s)
          .filter((r) => rolloutOf(r) === id)
          .map(turnOf);
      const there = on(victim);
      const elsewhere = [...on(rs[0]), ...on(rs[2])];
      expect(Math.min(...there)).toBe(1);
      expect(Math.min(...elsewhere)).toBeGreaterThanOrEqual(Math.max(...there));
      expect(new Set(elsewhere).size).toBe(elsewhere.length);
    }
    expect(await metric(sidecar, 'lightning_sidecar_upstream_replica_up', `{replica="127.0.0.1:${port}"}`)).toBe(0);
    expect(await metric(sidecar, 'lightning_sidecar_upstream_placement_moves_total', '{reason="replica_down"}')).toBe(moved.length);
    const ready = (await (await fetch(`${sidecar.telemetryOrigin}/readyz`)).json()) as { status: string; degraded: Record<string, string> };
    expect(ready.status).toBe('ready');
    expect(ready.degraded.upstream_replicas).toBe(`1 of 3 replicas down: 127.0.0.1:${port} (probed)`);

    // Back on the same port: the probe finds it, and new rollouts are placed on it again.
    const back = await startFakeModelServer({ flavor: 'openai', port });
    servers.push(back);
    await until(
      async () => (await metric(sidecar, 'lightning_sidecar_upstream_replica_up', `{replica="127.0.0.1:${port}"}`)) === 1,
      5000,
      'the replica to be probed back',
    );
    await Promise.all(Array.from({ length: 3 }, (_, i) => agent(sidecar, `after-${i}`, 1)));
    // Its old rollouts all moved away, so it has the fewest placed: a new rollout starts there.
    expect(chats(back).length).toBeGreaterThan(0);
    expect(chats(back).every((r) => rolloutOf(r)!.startsWith('after-'))).toBe(true);
  });

  it('a call whose answer had begun is not sent again: the agent gets the break', async () => {
    const rs = await replicas(2, { chunkDelayMs: 5, fault: (r) => (r.json?.stream === true ? { kind: 'reset-mid-stream', afterEvents: 2 } : null) });
    const sidecar = await sidecarFor(rs.map((s) => s.url).join(','), routing());
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/broken/v1`, apiKey: 'k', maxRetries: 0 });
    const read = async () => {
      const stream = await client.chat.completions.create({ model: 'm', stream: true, messages: [{ role: 'user', content: 'rollout=broken hi' }] });
      for await (const chunk of stream) void chunk;
    };
    await expect(read()).rejects.toThrow();
    expect(rs.reduce((n, s) => n + chats(s).length, 0)).toBe(1);
    // Bytes had reached the agent: the replica is not taken for down.
    for (const s of rs) expect(await metric(sidecar, 'lightning_sidecar_upstream_replica_up', `{replica="127.0.0.1:${s.port}"}`)).toBe(1);
  });

  it('a request that kills the replica reading it goes to one more replica, not to every one', async () => {
    const rs = await replicas(3, { fault: (r) => (rolloutOf(r) === 'poison' ? { kind: 'reset' } : null) });
    const sidecar = await sidecarFor(rs.map((s) => s.url).join(','), routing());
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/poison/v1`, apiKey: 'k', maxRetries: 0 });
    const failed = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'rollout=poison hi' }] }).catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(OpenAI.APIError);
    expect((failed as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    expect(rs.map((s) => chats(s).length).sort()).toEqual([0, 1, 1]);
    // The first replica it reached is down; the second, which it also killed, is not blamed for it.
    expect(sidecar.app.proxy.routing().replicas.filter((r) => !r.up)).toHaveLength(1);
    // The others still serve.
    expect(await agent(sidecar, 'healthy', 2)).toHaveLength(2);
  });

  it('an answer that came before the body ended, then the agent left: the upstream request is cut and counted out', async () => {
    // A server that answers 401 at once, without reading the body (as an auth layer does).
    const early = http.createServer((req, res) => res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":{"message":"no"}}'));
    await new Promise<void>((r) => early.listen(0, '127.0.0.1', r));
    const port = (early.address() as AddressInfo).port;
    const [other] = await replicas(1);
    try {
      const sidecar = await sidecarFor(`http://127.0.0.1:${port}/v1,${other.url}`, routing({ policy: 'round_robin' }));
      // Round-robin: the first call goes to the first URL.
      const status = await new Promise<number>((resolve, reject) => {
        const req = http.request(
          `${sidecar.origin}/rollout/early/v1/chat/completions`,
          { method: 'POST', headers: { 'content-type': 'application/json' } },
          (res) => {
            resolve(res.statusCode ?? 0);
            res.resume();
            // The agent leaves with its body unfinished.
            setTimeout(() => req.destroy(), 50);
          },
        );
        req.on('error', () => {});
        req.write('{"model":"m","messages":[');
        setTimeout(() => reject(new Error('no answer')), 3000).unref();
      });
      expect(status).toBe(401);
      await until(() => sidecar.app.proxy.routing().replicas.every((r) => r.in_flight === 0), 3000, 'the cut request to be counted out');
    } finally {
      early.close();
    }
  });

  it('a host name is re-resolved: a replica that appears in DNS takes new rollouts, with the name as its Host', async () => {
    const [a, b] = await replicas(2);
    let resolvable = false;
    const resolve = async (host: string): Promise<string[]> => {
      if (host === 'replica-b.test' && resolvable) return ['127.0.0.1'];
      throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    };
    const sidecar = await sidecarFor(`${a.url},http://replica-b.test:${b.port}/v1`, routing({ dns_refresh_ms: 100 }), { resolve });
    await Promise.all(Array.from({ length: 4 }, (_, i) => agent(sidecar, `dns-before-${i}`, 2)));
    expect(chats(a)).toHaveLength(8);
    expect(chats(b)).toHaveLength(0);

    resolvable = true;
    await until(() => sidecar.app.proxy.routing().replicas.some((r) => r.id === `127.0.0.1:${b.port}` && r.up), 5000, 'DNS to name the second replica');
    expect(sidecar.app.proxy.routing().replicas.map((r) => r.id)).not.toContain(`replica-b.test:${b.port}`);
    for (let i = 0; i < 4; i++) await agent(sidecar, `dns-after-${i}`, 2);
    // The new replica has none of the rollouts placed so far: new ones go there until it has as many.
    expect(new Set(chats(b).map(rolloutOf))).toEqual(new Set(['dns-after-0', 'dns-after-1', 'dns-after-2', 'dns-after-3']));
    expect(chats(b).every((r) => r.headers.host === `replica-b.test:${b.port}`)).toBe(true);
  });

  it('pause holds calls for every replica and resume releases them to their own replicas', async () => {
    const rs = await replicas(3);
    const sidecar = await sidecarFor(rs.map((s) => s.url).join(','), { ...routing(), service: { api_token: TOKEN } });
    const control = (body: unknown) =>
      fetch(`${sidecar.telemetryOrigin}/lightning/v1/control`, { method: 'POST', headers: { authorization: `Bearer ${TOKEN}` }, body: JSON.stringify(body) });
    await Promise.all(Array.from({ length: 3 }, (_, i) => agent(sidecar, `paused-${i}`, 1)));
    const home = placements(rs);
    expect(new Set([...home.values()].map((p) => p[0])).size).toBe(3);
    const before = rs.map((s) => chats(s).length);

    expect((await control({ type: 'pause', reason: 'weight-sync' })).status).toBe(200);
    const held = Array.from({ length: 3 }, (_, i) =>
      new OpenAI({ baseURL: `${sidecar.origin}/rollout/paused-${i}/v1`, apiKey: 'k', maxRetries: 0 }).chat.completions.create({
        model: 'm',
        messages: [{ role: 'user', content: `rollout=paused-${i} again` }],
      }),
    );
    await new Promise((r) => setTimeout(r, 300));
    expect(rs.map((s) => chats(s).length)).toEqual(before);
    expect((await control({ type: 'resume' })).status).toBe(200);
    await Promise.all(held);
    const after = placements(rs);
    for (const [id, ports] of after) expect(new Set(ports)).toEqual(new Set([home.get(id)![0]]));
  });

  it('config: several URLs as a list or comma-separated; mismatched paths and bad URLs are errors naming the setting', async () => {
    const { loadConfig } = await import('../../src/config/load');
    const list = loadConfig({ env: {}, overrides: { receivers: { llm_proxy: { upstream_url: ['http://a:8000/v1', 'http://b:8000/v1'] } } } });
    expect(list.receivers.llm_proxy.upstream_url).toBe('http://a:8000/v1,http://b:8000/v1');
    const env = loadConfig({ env: { LIGHTNING_UPSTREAM_URL: 'http://a:8000/v1, http://b:8000/v1', LIGHTNING_UPSTREAM_ROUTING: 'round_robin' } });
    expect(env.receivers.llm_proxy.upstream_url).toBe('http://a:8000/v1,http://b:8000/v1');
    expect(env.receivers.llm_proxy.routing.policy).toBe('round_robin');
    expect(() => loadConfig({ env: { LIGHTNING_UPSTREAM_URL: 'http://a:8000/v1,http://b:8000/v2' } })).toThrow(
      /receivers\.llm_proxy\.upstream_url.*every replica URL must have the same path/,
    );
    expect(() => loadConfig({ env: { LIGHTNING_UPSTREAM_URL: 'http://a:8000/v1,ftp://b/v1' } })).toThrow(
      /receivers\.llm_proxy\.upstream_url.*must start with http/,
    );
    // Credentials in a URL never reach the message.
    let message = '';
    try {
      loadConfig({ env: { LIGHTNING_UPSTREAM_URL: 'http://user:s3cret@a:8000/v1,ftp://u:pa55@b/v1' } });
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/'ftp:\/\/\*\*\*@b\/v1' must start with http/);
    expect(message).not.toMatch(/s3cret|pa55/);
    expect(() => loadConfig({ env: { LIGHTNING_UPSTREAM_ROUTING: 'hash' } })).toThrow(/receivers\.llm_proxy\.routing\.policy.*"sticky"/);
  });
});
