import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { detectUpstream, type UpstreamDetection } from './upstream-detect';

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
}

/**
 * Decides which fields the proxy adds for token ids. A configured `vllm`/`sglang`/`openai`
 * forces it; `auto` probes the model server's own endpoints at start, again periodically and
 * soon after the server was unreachable (it may come back as something else), and adds nothing
 * until vLLM or SGLang is identified. A server that refuses an added field stops all adding
 * for good (until restart), and is reported.
 */
export class UpstreamFlavor {
  private s: FlavorState;
  private timer: NodeJS.Timeout | null = null;
  private probing: Promise<void> | null = null;
  private soon: NodeJS.Timeout | null = null;
  private readonly log: Logger;

  constructor(
    private readonly configured: ConfiguredFlavor,
    private readonly baseUrl: string,
    private readonly deps: UpstreamFlavorDeps,
  ) {
    this.log = deps.logger.child('upstream');
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

  /** First probe (bounded by the probe timeout), then periodic ones. */
  async start(): Promise<void> {
    if (this.configured !== 'auto') return;
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
      const d = await detect(this.baseUrl).catch((err: Error): UpstreamDetection => ({ flavor: 'unknown', evidence: err.message, serverVersion: null }));
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
          upstream: this.baseUrl,
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
