import type { AirConfig, CaptureConfig, CreditConfig, EpisodesConfig, ImagesConfig, RoutedExpertsConfig, SamplingConfig } from '../../config/schema';
import {
  QWEN_VL_IMAGE_TOKEN_ID,
  type AgentSpanRecord,
  type CallRecord,
  type ClosedEpisode,
  type EpisodeStatus,
  type PipelineRecord,
  type ToolSpanRecord,
} from '../../model/records';
import { globToRegExp } from '../air/glob';
import { compileRules } from '../air/rules';
import type { BodyReader } from '../../formats/extract';
import type { ImageOptions } from '../rewards/images';
import { buildEpisode, type EpisodeFacts, type TransitionOptions } from '../rewards/transitions';

export type AssemblerEvent = PipelineRecord | { type: 'tick'; at: number };

export interface AssemblerOptions {
  episodes: EpisodesConfig;
  credit: CreditConfig;
  air?: AirConfig;
  capture?: CaptureConfig;
  /** Reads journaled bodies of captured calls when their episode closes. */
  read?: BodyReader;
  /** Sampling provenance (`processors.sampling`). */
  sampling?: SamplingConfig;
  /** MoE routing replay settings (`processors.routed_experts`). */
  routedExperts?: RoutedExpertsConfig;
  /** Images in calls (`processors.images`). */
  images?: ImagesConfig;
  /** What the exporter writes (`exporters.records`; default both), named in each episode summary. */
  records?: 'trajectories' | 'transitions' | 'both';
  /**
   * A record came for an episode already closed (not called while replaying): a call starts a new
   * episode with the same ids, anything else is dropped. Intake rejects most of these first
   * (`standing`); what still arrives here was in flight or parked when the episode closed.
   */
  onLate?: (kind: 'call' | 'tool_span' | 'agent_span' | 'reward' | 'end', rolloutId: string, attemptId: string) => void;
}

interface OpenEpisode {
  rolloutId: string;
  attemptId: string;
  groupId: string | null;
  calls: CallRecord[];
  toolSpans: ToolSpanRecord[];
  agentSpans: AgentSpanRecord[];
  inFlight: Set<number>;
  rewards: { name: string; value: number; final: boolean }[];
  finalReward: number | null;
  /** The last provisional reward: the final one if none is given explicitly. */
  provisionalFinal: number | null;
  /** When a final reward or `end` arrived; null while the episode runs. */
  closeRequestedAt: number | null;
  lastCallEndedAt: number;
  lastActivity: number;
  startedAt: number;
  firstOffset: number;
}

/** An open episode as the viewer lists it. */
export interface OpenEpisodeView {
  rollout_id: string;
  attempt_id: string;
  group_id: string | null;
  agents: string[];
  calls: number;
  in_flight: number;
  tool_spans: number;
  rewards: number;
  final_reward: number | null;
  /** A final reward or end came: it closes once its calls and tool spans are in. */
  closing: boolean;
  started_at: string;
  last_activity: string;
}

/**
 * An episode the rules closed: what it holds and how it closed. Its transitions are built from
 * it (`EpisodeAssembler.build`) when it is exported, off the path of the call that closed it.
 */
export interface EpisodeClose {
  facts: EpisodeFacts;
  status: EpisodeStatus;
  /** Lowest journal offset among the records of this episode (what must be kept until delivery). */
  firstOffset: number;
  /**
   * Set when the record at this offset closed the episode by itself (a one-call rollout's call):
   * a replay of that record closes it again, so no close marker is journaled for it.
   */
  closedByRecord?: number;
}

/** What the sidecar knows of a rollout attempt when a reward or end for it arrives. */
export type Standing = { state: 'open' } | { state: 'closed'; status: EpisodeStatus; at: number; finalReward: number | null } | { state: 'unknown' };

/** A closed episode remembered to answer records that come after its close. */
interface ClosedNote {
  status: EpisodeStatus;
  at: number;
  finalReward: number | null;
}

/**
 * Groups records into episodes per (rollout, attempt) and closes them: on a final reward or
 * `end`, once no call is in flight and tool spans have had `tool_span_wait_ms`; or after
 * `idle_timeout_ms` without activity (`timed_out`); or, past `max_open_episodes`, the least
 * recently active one (`evicted`). A fold: no I/O, time comes only from the events, so a
 * replayed record stream closes the same episodes with the same transitions.
 */
export class EpisodeAssembler {
  /** Insertion order = least recently active first. */
  private readonly open = new Map<string, OpenEpisode>();
  /** The last `closed_window` closed episodes (oldest first), to answer what arrives after a close. */
  private readonly recentlyClosed = new Map<string, ClosedNote>();
  private readonly buildOptions: TransitionOptions;

  constructor(private readonly options: AssemblerOptions) {
    const air = options.air;
    this.buildOptions = {
      credit: options.credit,
      airWeight: air?.enabled ? air.weight : 0,
      air: air?.enabled ? compileRules(air.rules) : null,
      includeAgents: (options.capture?.include_agents ?? []).map(globToRegExp),
      excludeAgents: (options.capture?.exclude_agents ?? []).map(globToRegExp),
      read: options.read,
      exported: exportedOf(options.records ?? 'both'),
      recordSampling: options.sampling?.record === true,
      samplingMasks: options.sampling?.masks === true,
      serverDefaults: options.sampling?.server_defaults ?? null,
      logprobsMode: options.sampling?.logprobs_mode ?? null,
      images: imageOptions(options.images),
      sglangRouting: options.routedExperts?.sglang ? { layers: options.routedExperts.sglang.layers, topK: options.routedExperts.sglang.top_k } : null,
      // Bodies up to 4 MiB are read into these while an episode closes; bigger ones get their own.
      scratch: [Buffer.allocUnsafe(4 << 20), Buffer.allocUnsafe(4 << 20)],
    };
  }

  get openCount(): number {
    return this.open.size;
  }

  /** What a person looking at the sidecar sees of its open episodes (the viewer asks; nothing is kept for it). */
  openView(): OpenEpisodeView[] {
    const out: OpenEpisodeView[] = [];
    for (const e of this.open.values()) {
      const agents = new Set<string>();
      for (const c of e.calls) if (c.correlation.agentName) agents.add(c.correlation.agentName);
      out.push({
        rollout_id: e.rolloutId,
        attempt_id: e.attemptId,
        group_id: e.groupId,
        agents: [...agents],
        calls: e.calls.length,
        in_flight: e.inFlight.size,
        tool_spans: e.toolSpans.length,
        rewards: e.rewards.length,
        final_reward: e.finalReward,
        closing: e.closeRequestedAt !== null,
        started_at: new Date(e.startedAt).toISOString(),
        last_activity: new Date(e.lastActivity).toISOString(),
      });
    }
    return out;
  }

  /**
   * While replaying a journal, episodes close only where the journal says they closed
   * (`forceClose`), never by the rules, so replay reproduces the run that wrote it.
   */
  replaying = false;
  /** The journal offset of the record being applied (episodes remember their lowest). */
  private offset = 0;
  /** Newest numeric policy version the control channel has named (from journaled policy records). */
  private maxPolicySeen: number | null = null;

  /**
   * Whether a reward or end for this rollout attempt would reach an episode: one is open, one
   * closed within the last `closed_window` closes (the record would be dropped), or neither.
   */
  standing(rolloutId: string, attemptId: string): Standing {
    const key = keyOf(rolloutId, attemptId);
    if (this.open.has(key)) return { state: 'open' };
    const note = this.recentlyClosed.get(key);
    return note ? { state: 'closed', ...note } : { state: 'unknown' };
  }

  /** Applies one event; returns the episodes it closed, with their transitions built. */
  apply(event: AssemblerEvent, offset = this.offset): ClosedEpisode[] {
    return this.step(event, offset).map((c) => this.build(c));
  }

  /** The transitions and summary of a closed episode (extraction reads its calls' bodies). */
  build(c: EpisodeClose): ClosedEpisode {
    return buildEpisode(c.facts, c.status, this.buildOptions);
  }

  /** Applies one event; returns the episodes it closed, not yet built. */
  step(event: AssemblerEvent, offset = this.offset): EpisodeClose[] {
    this.offset = offset;
    const closed: EpisodeClose[] = [];
    switch (event.type) {
      case 'policy': {
        const n = Number(event.version);
        if (Number.isFinite(n)) this.maxPolicySeen = Math.max(this.maxPolicySeen ?? -Infinity, n);
        return closed;
      }
      case 'tick':
        for (const [key, ep] of this.open) {
          const status = this.dueStatus(ep, event.at);
          if (status) closed.push(this.close(key, ep, status, event.at));
        }
        return closed;
      case 'call_start': {
        const ep = this.touch(event.correlation.rolloutId, event.correlation.attemptId, event.at, closed);
        ep.inFlight.add(event.seq);
        ep.groupId ??= event.correlation.groupId;
        return closed;
      }
      case 'call': {
        const key = keyOf(event.correlation.rolloutId, event.correlation.attemptId);
        this.late(key, 'call', event.correlation.rolloutId, event.correlation.attemptId);
        const ep = this.touch(event.correlation.rolloutId, event.correlation.attemptId, event.endedAt, closed);
        ep.inFlight.delete(event.seq);
        ep.calls.push(event);
        ep.groupId ??= event.correlation.groupId;
        ep.startedAt = Math.min(ep.startedAt, event.startedAt);
        ep.lastCallEndedAt = Math.max(ep.lastCallEndedAt, event.endedAt);
        if (event.correlation.source === 'self' && ep.inFlight.size === 0) {
          // A rollout id the sidecar made up is never named again: the call was the whole rollout.
          // Decided by the record alone, so a replay closes it at the same record.
          const c = this.close(key, ep, 'completed', event.endedAt, false);
          c.closedByRecord = this.offset;
          closed.push(c);
          return closed;
        }
        this.closeIfDue(key, ep, event.endedAt, closed);
        return closed;
      }
      case 'tool_span': {
        const key = keyOf(event.rolloutId, event.attemptId);
        if (this.late(key, 'tool_span', event.rolloutId, event.attemptId)) return closed;
        const ep = this.touch(event.rolloutId, event.attemptId, event.at, closed);
        // OTLP clients resend on retryable errors: a span id seen before is the same span.
        if (!ep.toolSpans.some((s) => s.spanId === event.spanId)) ep.toolSpans.push(event);
        this.closeIfDue(key, ep, event.at, closed);
        return closed;
      }
      case 'agent_span': {
        const key = keyOf(event.rolloutId, event.attemptId);
        if (this.late(key, 'agent_span', event.rolloutId, event.attemptId)) return closed;
        const ep = this.touch(event.rolloutId, event.attemptId, event.at, closed);
        if (!ep.agentSpans.some((s) => s.spanId === event.spanId)) ep.agentSpans.push(event);
        return closed;
      }
      case 'reward':
      case 'end': {
        const key = keyOf(event.rolloutId, event.attemptId);
        if (this.late(key, event.type, event.rolloutId, event.attemptId)) return closed;
        const ep = this.touch(event.rolloutId, event.attemptId, event.at, closed);
        if (event.type === 'reward') {
          ep.rewards.push({ name: event.name, value: event.value, final: event.final });
          if (event.final) {
            ep.finalReward = event.value;
            ep.closeRequestedAt ??= event.at;
          } else if (event.provisional) {
            ep.provisionalFinal = event.value;
          }
        } else {
          ep.closeRequestedAt ??= event.at;
        }
        this.closeIfDue(key, ep, event.at, closed);
        return closed;
      }
    }
  }

  /** Closes one episode as the journal recorded it closing (replay). */
  forceClose(rolloutId: string, attemptId: string, status: EpisodeStatus, at: number): EpisodeClose | null {
    const key = keyOf(rolloutId, attemptId);
    const ep = this.open.get(key);
    return ep ? this.close(key, ep, status, at) : null;
  }

  /** A call whose record could not be kept: it no longer holds its episode open. */
  abandonCall(rolloutId: string, attemptId: string, seq: number): void {
    this.open.get(keyOf(rolloutId, attemptId))?.inFlight.delete(seq);
  }

  /** After replay: calls that were in flight when the process died will never end. */
  forgetInFlight(): void {
    for (const ep of this.open.values()) ep.inFlight.clear();
  }

  /** The lowest journal offset the open episode of this rollout attempt needs, or null when none is open. */
  floorOf(rolloutId: string, attemptId: string): number | null {
    return this.open.get(keyOf(rolloutId, attemptId))?.firstOffset ?? null;
  }

  /** The lowest journal offset any open episode still needs. */
  minOffset(): number {
    let min = Infinity;
    for (const ep of this.open.values()) min = Math.min(min, ep.firstOffset);
    return min;
  }

  /** Closes every open episode now (shutdown that nothing will resume). */
  drain(at: number): EpisodeClose[] {
    const closed: EpisodeClose[] = [];
    // Still open when the sidecar stops: cut short, not idle (a final reward or `end` already asked for its close).
    for (const [key, ep] of this.open) closed.push(this.close(key, ep, ep.closeRequestedAt !== null ? 'completed' : 'shutdown', at));
    return closed;
  }

  /** Whether a record comes for an episode that closed and is not open again; if so it is reported (`onLate`). */
  private late(key: string, kind: 'call' | 'tool_span' | 'agent_span' | 'reward' | 'end', rolloutId: string, attemptId: string): boolean {
    if (this.open.has(key) || !this.recentlyClosed.has(key)) return false;
    if (!this.replaying) this.options.onLate?.(kind, rolloutId, attemptId);
    return true;
  }

  private touch(rolloutId: string, attemptId: string, at: number, closed: EpisodeClose[]): OpenEpisode {
    const key = keyOf(rolloutId, attemptId);
    let ep = this.open.get(key);
    if (ep) {
      this.open.delete(key);
      ep.lastActivity = Math.max(ep.lastActivity, at);
      ep.firstOffset = Math.min(ep.firstOffset, this.offset);
    } else {
      if (!this.replaying && this.open.size >= this.options.episodes.max_open_episodes) {
        const [oldKey, oldest] = this.open.entries().next().value as [string, OpenEpisode];
        closed.push(this.close(oldKey, oldest, 'evicted', at));
      }
      this.recentlyClosed.delete(key);
      ep = {
        rolloutId,
        attemptId,
        groupId: null,
        calls: [],
        toolSpans: [],
        agentSpans: [],
        inFlight: new Set(),
        rewards: [],
        finalReward: null,
        provisionalFinal: null,
        closeRequestedAt: null,
        lastCallEndedAt: at,
        lastActivity: at,
        startedAt: at,
        firstOffset: this.offset,
      };
    }
    this.open.set(key, ep);
    return ep;
  }

  private dueStatus(ep: OpenEpisode, at: number): EpisodeStatus | null {
    if (ep.closeRequestedAt !== null && ep.inFlight.size === 0) {
      const waitFrom = Math.max(ep.closeRequestedAt, ep.lastCallEndedAt);
      if (at >= waitFrom + this.options.episodes.tool_span_wait_ms) return 'completed';
    }
    if (ep.inFlight.size === 0 && at - ep.lastActivity >= this.options.episodes.idle_timeout_ms) {
      return ep.closeRequestedAt !== null || ep.provisionalFinal !== null ? 'completed' : 'timed_out';
    }
    return null;
  }

  private closeIfDue(key: string, ep: OpenEpisode, at: number, closed: EpisodeClose[]): void {
    if (this.replaying) return;
    const status = this.dueStatus(ep, at);
    if (status) closed.push(this.close(key, ep, status, at));
  }

  /** `late`: remember the key, to count records that arrive after the close (not for made-up rollout ids, never named again). */
  private close(key: string, ep: OpenEpisode, status: EpisodeStatus, at: number, late = true): EpisodeClose {
    this.open.delete(key);
    if (late) {
      this.recentlyClosed.delete(key);
      this.recentlyClosed.set(key, { status, at, finalReward: ep.finalReward ?? ep.provisionalFinal });
      if (this.recentlyClosed.size > this.options.episodes.closed_window) this.recentlyClosed.delete(this.recentlyClosed.keys().next().value as string);
    }
    return {
      facts: {
        rolloutId: ep.rolloutId,
        attemptId: ep.attemptId,
        groupId: ep.groupId,
        calls: ep.calls,
        toolSpans: ep.toolSpans,
        agentSpans: ep.agentSpans,
        rewards: ep.rewards,
        finalReward: ep.finalReward ?? ep.provisionalFinal,
        startedAt: ep.startedAt,
        endedAt: at,
        firstOffset: ep.firstOffset,
        maxPolicySeen: this.maxPolicySeen,
      },
      status,
      firstOffset: ep.firstOffset,
    };
  }
}

/** How images are found in calls, from `processors.images`. */
function imageOptions(c: ImagesConfig | undefined): ImageOptions {
  const p = c?.processor;
  return {
    imageTokenId: c?.image_token_id ?? QWEN_VL_IMAGE_TOKEN_ID,
    processor: p ? { factor: p.factor, minPixels: p.min_pixels, maxPixels: p.max_pixels } : null,
  };
}

/** An episode's key: its rollout and attempt. */
export function keyOf(rolloutId: string, attemptId: string): string {
  return `${rolloutId}\u0000${attemptId}`;
}

/** The record kinds an `exporters.records` setting writes. */
export function exportedOf(records: 'trajectories' | 'transitions' | 'both'): ('transitions' | 'trajectories')[] {
  return records === 'both' ? ['transitions', 'trajectories'] : [records];
}
