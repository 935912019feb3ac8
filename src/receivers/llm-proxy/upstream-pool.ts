import dns from 'node:dns';
import net from 'node:net';
import type { RoutingConfig } from '../../config/schema';
import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { UpstreamClient, type UpstreamRequest } from './upstream-client';
import { extend } from '../../model/extend';

/**
 * The model-server replicas calls go to, and which replica serves which call (docs/routing.md).
 *
 * Replicas come from `upstream_url`: one URL or several; a host name may be resolved to all its
 * addresses (a Kubernetes headless Service names every pod), again every `dns_refresh_ms`.
 * Calls carry a key, the rollout they belong to: under the `sticky` policy a rollout's first
 * call goes to the least loaded replica and its later calls follow it there, so the server finds
 * the conversation's prefix in its cache. A placement moves when its replica is down, gone from
 * DNS, or loaded past `overload_factor` × the mean. Load is what the sidecar sees: its own calls
 * in flight per replica and, where the server exposes them on `/metrics`, the replica's running
 * and waiting requests (vLLM, SGLang).
 *
 * With several replicas, one that refuses a connection, or drops one before answering a byte, is
 * marked down and the call is sent to another (upstream-client.ts keeps the request's bytes until
 * the answer begins); a down replica is probed (`GET /health`) until it answers again.
 */

/** One model-server address. */
export interface Replica {
  /** `address:port` (or `name:port` when connected to by name): the metric label and the transition's `upstream_replica`. */
  readonly id: string;
  readonly client: UpstreamClient;
  up: boolean;
  /** Calls in flight through this sidecar. */
  inFlight: number;
  /** Rollouts placed on it. */
  placements: number;
  /** Still named by the configuration / DNS. */
  listed: boolean;
  /** Consecutive DNS refreshes that did not name it. */
  missing: number;
  /** A host name that did not resolve, kept to connect by name: down while other replicas serve, never probed. */
  unresolved: boolean;
  /** The replica's own load, from its `/metrics`; null when unknown. */
  scraped: { running: number; waiting: number; kvUsage: number; at: number } | null;
  /** When its next scrape may be tried (a server without /metrics is asked rarely). */
  scrapeAfter: number;
  probe: NodeJS.Timeout | null;
  /** Requests sent to it, and how many of them the metric has: counted as plain numbers on the call path, published when read. */
  calls: number;
  published: number;
}

/** One configured URL. */
interface Target {
  hostname: string;
  port: number;
  secure: boolean;
  /** The Host header (`host[:port]` as written in the URL). */
  hostHeader: string;
  /** Connected to by name, never resolved here (an address, localhost, or a name resolve_names leaves alone). */
  byName: boolean;
}

export type MoveReason = 'replica_down' | 'overloaded' | 'replica_removed';

export interface UpstreamPoolDeps {
  logger: Logger;
  metrics: Metrics;
  /** Resolves a host name to its addresses (tests replace DNS). */
  resolve?: (hostname: string) => Promise<string[]>;
  now?: () => number;
}

/** An address DNS stops naming leaves after this many refreshes without it (answers that rotate addresses do not churn connections). */
const DNS_MISSES_TO_REMOVE = 3;
/** A scrape older than this many intervals is not trusted. */
const SCRAPE_FRESH_INTERVALS = 3;
/** A replica whose /metrics could not be read is asked again after this long. */
const SCRAPE_BACKOFF_MS = 60_000;
const PROBE_TIMEOUT_MS = 2000;
/** Request bytes kept for a resend with a single replica (a reused connection the server had closed). */
const SINGLE_RETRY_BYTES = 256 * 1024;

export class UpstreamPool {
  /** Path prefix every replica URL shares (e.g. `/v1`). */
  readonly basePath: string;
  /** The first URL's Host, for messages about the upstream as a whole. */
  readonly host: string;
  private readonly targets: Target[];
  private readonly replicas = new Map<string, Replica>();
  /** Rollout key → replica id, least recently used first. */
  private readonly placed = new Map<string, string>();
  /** Rollouts whose replica left: their next call is a move (`replica_removed`), not a first placement. */
  private readonly orphaned = new Set<string>();
  private turn = 0;
  /** The replica when there is exactly one (every call goes there). */
  private only: Replica | null = null;
  private timers: NodeJS.Timeout[] = [];
  private refreshing: Promise<void> | null = null;
  private resolvedOnce = false;
  private closed = false;
  private readonly log: Logger;
  private readonly resolve: (hostname: string) => Promise<string[]>;
  private readonly now: () => number;

  constructor(
    urls: readonly string[],
    private readonly routing: RoutingConfig,
    private readonly deps: UpstreamPoolDeps,
  ) {
    this.log = deps.logger.child('upstream');
    this.resolve = deps.resolve ?? resolveAll;
    this.now = deps.now ?? Date.now;
    this.targets = urls.map((u) => parseTarget(u, routing.resolve_names));
    deps.metrics.upstreamCollectors.add(this.publishCounts);
    const first = new URL(urls[0]);
    this.basePath = first.pathname.replace(/\/+$/, '');
    this.host = first.host;
    // Until a name resolves, its replica connects by name (as one URL always did).
    for (const t of this.targets) this.add(t, t.hostname).unresolved = !t.byName;
    this.membershipChanged();
  }

  /** Resolves host names, then keeps resolving and scraping. */
  async start(): Promise<void> {
    await this.refreshDns();
    if (this.closed) return;
    if (this.targets.some((t) => !t.byName)) this.every(this.routing.dns_refresh_ms, () => this.refreshDns());
    this.every(this.routing.scrape_interval_ms, () => this.scrapeAll());
  }

  /** Runs `fn` every `ms` (with up to 10 % jitter, so sidecars started together do not ask in step), each run after the last ended. */
  private every(ms: number, fn: () => Promise<void> | void): void {
    if (ms <= 0) return;
    const schedule = (): void => {
      if (this.closed) return;
      const t = setTimeout(
        () => {
          this.timers = this.timers.filter((x) => x !== t);
          void Promise.resolve(fn()).finally(schedule);
        },
        ms + Math.random() * ms * 0.1,
      );
      t.unref();
      this.timers.push(t);
    };
    schedule();
  }

  close(): void {
    this.closed = true;
    this.deps.metrics.upstreamCollectors.delete(this.publishCounts);
    for (const t of this.timers) clearTimeout(t);
    this.timers = [];
    for (const r of this.replicas.values()) {
      if (r.probe) clearTimeout(r.probe);
      r.client.close();
    }
  }

  list(): Replica[] {
    return [...this.replicas.values()];
  }

  /**
   * The replica for a call of rollout `key` (null: not part of a rollout), counted in flight until
   * `release`. Under `sticky`, the call follows its rollout's placement.
   */
  pick(key: string | null): Replica {
    let r: Replica;
    if (this.only !== null) r = this.only;
    else {
      const live = this.live();
      const policy = this.routing.policy;
      if (policy === 'round_robin') r = live[this.turn++ % live.length];
      else if (policy === 'random') r = live[Math.floor(Math.random() * live.length)];
      else r = key === null ? this.leastLoaded(live, null) : this.sticky(key, live);
    }
    this.started(r);
    return r;
  }

  /**
   * `from` failed the call before answering a byte: it is marked down and the call (and its
   * rollout) moves to another replica not yet `tried`; null when none is left (a single replica
   * is never marked down: there is nowhere else to go).
   */
  failover(key: string | null, from: Replica, tried: ReadonlySet<Replica>, err: Error): Replica | null {
    if (this.listedCount() < 2) return null;
    this.down(from, err);
    const rest = this.list().filter((r) => r.up && r.listed && !tried.has(r));
    if (rest.length === 0) return null;
    this.release(from);
    const to = this.leastLoaded(rest, null);
    if (key !== null && this.routing.policy === 'sticky' && this.placed.get(key) === from.id) this.place(key, to, 'replica_down');
    this.started(to);
    return to;
  }

  /** The call on `r` ended. */
  release(r: Replica): void {
    r.inFlight--;
    if (!r.listed && r.inFlight === 0) this.retire(r);
  }

  /** Calls and calls in flight per replica, onto their metrics (when the metrics are read). */
  private readonly publishCounts = (): void => {
    const m = this.deps.metrics;
    for (const r of this.replicas.values()) {
      if (r.calls > r.published) m.upstreamCalls.inc({ replica: r.id }, r.calls - r.published);
      else if (r.calls === 0) m.upstreamCalls.inc({ replica: r.id }, 0);
      r.published = r.calls;
      m.upstreamInFlight.set({ replica: r.id }, r.inFlight);
    }
  };

  /** What routing knows now (for /readyz and tests). */
  state(): { policy: string; placements: number; replicas: { id: string; up: boolean; unresolved: boolean; in_flight: number; placements: number }[] } {
    return {
      policy: this.routing.policy,
      placements: this.placed.size,
      replicas: this.list()
        .filter((r) => r.listed)
        .map((r) => ({ id: r.id, up: r.up, unresolved: r.unresolved, in_flight: r.inFlight, placements: r.placements })),
    };
  }

  // ---- placement ----

  private sticky(key: string, live: Replica[]): Replica {
    const id = this.placed.get(key);
    const at = id === undefined ? undefined : this.replicas.get(id);
    if (at && at.up && at.listed) {
      if (!this.overloaded(at, live)) {
        // Most recently used last: the map's first keys are the ones to forget.
        this.placed.delete(key);
        this.placed.set(key, at.id);
        return at;
      }
      const to = this.leastLoaded(live, at);
      if (to !== at) this.place(key, to, 'overloaded');
      return to;
    }
    const to = this.leastLoaded(live, null);
    const orphan = this.orphaned.delete(key);
    this.place(key, to, at?.listed ? 'replica_down' : at || orphan || id !== undefined ? 'replica_removed' : null);
    return to;
  }

  /** Placed on `to` (moved there when it was placed elsewhere: `reason`). */
  private place(key: string, to: Replica, reason: MoveReason | null): void {
    const was = this.placed.get(key);
    if (was !== undefined) {
      this.placed.delete(key);
      const from = this.replicas.get(was);
      if (from) from.placements--;
    }
    if (reason !== null && was !== to.id) this.deps.metrics.upstreamMoves.inc({ reason });
    else if (was === undefined) this.deps.metrics.upstreamPlacementsMade.inc();
    this.placed.set(key, to.id);
    to.placements++;
    while (this.placed.size > this.routing.max_placements) {
      const [oldest, id] = this.placed.entries().next().value as [string, string];
      this.placed.delete(oldest);
      const r = this.replicas.get(id);
      if (r) r.placements--;
    }
    this.deps.metrics.upstreamPlacements.set(this.placed.size);
  }

  /** Least load, then fewest rollouts placed, then the one after the last chosen (so ties spread). */
  private leastLoaded(candidates: Replica[], avoid: Replica | null): Replica {
    let best: Replica | null = null;
    let bestLoad = Infinity;
    const start = this.turn++;
    for (let i = 0; i < candidates.length; i++) {
      const r = candidates[(start + i) % candidates.length];
      if (r === avoid && candidates.length > 1) continue;
      const load = this.load(r);
      if (best === null || load < bestLoad || (load === bestLoad && r.placements < best.placements)) {
        best = r;
        bestLoad = load;
      }
    }
    return best ?? candidates[0];
  }

  /** Calls in flight through this sidecar, or the replica's own count when it is larger (other sidecars' calls). */
  private load(r: Replica): number {
    const s = r.scraped;
    const fresh = s !== null && this.now() - s.at <= SCRAPE_FRESH_INTERVALS * this.routing.scrape_interval_ms;
    return fresh ? Math.max(r.inFlight, s.running + s.waiting) + s.kvUsage : r.inFlight;
  }

  private overloaded(r: Replica, live: Replica[]): boolean {
    if (live.length < 2) return false;
    let total = 0;
    for (const x of live) total += this.load(x);
    const mean = total / live.length;
    return this.load(r) >= Math.max(this.routing.overload_min_load, this.routing.overload_factor * mean);
  }

  /** Replicas to use: the ones up, or (all down) every listed one, since one may be back. */
  private live(): Replica[] {
    const listed = this.list().filter((r) => r.listed);
    const up = listed.filter((r) => r.up);
    return up.length > 0 ? up : listed;
  }

  private listedCount(): number {
    let n = 0;
    for (const r of this.replicas.values()) if (r.listed) n++;
    return n;
  }

  private started(r: Replica): void {
    r.inFlight++;
    r.calls++;
  }

  // ---- membership ----

  private add(t: Target, address: string): Replica {
    const id = replicaId(address, t.port);
    const known = this.replicas.get(id);
    if (known) {
      if (!known.listed) {
        known.listed = true;
        // Down when it left: probed again now that it is back.
        if (!known.up && known.probe === null) this.scheduleProbe(known);
      }
      return known;
    }
    const client = new UpstreamClient(
      { hostname: address, port: t.port, secure: t.secure, hostHeader: t.hostHeader, servername: t.byName ? undefined : t.hostname },
      { retryBytes: SINGLE_RETRY_BYTES },
    );
    const r: Replica = {
      id,
      client,
      up: true,
      inFlight: 0,
      placements: 0,
      listed: true,
      missing: 0,
      unresolved: false,
      scraped: null,
      scrapeAfter: 0,
      probe: null,
      calls: 0,
      published: 0,
    };
    this.replicas.set(id, r);
    return r;
  }

  /** Re-resolves every host name: new addresses join, vanished ones leave once their calls end. One refresh at a time. */
  refreshDns(): Promise<void> {
    this.refreshing ??= this.resolveAndApply().finally(() => (this.refreshing = null));
    return this.refreshing;
  }

  private async resolveAndApply(): Promise<void> {
    const wanted = new Map<string, { t: Target; address: string; unresolved: boolean }>();
    /** Names (Host headers) that resolved this time. */
    const answered = new Set<string>();
    for (const t of this.targets) {
      if (t.byName) {
        wanted.set(replicaId(t.hostname, t.port), { t, address: t.hostname, unresolved: false });
        continue;
      }
      let addresses: string[];
      try {
        addresses = await this.resolve(t.hostname);
      } catch (err) {
        this.log.once(`dns:${t.hostname}`, 'warn', 'could not resolve an upstream host name; tried again every dns_refresh_ms', { host: t.hostname, err });
        addresses = [];
      }
      if (addresses.length > 0) answered.add(t.hostHeader);
      for (const address of addresses) wanted.set(replicaId(address, t.port), { t, address, unresolved: false });
      // Nothing resolved and nothing known for this name: the name itself, connected to by name.
      const known = this.list().some((r) => r.listed && !r.unresolved && r.client.origin.hostHeader === t.hostHeader);
      if (addresses.length === 0 && !known) wanted.set(replicaId(t.hostname, t.port), { t, address: t.hostname, unresolved: true });
    }
    if (this.closed) return;
    const before = this.listedIds();
    for (const { t, address, unresolved } of wanted.values()) {
      const r = this.add(t, address);
      r.missing = 0;
      r.unresolved = unresolved;
      if (unresolved && wanted.size > 1) r.up = false;
    }
    for (const r of this.list()) {
      if (wanted.has(r.id) || !r.listed) continue;
      // A name that resolved to nothing this time keeps its addresses; one that moved drops them after a few refreshes.
      const name = r.client.origin.hostHeader ?? '';
      if (!r.unresolved && (!answered.has(name) || ++r.missing < DNS_MISSES_TO_REMOVE)) continue;
      r.listed = false;
      if (r.inFlight === 0) this.retire(r);
    }
    const after = this.listedIds();
    const added = after.filter((id) => !before.includes(id));
    const removed = before.filter((id) => !after.includes(id));
    // The first resolution of a single name is not news; a name that became several replicas, or any later change, is.
    if ((added.length > 0 || removed.length > 0) && (this.resolvedOnce || after.length > 1))
      this.log.info('upstream replicas changed', { replicas: after, added, removed });
    this.resolvedOnce = true;
    this.membershipChanged();
  }

  private listedIds(): string[] {
    return this.list()
      .filter((r) => r.listed)
      .map((r) => r.id);
  }

  /** Gone from the configuration / DNS and idle: closed; its rollouts move on their next call. */
  private retire(r: Replica): void {
    if (r.probe) clearTimeout(r.probe);
    r.client.close();
    this.replicas.delete(r.id);
    for (const [key, id] of this.placed) {
      if (id !== r.id) continue;
      this.placed.delete(key);
      this.orphaned.add(key);
    }
    // Bounded: rollouts that never call again are forgotten with the oldest.
    if (this.orphaned.size > this.routing.max_placements) this.orphaned.clear();
    this.deps.metrics.upstreamPlacements.set(this.placed.size);
    const m = this.deps.metrics;
    m.upstreamUp.remove({ replica: r.id });
    m.upstreamInFlight.remove({ replica: r.id });
    m.upstreamCalls.remove({ replica: r.id });
    this.membershipChanged();
  }

  /** Replicas came or went: how much of a request is kept for failover, and the up gauges. */
  private membershipChanged(): void {
    const several = this.listedCount() > 1;
    this.only = this.replicas.size === 1 ? (this.replicas.values().next().value as Replica) : null;
    for (const r of this.replicas.values()) r.client.retryBytes = several ? this.routing.failover_body_bytes : SINGLE_RETRY_BYTES;
    this.publish();
  }

  // ---- health ----

  private down(r: Replica, err: Error): void {
    if (!r.up) return;
    r.up = false;
    r.scraped = null;
    this.log.warn('upstream replica down; its rollouts move to the other replicas until it answers again', {
      replica: r.id,
      code: (err as NodeJS.ErrnoException).code ?? err.message,
    });
    this.publish();
    this.scheduleProbe(r);
  }

  private scheduleProbe(r: Replica): void {
    // An unresolved name is the DNS refresh's to bring back.
    if (this.closed || !r.listed || r.unresolved) return;
    r.probe = setTimeout(() => {
      r.probe = null;
      void this.get(r, `${rootOf(this.basePath)}/health`).then((got) => {
        if (this.closed || this.replicas.get(r.id) !== r) return;
        if (got !== null && got.status < 500) {
          r.up = true;
          this.log.info('upstream replica back', { replica: r.id });
          this.publish();
        } else this.scheduleProbe(r);
      });
    }, this.routing.probe_interval_ms);
    r.probe.unref();
  }

  private scrapeAll(): void {
    if (this.closed || this.listedCount() < 2) return;
    const now = this.now();
    for (const r of this.replicas.values()) {
      if (!r.up || !r.listed || now < r.scrapeAfter) continue;
      r.scrapeAfter = now + this.routing.scrape_interval_ms;
      void this.get(r, `${rootOf(this.basePath)}/metrics`, 1024 * 1024).then((got) => {
        const load = got !== null && got.status === 200 ? serverLoad(got.body) : null;
        if (load === null) {
          r.scraped = null;
          r.scrapeAfter = this.now() + SCRAPE_BACKOFF_MS;
          return;
        }
        r.scraped = extend(load, { at: this.now() });
      });
    }
  }

  /** A small GET to a replica (on one of its idle connections); null when it got no answer. */
  private get(r: Replica, path: string, limit = 64 * 1024): Promise<{ status: number; body: string } | null> {
    return new Promise((resolve) => {
      const req: UpstreamRequest = r.client.request({ method: 'GET', path, headers: ['accept', '*/*'] });
      req.setTimeout(PROBE_TIMEOUT_MS, () => req.destroy(new Error('probe timeout')));
      req.on('error', () => resolve(null));
      req.on('response', (res) => {
        const parts: Buffer[] = [];
        let bytes = 0;
        res.on('data', (c: Buffer) => {
          bytes += c.length;
          if (bytes <= limit) parts.push(c);
        });
        res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString('utf8') }));
        res.on('close', () => resolve(null));
      });
      req.end();
    });
  }

  private publish(): void {
    const m = this.deps.metrics;
    for (const r of this.replicas.values()) if (r.listed) m.upstreamUp.set({ replica: r.id }, r.up ? 1 : 0);
  }
}

function replicaId(address: string, port: number): string {
  return `${address.includes(':') ? `[${address}]` : address}:${port}`;
}

function parseTarget(url: string, resolveNames: RoutingConfig['resolve_names']): Target {
  const u = new URL(url);
  const secure = u.protocol === 'https:';
  const hostname = u.hostname.replace(/^\[|\]$/g, '');
  const local = hostname === 'localhost' || hostname.endsWith('.localhost');
  // auto: in-cluster model servers speak plain HTTP; an https endpoint is a service behind its own balancer.
  const resolve = resolveNames === 'always' || (resolveNames === 'auto' && !secure && !local);
  return { hostname, port: u.port ? Number(u.port) : secure ? 443 : 80, secure, hostHeader: u.host, byName: net.isIP(hostname) !== 0 || !resolve };
}

/** Every address of a name; IPv4 ones when it has both (a dual-stack Service is one replica per pod, not two). */
async function resolveAll(hostname: string): Promise<string[]> {
  const all = await dns.promises.lookup(hostname, { all: true });
  const v4 = all.filter((a) => a.family === 4).map((a) => a.address);
  return [...new Set(v4.length > 0 ? v4 : all.map((a) => a.address))];
}

/** The server's root: the upstream path without its `/v1`. */
export function rootOf(basePath: string): string {
  return basePath.replace(/\/v1$/, '');
}

/**
 * A replica's own load from its Prometheus text: running and waiting requests and KV-cache use
 * (0–1), summed over its label sets (vLLM: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
 * `vllm:kv_cache_usage_perc` or the older `vllm:gpu_cache_usage_perc`; SGLang: `sglang:num_running_reqs`,
 * `sglang:num_queue_reqs`, `sglang:token_usage`); null when it names none of them.
 */
export function serverLoad(text: string): { running: number; waiting: number; kvUsage: number } | null {
  let running = 0;
  let waiting = 0;
  let kvUsage = 0;
  let seen = false;
  for (const line of text.split('\n')) {
    if (line.length === 0 || line.charCodeAt(0) === 35 /* # */) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+([-+0-9.eEnaNIf]+)/.exec(line);
    if (!m) continue;
    const v = Number(m[2]);
    if (!Number.isFinite(v)) continue;
    switch (m[1]) {
      case 'vllm:num_requests_running':
      case 'sglang:num_running_reqs':
        running += v;
        seen = true;
        break;
      case 'vllm:num_requests_waiting':
      case 'sglang:num_queue_reqs':
        waiting += v;
        seen = true;
        break;
      case 'vllm:kv_cache_usage_perc':
      case 'vllm:gpu_cache_usage_perc':
      case 'sglang:token_usage':
        kvUsage = Math.max(kvUsage, v);
        seen = true;
        break;
    }
  }
  return seen ? { running, waiting, kvUsage } : null;
}
