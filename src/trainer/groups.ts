import type { EpisodeSummary, RoutedExpertsJson, SamplingMaskJson, Trajectory, Transition } from '../model/records';
import { rebuildPrompt, withFullPrompt, type WireTransition } from './prompt-delta';

/** Where a record came from, for offset commits (commit only below what is still pending). */
export interface Position {
  topic: string;
  partition: number;
  offset: number;
}

/** What a group's rows are: one per trajectory segment (the default) or one per call and choice. */
export type Rows = 'trajectories' | 'transitions';

/** The columns both kinds of rows have (one entry per row). */
interface RowColumns {
  uid: string[];
  rollout_id: string[];
  attempt_id: string[];
  prompt_ids: number[][];
  response_ids: number[][];
  response_mask: number[][];
  token_level_scores: number[][];
  rollout_log_probs: (number[] | null)[];
  reward: number[];
  is_last: boolean[];
}

interface GroupEpisode {
  rollout_id: string;
  attempt_id: string;
  final_reward: number | null;
  episode_status: string;
  transitions: number;
  policy_version_lag: number | null;
}

/**
 * One emitted GRPO group of trajectory rows, shaped for veRL's multi-turn layout: per row the
 * segment's first prompt, then the rest of its ids as the response, masked where the model did
 * not sample, with rewards on the tokens the record places them.
 */
export interface TrajectoryGroupBatch {
  schema: 'lightning.group.v1';
  uid: string;
  group_size: number;
  rows: 'trajectories';
  episodes: GroupEpisode[];
  batch: RowColumns & {
    trajectory_id: string[];
    segment: number[];
    turns: number[];
    policy_versions: string[][];
    /** Each row's `routed_experts` as recorded (null without); only when a trajectory of the group has routing. */
    routed_experts?: (RoutedExpertsJson | null)[];
    /** Each row's `routing_complete` (false without routing); with `routed_experts`. */
    routing_complete?: boolean[];
    /** Each row's `sampling_mask` as recorded (null without); only when a trajectory of the group has sampling masks. */
    sampling_mask?: (SamplingMaskJson | null)[];
    /** Each row's `sampling_mask_complete` (false without a mask); with `sampling_mask`. */
    sampling_mask_complete?: boolean[];
  };
  /** Calls of the group's episodes that are in no trajectory (each episode's `unmerged_calls`). */
  unmerged_calls: number;
}

/** One emitted GRPO group of per-call rows (`--rows transitions`): one row per transition with token ids. */
export interface GroupBatch {
  schema: 'lightning.group.v1';
  uid: string;
  group_size: number;
  episodes: GroupEpisode[];
  batch: RowColumns & {
    transition_id: string[];
    seq: number[];
    policy_version: (string | null)[];
  };
  /** Transitions left out of `batch` (no token ids: an openai-flavor upstream or the Anthropic format). */
  skipped_no_token_ids: number;
}

export type GroupEvent =
  | { kind: 'group'; batch: GroupBatch | TrajectoryGroupBatch }
  | { kind: 'incomplete'; uid: string; episodes: number; waitedMs: number }
  | { kind: 'late'; uid: string; rollout_id: string; attempt_id: string }
  | { kind: 'ungrouped'; rollout_id: string; attempt_id: string }
  | { kind: 'orphaned'; records: number }
  /** The episode's records of this kind were not exported (`exporters.records`): its group cannot complete. */
  | { kind: 'not_exported'; rollout_id: string; attempt_id: string; rows: Rows }
  /** A prompt delta whose previous transition was not at hand: the row goes out without prompt ids. */
  | { kind: 'unresolved_delta'; transition_id: string; reason: string };

interface PendingEpisode {
  episode: EpisodeSummary;
  pos: Position;
}

interface PendingGroup {
  episodes: Map<string, PendingEpisode>;
  firstSeen: number;
}

/**
 * The reference consumer's core: gathers trajectories (or transitions, with `rows:
 * 'transitions'`) and episodes, in any order, with duplicates, and yields a group when
 * `groupSize` episodes of one `group_id` are closed and all their records are present. Groups
 * already done (`done`, e.g. from the state file) are never yielded again; groups waiting longer
 * than `timeoutMs` are reported incomplete and dropped. Prompt deltas are made whole from the
 * previous transition of the episode, which is held here (same partition, read first) until the
 * group is done.
 *
 * A complete group is yielded once no record still needed by a group being assembled (or by
 * `blockers`, e.g. a record still in chunks) lies before its last record on any partition it
 * has records on: complete groups whose records interleave go out together. So the offsets
 * committed after a group is yielded (below what is still pending) are past all of its records,
 * and a consumer that takes the partition over in a rebalance never reads them again: it cannot
 * yield the group a second time (docs/kafka-records.md#consumer-groups).
 */
export class GroupAssembler {
  /** Records held by id: transitions, or trajectories. */
  private transitions = new Map<string, { t: Transition; pos: Position; at: number }>();
  private trajectories = new Map<string, { t: Trajectory; pos: Position; at: number }>();
  private groups = new Map<string, PendingGroup>();
  /** Groups with every record present, waiting for the groups before them on their partitions. */
  private complete = new Set<string>();
  private seenEpisodes = new Set<string>();
  readonly rows: Rows;

  constructor(
    private readonly options: {
      groupSize: number;
      timeoutMs: number;
      rows?: Rows;
      /** Per topic/partition, the lowest offset of records held elsewhere (chunks being reassembled). */
      blockers?: () => Map<string, number>;
    },
    /** uids already emitted or given up on. */
    readonly done: Set<string> = new Set(),
  ) {
    this.rows = options.rows ?? 'trajectories';
  }

  addTrajectory(t: Trajectory, pos: Position, now: number): GroupEvent[] {
    if (t.group_id !== null && this.done.has(t.group_id)) return [];
    if (!this.trajectories.has(t.trajectory_id)) this.trajectories.set(t.trajectory_id, { t, pos, at: now });
    return this.check(t.group_id);
  }

  addTransition(wire: WireTransition, pos: Position, now: number): GroupEvent[] {
    if (wire.group_id !== null && this.done.has(wire.group_id)) return [];
    if (this.transitions.has(wire.transition_id)) return this.check(wire.group_id);
    const events: GroupEvent[] = [];
    let t: Transition = wire;
    if (wire.prompt_token_ids_delta) {
      const rebuilt = rebuildPrompt(wire.prompt_token_ids_delta, this.transitions.get(wire.prompt_token_ids_delta.previous_transition_id)?.t);
      if (!rebuilt.ok) events.push({ kind: 'unresolved_delta', transition_id: wire.transition_id, reason: rebuilt.reason });
      t = withFullPrompt(wire, rebuilt.ok ? rebuilt.prompt_token_ids : null);
    }
    this.transitions.set(t.transition_id, { t, pos, at: now });
    return [...events, ...this.check(t.group_id)];
  }

  addEpisode(e: EpisodeSummary, pos: Position, now: number): GroupEvent[] {
    const key = `${e.rollout_id}\u0000${e.attempt_id}`;
    if (e.group_id === null) {
      this.forget(e);
      return [{ kind: 'ungrouped', rollout_id: e.rollout_id, attempt_id: e.attempt_id }];
    }
    if (this.done.has(e.group_id))
      return this.seenEpisodes.has(key) ? [] : [{ kind: 'late', uid: e.group_id, rollout_id: e.rollout_id, attempt_id: e.attempt_id }];
    if (!exportsRows(e, this.rows)) {
      if (this.seenEpisodes.has(key)) return [];
      this.seenEpisodes.add(key);
      return [{ kind: 'not_exported', rollout_id: e.rollout_id, attempt_id: e.attempt_id, rows: this.rows }];
    }
    this.seenEpisodes.add(key);
    let g = this.groups.get(e.group_id);
    if (!g) this.groups.set(e.group_id, (g = { episodes: new Map(), firstSeen: now }));
    if (!g.episodes.has(key)) {
      if (g.episodes.size >= this.options.groupSize) return [{ kind: 'late', uid: e.group_id, rollout_id: e.rollout_id, attempt_id: e.attempt_id }];
      g.episodes.set(key, { episode: e, pos });
    }
    return this.check(e.group_id);
  }

  /**
   * Forgets everything pending (the done set stays): after a rebalance the consumer reads again
   * from the committed offsets, below every record that was pending, and rebuilds what it owns.
   */
  reset(): void {
    this.transitions.clear();
    this.trajectories.clear();
    this.groups.clear();
    this.complete.clear();
    this.seenEpisodes.clear();
  }

  /** Gives up on groups (and stray transitions) older than the timeout; yields groups that waited for them. */
  tick(now: number): GroupEvent[] {
    const out: GroupEvent[] = [];
    for (const [uid, g] of this.groups) {
      if (this.complete.has(uid) || now - g.firstSeen < this.options.timeoutMs) continue;
      out.push({ kind: 'incomplete', uid, episodes: g.episodes.size, waitedMs: now - g.firstSeen });
      this.finish(uid, g);
    }
    let orphaned = 0;
    for (const held of [this.transitions, this.trajectories] as Map<string, { t: { group_id: string | null }; at: number }>[]) {
      for (const [id, x] of held) {
        if (now - x.at >= this.options.timeoutMs && (x.t.group_id === null || !this.groups.has(x.t.group_id))) {
          held.delete(id);
          orphaned++;
        }
      }
    }
    if (orphaned > 0) out.push({ kind: 'orphaned', records: orphaned });
    out.push(...this.release());
    return out;
  }

  /** Per topic/partition, the lowest offset still needed (commit up to it, exclusive). */
  lowestPending(): Map<string, number> {
    const low = new Map<string, number>();
    this.positions(
      () => true,
      (_, p) => lower(low, p),
    );
    return low;
  }

  /** Calls `each` with the group (or null) and position of every pending record `which` accepts. */
  private positions(which: (uid: string | null) => boolean, each: (uid: string | null, p: Position) => void): void {
    for (const held of [this.transitions, this.trajectories] as Map<string, { t: { group_id: string | null }; pos: Position }>[])
      for (const x of held.values()) if (which(x.t.group_id)) each(x.t.group_id, x.pos);
    for (const [uid, g] of this.groups) if (which(uid)) for (const e of g.episodes.values()) each(uid, e.pos);
  }

  /**
   * Yields the complete groups no pending record comes before: a complete group is held back
   * while a record of a group still being assembled (or a blocker, or a group held back itself)
   * lies at or before its last record on a partition they share.
   */
  private release(): GroupEvent[] {
    if (this.complete.size === 0) return [];
    // Per complete group and topic/partition: its first and last record.
    const extent = new Map<string, Map<string, { first: number; last: number }>>();
    this.positions(
      (uid) => uid !== null && this.complete.has(uid),
      (uid, p) => {
        const m = extent.get(uid!) ?? extent.set(uid!, new Map()).get(uid!)!;
        const e = m.get(key(p));
        if (e) {
          e.first = Math.min(e.first, p.offset);
          e.last = Math.max(e.last, p.offset);
        } else m.set(key(p), { first: p.offset, last: p.offset });
      },
    );
    const low = new Map(this.options.blockers?.() ?? []);
    this.positions(
      (uid) => uid === null || !this.complete.has(uid),
      (_, p) => lower(low, p),
    );
    const held = new Set<string>();
    for (let changed = true; changed;) {
      changed = false;
      for (const uid of this.complete) {
        if (held.has(uid)) continue;
        const ranges = [...(extent.get(uid) ?? [])];
        if (!ranges.some(([k, { last }]) => last >= (low.get(k) ?? Infinity))) continue;
        held.add(uid);
        changed = true;
        for (const [k, { first }] of ranges) low.set(k, Math.min(low.get(k) ?? Infinity, first));
      }
    }
    const out: GroupEvent[] = [];
    for (const uid of [...this.complete]) {
      if (held.has(uid)) continue;
      const g = this.groups.get(uid)!;
      const batch = this.rows === 'trajectories' ? this.buildTrajectoryRows(uid, g) : this.build(uid, g);
      this.finish(uid, g);
      out.push({ kind: 'group', batch });
    }
    return out;
  }

  get pendingGroups(): number {
    return this.groups.size;
  }

  private check(uid: string | null): GroupEvent[] {
    if (uid === null) return [];
    const g = this.groups.get(uid);
    if (!g || g.episodes.size < this.options.groupSize) return [];
    for (const { episode } of g.episodes.values()) {
      if (this.rows === 'trajectories') {
        for (const id of episode.trajectory_ids) if (!this.trajectories.has(id)) return [];
      } else for (const id of episode.transition_ids) if (!this.transitions.has(id)) return [];
    }
    this.complete.add(uid);
    return this.release();
  }

  private finish(uid: string, g: PendingGroup): void {
    this.complete.delete(uid);
    for (const { episode } of g.episodes.values()) this.forget(episode);
    for (const [id, x] of this.transitions) if (x.t.group_id === uid) this.transitions.delete(id);
    for (const [id, x] of this.trajectories) if (x.t.group_id === uid) this.trajectories.delete(id);
    this.groups.delete(uid);
    this.done.add(uid);
  }

  /** Drops the records held for an episode. */
  private forget(e: EpisodeSummary): void {
    for (const id of e.transition_ids) this.transitions.delete(id);
    for (const id of e.trajectory_ids ?? []) this.trajectories.delete(id);
  }

  private buildTrajectoryRows(uid: string, g: PendingGroup): TrajectoryGroupBatch {
    const episodes = sortedEpisodes(g);
    const batch: TrajectoryGroupBatch['batch'] = {
      uid: [],
      rollout_id: [],
      attempt_id: [],
      trajectory_id: [],
      segment: [],
      turns: [],
      prompt_ids: [],
      response_ids: [],
      response_mask: [],
      token_level_scores: [],
      rollout_log_probs: [],
      reward: [],
      is_last: [],
      policy_versions: [],
    };
    let unmerged = 0;
    const routing: { experts: RoutedExpertsJson | null; complete: boolean }[] = [];
    const masks: { mask: SamplingMaskJson | null; complete: boolean }[] = [];
    for (const e of episodes) {
      unmerged += e.unmerged_calls?.length ?? 0;
      for (const id of e.trajectory_ids) {
        const t = this.trajectories.get(id)!.t;
        routing.push({ experts: t.routed_experts ?? null, complete: t.routed_experts !== undefined && t.routing_complete === true });
        masks.push({ mask: t.sampling_mask ?? null, complete: t.sampling_mask !== undefined && t.sampling_mask_complete === true });
        const p = t.prompt_length;
        const scores = new Array<number>(t.token_ids.length - p).fill(0);
        // A position outside the response (a malformed record) is skipped.
        for (const r of t.token_rewards) if (r.position >= p && r.position < t.token_ids.length) scores[r.position - p] = r.value;
        batch.uid.push(uid);
        batch.rollout_id.push(t.rollout_id);
        batch.attempt_id.push(t.attempt_id);
        batch.trajectory_id.push(t.trajectory_id);
        batch.segment.push(t.segment);
        batch.turns.push(t.turns.length);
        batch.prompt_ids.push(t.token_ids.slice(0, p));
        batch.response_ids.push(t.token_ids.slice(p));
        batch.response_mask.push(t.loss_mask.slice(p));
        batch.token_level_scores.push(scores);
        batch.rollout_log_probs.push(t.logprobs === null ? null : t.logprobs.slice(p));
        batch.reward.push(t.reward);
        batch.is_last.push(t.segment === t.segments - 1);
        batch.policy_versions.push(t.policy_versions);
      }
    }
    // MoE routing replay: the columns are there only when a trajectory of the group has routing.
    if (routing.some((r) => r.experts !== null)) {
      batch.routed_experts = routing.map((r) => r.experts);
      batch.routing_complete = routing.map((r) => r.complete);
    }
    // Sampling masks likewise: the columns are there only when a trajectory of the group has them.
    if (masks.some((m) => m.mask !== null)) {
      batch.sampling_mask = masks.map((m) => m.mask);
      batch.sampling_mask_complete = masks.map((m) => m.complete);
    }
    return {
      schema: 'lightning.group.v1',
      uid,
      group_size: this.options.groupSize,
      rows: 'trajectories',
      episodes: episodes.map(episodeEntry),
      batch,
      unmerged_calls: unmerged,
    };
  }

  private build(uid: string, g: PendingGroup): GroupBatch {
    const episodes = sortedEpisodes(g);
    const batch: GroupBatch['batch'] = {
      uid: [],
      rollout_id: [],
      attempt_id: [],
      transition_id: [],
      seq: [],
      prompt_ids: [],
      response_ids: [],
      response_mask: [],
      token_level_scores: [],
      rollout_log_probs: [],
      reward: [],
      is_last: [],
      policy_version: [],
    };
    let skipped = 0;
    for (const e of episodes) {
      for (const id of e.transition_ids) {
        const t = this.transitions.get(id)!.t;
        if (!t.prompt_token_ids || !t.response_token_ids) {
          skipped++;
          continue;
        }
        const n = t.response_token_ids.length;
        batch.uid.push(uid);
        batch.rollout_id.push(t.rollout_id);
        batch.attempt_id.push(t.attempt_id);
        batch.transition_id.push(t.transition_id);
        batch.seq.push(t.seq);
        batch.prompt_ids.push(t.prompt_token_ids);
        batch.response_ids.push(t.response_token_ids);
        batch.response_mask.push(new Array<number>(n).fill(1));
        // The whole (credited + AIR) reward sits on the last response token, as veRL expects.
        batch.token_level_scores.push(Array.from({ length: n }, (_, i) => (i === n - 1 ? t.reward : 0)));
        batch.rollout_log_probs.push(t.response_logprobs);
        batch.reward.push(t.reward);
        batch.is_last.push(t.is_last);
        batch.policy_version.push(t.policy_version);
      }
    }
    return {
      schema: 'lightning.group.v1',
      uid,
      group_size: this.options.groupSize,
      episodes: episodes.map(episodeEntry),
      batch,
      skipped_no_token_ids: skipped,
    };
  }
}

function key(p: Position): string {
  return `${p.topic}\u0000${p.partition}`;
}

function lower(low: Map<string, number>, p: Position): void {
  const k = key(p);
  low.set(k, Math.min(low.get(k) ?? Infinity, p.offset));
}

/** The group's episodes by rollout id, then attempt id. */
function sortedEpisodes(g: PendingGroup): EpisodeSummary[] {
  return [...g.episodes.values()]
    .map((p) => p.episode)
    .sort((a, b) => (a.rollout_id < b.rollout_id ? -1 : a.rollout_id > b.rollout_id ? 1 : a.attempt_id < b.attempt_id ? -1 : 1));
}

function episodeEntry(e: EpisodeSummary): GroupEpisode {
  return {
    rollout_id: e.rollout_id,
    attempt_id: e.attempt_id,
    final_reward: e.final_reward,
    episode_status: e.episode_status,
    transitions: e.transitions,
    policy_version_lag: e.policy_version_lag ?? null,
  };
}

/**
 * Whether the sidecar exported the episode's records of this kind: an episode from a sidecar
 * before trajectories has no `trajectory_ids` (JSON) or an empty `exported` (protobuf) and
 * exported transitions only.
 */
function exportsRows(e: EpisodeSummary, rows: Rows): boolean {
  const exported = Array.isArray(e.exported) ? e.exported : [];
  if (rows === 'trajectories') return Array.isArray(e.trajectory_ids) && (!Array.isArray(e.exported) || exported.includes('trajectories'));
  return exported.length === 0 || exported.includes('transitions');
}
