import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { detectUpstream, type UpstreamDetection } from './upstream-detect';
import { extend } from '../../model/extend';

export type ConfiguredFlavor = 'auto' | 'openai' | 'vllm' | 'sglang';
export type Flavor = 'openai' | 'vllm' | 'sglang';

/** What the sidecar knows about its model server, for logs, /readyz and the start-up line. */
export interface FlavorState {
  /** What fields are added for (`openai`: none). */
  flavor: Flavor;
  /** `config`: forced; `detected`: found by probing; `unknown`: not (yet) identified, nothing added. */
  source: 'config' | 'detected' | 'unknown';
  evidence: string;
  serverVersion: string | null;
  /** Set once the server refused an added field: the sidecar stopped adding fields. */
  rejected: string | null;
}

export interface UpstreamFlavorDeps {
  logger: Logger;
  metrics: Metrics;
  detect?: (baseUrl: string) => Promise<UpstreamDetection>;
  /** How often to probe again (the server may be restarted or replaced). */
  reprobeMs?: number;
  probeTimeoutMs?: number;
  /** How long a call waits for an identification under way when the server is not identified yet (0: never waits). */
  identifyWaitMs?: number;
  now?: () => number;
}

/** A call may start a new probe of a server nobody answered for at most this often. */
const CALL_PROBE_MS = 1000;

/**
 * Decides which fields the proxy adds for token ids. A configured `vllm`/`sglang`/`openai`
 * forces it; `auto` probes the model server's own endpoints, through every configured URL (a
 * replica down at start does not hide the others), at start, again periodically, and soon after
 * the server was unreachable (it may come back as something else). It adds nothing until vLLM or
 * SGLang is identified. While no URL has answered at all, a call starts a probe and waits for it
 * (up to `identifyWaitMs`), so the first calls after a start, or after the servers come up, carry
 * ids. A server that refuses an added field stops all adding for good (until restart), and is
 * reported.
 */
export class UpstreamFlavor {
  private s: FlavorState;
  private timer: NodeJS.Timeout | null = null;
  private probing: Promise<void> | null = null;
  private soon: NodeJS.Timeout | null = null;
  /** When the last probe ended, and whether any URL answered it (a server that answers and is not identified is not probed per call). */
  private lastProbe = { at: -Infinity, answered: true };
  private readonly log: Logger;
  private readonly now: () => number;

  constructor(
    private readonly configured: ConfiguredFlavor,
    private readonly baseUrls: readonly string[],
    private readonly deps: UpstreamFlavorDeps,
  ) {
    this.log = deps.logger.child('upstream');
    this.now = deps.now ?? Date.now;
    this.s =
      configured === 'auto'
        ? { flavor: 'openai', source: 'unknown', evidence: 'not probed yet', serverVersion: null, rejected: null }
        : { flavor: configured, source: 'config', evidence: 'receivers.llm_proxy.upstream_flavor', serverVersion: null, rejected: null };
    this.publish();
  }

  /** The flavor whose fields to add now (`openai`: add none). */
  current(): Flavor {
    return this.s.rejected ? 'openai' : this.s.flavor;
  }

  state(): FlavorState {
    return { ...this.s };
  }

  /**
   * What a call waits for before its fields are chosen: null when nothing (the flavor is
   * configured or identified, or the server answered and is not vLLM or SGLang); else an
   * identification under way (or one this call starts), bounded by `identifyWaitMs`.
   */
  identified(): Promise<void> | null {
    if (this.configured !== 'auto' || this.s.source !== 'unknown') return null;
    const wait = this.deps.identifyWaitMs ?? 5000;
    if (wait <= 0) return null;
    if (this.lastProbe.answered) return null;
    if (!this.probing) {
      if (this.now() - this.lastProbe.at < CALL_PROBE_MS) return null;
      void this.probe();
    }
    const probing = this.probing!;
    return new Promise<void>((resolve) => {
      const t = setTimeout(resolve, wait);
      t.unref();
      void probing.finally(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  /** First probe (bounded by the probe timeout), then periodic ones. */
  async start(): Promise<void> {
    if (this.configured !== 'auto') return;
    this.lastProbe.answered = false;
    await this.probe();
    this.timer = setInterval(() => void this.probe(), this.deps.reprobeMs ?? 60_000);
    this.timer.unref();
  }

  /** The model server could not be reached: probe again shortly (it may come back as another server). */
  unreachable(): void {
    if (this.configured !== 'auto' || this.soon) return;
    this.soon = setTimeout(() => {
      this.soon = null;
      void this.probe();
    }, 1000);
    this.soon.unref();
  }

  /** The model server refused a field the sidecar added: stop adding fields; say so once. */
  refused(field: string, detail: string): void {
    this.deps.metrics.injectionRefused.inc({ field });
    if (this.s.rejected) return;
    this.s.rejected = `${field}: ${detail}`;
    this.log.warn(
      'the model server refused a field the sidecar adds for token ids; no more fields are added (calls are served, transitions have no token ids)',
      { field, detail, flavor: this.s.flavor },
    );
    this.publish();
  }

  shutdown(): void {
    if (this.timer) clearInterval(this.timer);
    if (this.soon) clearTimeout(this.soon);
  }

  private probe(): Promise<void> {
    this.probing ??= (async () => {
      const detect = this.deps.detect ?? ((url: string) => detectUpstream(url, { timeoutMs: this.deps.probeTimeoutMs ?? 2000 }));
      const found = await Promise.all(
        this.baseUrls.map((url) => detect(url).catch((err: Error): UpstreamDetection => ({ flavor: 'unknown', evidence: err.message, serverVersion: null }))),
      );
      // The first URL that shows vLLM or SGLang, else the first that answered as another server.
      const at =
        [found.findIndex((d) => d.flavor === 'vllm' || d.flavor === 'sglang'), found.findIndex((d) => d.flavor === 'openai')].find((i) => i >= 0) ?? -1;
      const d: UpstreamDetection =
        at >= 0
          ? extend(found[at], { evidence: this.baseUrls.length > 1 ? `${shownUrl(this.baseUrls[at])}: ${found[at].evidence}` : found[at].evidence })
          : {
              flavor: 'unknown',
              evidence: found.map((x, i) => (this.baseUrls.length > 1 ? `${shownUrl(this.baseUrls[i])}: ${x.evidence}` : x.evidence)).join('; '),
              serverVersion: null,
              answered: found.some((x) => x.answered !== false),
            };
      this.lastProbe = { at: this.now(), answered: at >= 0 || d.answered !== false };
      const before = this.s;
      const known = d.flavor === 'vllm' || d.flavor === 'sglang' || d.flavor === 'openai';
      // A server that stops answering keeps what was found; a different answer replaces it.
      if (!known && before.source === 'detected') return;
      this.s = {
        flavor: known ? (d.flavor as Flavor) : 'openai',
        source: known ? 'detected' : 'unknown',
        evidence: d.evidence,
        serverVersion: d.serverVersion,
        rejected: before.rejected,
      };
      if (before.flavor !== this.s.flavor || before.source !== this.s.source) {
        this.log.info(known ? `model server identified as ${d.flavor}` : 'model server not identified; no fields are added for token ids', {
          flavor: this.s.flavor,
          source: this.s.source,
          evidence: d.evidence,
          server_version: d.serverVersion,
          upstream: at >= 0 ? shownUrl(this.baseUrls[at]) : this.baseUrls.map(shownUrl).join(','),
        });
      }
      this.publish();
    })().finally(() => (this.probing = null));
    return this.probing;
  }

  private publish(): void {
    const g = this.deps.metrics.upstreamFlavor;
    g.reset();
    g.set({ flavor: this.s.flavor, source: this.s.source, adding_fields: this.current() === 'openai' ? 'false' : 'true' }, 1);
  }
}

/** A URL as logs may show it: without credentials. */
function shownUrl(u: string): string {
  return u.replace(/\/\/[^/@]*@/, '//***@');
}
