import { isEncoded, NO_JOURNAL, type Exporter, type ExportItem } from '../exporters/exporter';
import { trajectoryJsonParts } from '../exporters/trajectory-json';
import { TransitionWriter } from '../exporters/transition-json';
import type { BodyReader } from '../formats/extract';
import { readIntArray, topLevelMembers } from '../formats/json-scan';
import type { ClosedEpisode, TransitionRecord } from '../model/records';
import type { OpenEpisodeView } from '../processors/episodes/assembler';
import type { Logger } from '../telemetry/logger';
import type { Metrics } from '../telemetry/metrics';
import { ClosedRing, type ClosedEntry } from './closed-ring';
import { TokenDecoder } from './decoder';

/**
 * The viewer's data (docs/operations.md#the-viewer): open episodes asked of the assembler, gauges
 * asked of the metrics registry, and the recently closed episodes, whose trajectories it reads from
 * the journal while they are exported (the exporter is wrapped: `tap`). It keeps closed episodes
 * only while somebody looks (a page polled within `idleMs`): with nobody looking, a closed episode
 * costs the viewer one clock read, and the proxy's path none at all.
 */
export interface ViewerOptions {
  maxBytes: number;
  idleMs: number;
  /** The model's tokenizer files, to show tokens as text (`token_in.tokenizer_dir`). */
  tokenizerDir: string | null;
}

export interface ViewerDeps {
  metrics: Metrics;
  logger: Logger;
  open: () => OpenEpisodeView[];
  now?: () => number;
}

export class Viewer {
  readonly ring: ClosedRing;
  private lastLook = -Infinity;
  private readonly now: () => number;
  private decoder: TokenDecoder | null | undefined = undefined;
  /** Bodies are read into it while an episode is read for the viewer (one allocation, not one per body). */
  private readonly arena = Buffer.allocUnsafeSlow(1 << 20);

  constructor(
    private readonly options: ViewerOptions,
    private readonly deps: ViewerDeps,
  ) {
    this.ring = new ClosedRing(options.maxBytes);
    this.now = deps.now ?? Date.now;
  }

  /** Somebody looked (a page or its data was asked for). */
  looked(): void {
    this.lastLook = this.now();
  }

  /** Closed episodes are kept while somebody has looked within `idleMs`. */
  get watching(): boolean {
    return this.now() - this.lastLook < this.options.idleMs;
  }

  /** The exporter, with closed episodes read for the viewer before each export while somebody looks. */
  tap(inner: Exporter): Exporter {
    const tapped: Exporter = {
      name: inner.name,
      start: () => inner.start(),
      shutdown: () => inner.shutdown(),
      export: async (batch: ExportItem[], read?: BodyReader) => {
        const seen = this.watching ? this.keep(batch, read ?? NO_JOURNAL) : [];
        try {
          await inner.export(batch, read);
        } catch (err) {
          for (const e of seen) [e.export, e.exportError] = ['retrying', (err as Error).message];
          throw err;
        }
        for (const e of seen) [e.export, e.exportError] = ['delivered', null];
      },
    };
    if (inner.encodeAhead) tapped.encodeAhead = inner.encodeAhead.bind(inner);
    return tapped;
  }

  /** Reads the batch's closed episodes into the ring; a failure here never fails the export. */
  private keep(batch: ExportItem[], read: BodyReader): ClosedEntry[] {
    const out: ClosedEntry[] = [];
    const writer = new TransitionWriter(read, this.arena);
    for (const item of batch) {
      if (isEncoded(item)) continue;
      try {
        out.push(this.entry(item, writer));
      } catch (err) {
        this.deps.logger.once('viewer_read', 'warn', 'the viewer could not read a closed episode; its export goes on', { err });
      }
    }
    for (const e of out) this.ring.add(e);
    return out;
  }

  private entry(c: ClosedEpisode, writer: TransitionWriter): ClosedEntry {
    const e = c.episode;
    const key = `${e.rollout_id}\u0000${e.attempt_id}\u0000${e.ended_at}`;
    const existing = this.ring.get(key);
    if (existing) return existing;
    const byId = new Map(c.transitions.map((t) => [t.transition_id, t]));
    const agents = new Set<string>();
    const withText = this.options.tokenizerDir === null;
    const trajectories = c.trajectories.map((t) => {
      if (t.agent_name) agents.add(t.agent_name);
      // The trajectory as exported, less routing rows and mask ids; each call's answer as recorded
      // when tokens cannot be shown as text.
      const json = Buffer.concat(trajectoryJsonParts(writer, t, false).map((p) => (typeof p === 'string' ? Buffer.from(p) : p)));
      writer.reuseArena();
      const said = withText ? t.turns.map((u) => turnText(byId.get(u.transition_id), writer)) : null;
      return { trajectory_id: t.trajectory_id, segment: t.segment, start_reason: t.start_reason, tokens: t.length, json, turnText: said };
    });
    const bytes = trajectories.reduce((n, t) => n + t.json.length + (t.turnText ?? []).reduce((m, x) => m + 2 * (x?.length ?? 0), 0), 1024);
    return {
      key,
      episode: e,
      agents: [...agents],
      tokens: trajectories.reduce((n, t) => n + t.tokens, 0),
      trajectories,
      export: 'exporting',
      exportError: null,
      bytes,
    };
  }

  /**
   * One trajectory as the page reads it: the exported JSON (routing rows and mask ids left out),
   * each token's text when the tokenizer files are known (decoded now, when somebody asks), else
   * each call's answer as recorded; and its episode.
   */
  trajectory(id: string): Buffer | null {
    const found = this.ring.trajectory(id);
    if (found === null) return null;
    const { entry, trajectory } = found;
    // Spliced, not parsed: a trajectory's JSON is hundreds of KB, and a page asks for it whole.
    const json = trajectory.json;
    let extra = '';
    const decoder = this.tokenDecoder();
    if (decoder) {
      const at = topLevelMembers(json)?.get('token_ids');
      const ids = at ? readIntArray(json, at[0], at[1]) : null;
      if (ids) extra = `,"token_text":${JSON.stringify(decoder.pieces(ids))}`;
    } else if (trajectory.turnText) extra = `,"turn_text":${JSON.stringify(trajectory.turnText)}`;
    const head = Buffer.from(`{"episode":${JSON.stringify(entry.episode)},"trajectory":`);
    return Buffer.concat([head, json.subarray(0, json.lastIndexOf(0x7d)), Buffer.from(`${extra}}}`)]);
  }

  private tokenDecoder(): TokenDecoder | null {
    if (this.decoder !== undefined) return this.decoder;
    this.decoder = null;
    if (this.options.tokenizerDir === null) return null;
    try {
      this.decoder = new TokenDecoder(this.options.tokenizerDir);
    } catch (err) {
      this.deps.logger.once('viewer_tokenizer', 'warn', 'the viewer cannot load the tokenizer files; tokens are shown as ids', { err });
    }
    return this.decoder;
  }

  /** The "now" view: open and recently closed episodes (filtered), and the gauges. */
  async now_(filter: { rollout?: string; group?: string; agent?: string; status?: string }): Promise<Record<string, unknown>> {
    const match = (rollout: string, group: string | null, agents: string[], status: string): boolean =>
      (!filter.rollout || rollout.includes(filter.rollout)) &&
      (!filter.group || (group ?? '').includes(filter.group)) &&
      (!filter.agent || agents.some((a) => a.includes(filter.agent!))) &&
      (!filter.status || status === filter.status);
    const open = this.deps.open().filter((e) => match(e.rollout_id, e.group_id, e.agents, 'open'));
    const closed = this.ring
      .list()
      .filter((e) => match(e.episode.rollout_id, e.episode.group_id, e.agents, e.episode.episode_status))
      .map(closedRow);
    return {
      watching_since_ms: this.options.idleMs,
      ring: { episodes: this.ring.size, bytes: this.ring.usedBytes, max_bytes: this.options.maxBytes },
      gauges: await gauges(this.deps.metrics),
      open,
      closed,
    };
  }

  /** A GRPO group's episodes side by side, with the group-relative advantages a GRPO trainer computes. */
  group(id: string): Record<string, unknown> {
    const entries = this.ring.list().filter((e) => e.episode.group_id === id);
    const rewards = entries.map((e) => e.episode.final_reward ?? 0);
    const mean = rewards.reduce((a, b) => a + b, 0) / Math.max(1, rewards.length);
    const std = Math.sqrt(rewards.reduce((a, r) => a + (r - mean) ** 2, 0) / Math.max(1, rewards.length));
    return {
      group_id: id,
      mean,
      std,
      episodes: entries.map((e, i) => Object.assign(closedRow(e), { advantage: (rewards[i] - mean) / (std + 1e-6) })),
    };
  }
}

function closedRow(e: ClosedEntry): Record<string, unknown> {
  const x = e.episode;
  return {
    rollout_id: x.rollout_id,
    attempt_id: x.attempt_id,
    group_id: x.group_id,
    agents: e.agents,
    status: x.episode_status,
    final_reward: x.final_reward,
    calls: x.transitions,
    segments: e.trajectories.map((t) => ({ trajectory_id: t.trajectory_id, segment: t.segment, start_reason: t.start_reason, tokens: t.tokens })),
    tokens: e.tokens,
    unmerged_calls: x.unmerged_calls,
    export: e.export,
    export_error: e.exportError,
    ended_at: x.ended_at,
  };
}

/** What the assistant said in a call, as recorded: reasoning, content and tool calls of its first choice. */
function turnText(record: TransitionRecord | undefined, writer: TransitionWriter): string | null {
  let r: { choices?: { message?: Record<string, unknown> }[] } | null;
  try {
    r = record ? (writer.parsedResponse(record) as typeof r) : null;
  } catch {
    return null;
  }
  const m = r && typeof r === 'object' && Array.isArray(r.choices) ? r.choices[0]?.message : undefined;
  if (!m) return null;
  const parts: string[] = [];
  const reasoning = m.reasoning_content ?? m.reasoning;
  if (typeof reasoning === 'string' && reasoning !== '') parts.push(`<think>${reasoning}</think>`);
  if (typeof m.content === 'string') parts.push(m.content);
  if (Array.isArray(m.tool_calls))
    for (const c of m.tool_calls as { function?: { name?: string; arguments?: string } }[]) parts.push(`[${c.function?.name}(${c.function?.arguments})]`);
  return parts.join('\n');
}

/** The gauges the "now" view shows, read from the registry when asked. */
async function gauges(metrics: Metrics): Promise<Record<string, unknown>> {
  const wanted: Record<string, string> = {
    export_lag_seconds: 'lightning_sidecar_export_lag_seconds',
    journal_bytes: 'lightning_sidecar_journal_bytes',
    export_backlog_records: 'lightning_sidecar_export_backlog_records',
    open_episodes: 'lightning_sidecar_open_episodes',
    late_records: 'lightning_sidecar_late_records_total',
    rewards: 'lightning_sidecar_rewards_total',
    token_in_calls: 'lightning_sidecar_token_in_calls_total',
    replicas_up: 'lightning_sidecar_upstream_replica_up',
    replica_calls: 'lightning_sidecar_upstream_replica_calls_total',
  };
  const out: Record<string, unknown> = {};
  for (const [key, name] of Object.entries(wanted)) {
    const m = metrics.registry.getSingleMetric(name);
    if (!m) continue;
    const got = await m.get();
    // A histogram's buckets are left out; its sum and count stay, named.
    out[key] = got.values
      .filter((v) => !('metricName' in v) || !String(v.metricName).endsWith('_bucket'))
      .map((v) => ({ labels: v.labels, value: v.value, ...('metricName' in v && v.metricName ? { name: v.metricName } : {}) }));
  }
  return out;
}
