import type { EpisodeSummary, Transition } from '../model/records';
import { rebuildPrompt, withFullPrompt, type WireTransition } from './prompt-delta';

/** Where a record came from, for offset commits (commit only below what is still pending). */
export interface Position {
  topic: string;
  partition: number;
  offset: number;
}

/** One emitted GRPO group, shaped for a veRL-style batch (one row per transition with token ids). */
export interface GroupBatch {
  schema: 'lightning.group.v1';
  uid: string;
  group_size: number;
  episodes: {
    rollout_id: string;
    attempt_id: string;
    final_reward: number | null;
    episode_status: string;
    transitions: number;
    policy_version_lag: number | null;
  }[];
  batch: {
    uid: string[];
    rollout_id: string[];
    attempt_id: string[];
    transition_id: string[];
    seq: number[];
    prompt_ids: number[][];
    response_ids: number[][];
    response_mask: number[][];
    token_level_scores: number[][];
    rollout_log_probs: (number[] | null)[];
    reward: number[];
    is_last: boolean[];
    policy_version: (string | null)[];
  };
  /** Transitions left out of `batch` (no token ids: an openai-flavor upstream or the Anthropic format). */
  skipped_no_token_ids: number;
}

export type GroupEvent =
  | { kind: 'group'; batch: GroupBatch }
  | { kind: 'incomplete'; uid: string; episodes: number; waitedMs: number }
  | { kind: 'late'; uid: string; rollout_id: string; attempt_id: string }
  | { kind: 'ungrouped'; rollout_id: string; attempt_id: string }
  | { kind: 'orphaned'; transitions: number }
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
 * The reference consumer's core: gathers transitions and episodes (in any order, with
 * duplicates) and yields a group when `groupSize` episodes of one `group_id` are closed and all
 * their transitions are present. Groups already done (`done`, e.g. from the state file) are never
 * yielded again; groups waiting longer than `timeoutMs` are reported incomplete and dropped.
 * Prompt deltas are made whole from the previous transition of the episode, which is held here
 * (same partition, read first) until the group is done.
 */
export class GroupAssembler {
  private transitions = new Map<string, { t: Transition; pos: Position; at: number }>();
  private groups = new Map<string, PendingGroup>();
  private seenEpisodes = new Set<string>();

  constructor(
    private readonly options: { groupSize: number; timeoutMs: number },
    /** uids already emitted or given up on. */
    readonly done: Set<string> = new Set(),
  ) {}

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
      for (const id of e.transition_ids) this.transitions.delete(id);
      return [{ kind: 'ungrouped', rollout_id: e.rollout_id, attempt_id: e.attempt_id }];
    }
    if (this.done.has(e.group_id))
      return this.seenEpisodes.has(key) ? [] : [{ kind: 'late', uid: e.group_id, rollout_id: e.rollout_id, attempt_id: e.attempt_id }];
    this.seenEpisodes.add(key);
    let g = this.groups.get(e.group_id);
    if (!g) this.groups.set(e.group_id, (g = { episodes: new Map(), firstSeen: now }));
    if (!g.episodes.has(key)) {
      if (g.episodes.size >= this.options.groupSize) return [{ kind: 'late', uid: e.group_id, rollout_id: e.rollout_id, attempt_id: e.attempt_id }];
      g.episodes.set(key, { episode: e, pos });
    }
    return this.check(e.group_id);
  }

  /** Gives up on groups (and stray transitions) older than the timeout. */
  tick(now: number): GroupEvent[] {
    const out: GroupEvent[] = [];
    for (const [uid, g] of this.groups) {
      if (now - g.firstSeen < this.options.timeoutMs) continue;
      out.push({ kind: 'incomplete', uid, episodes: g.episodes.size, waitedMs: now - g.firstSeen });
      this.finish(uid, g);
    }
    let orphaned = 0;
    for (const [id, x] of this.transitions) {
      if (now - x.at >= this.options.timeoutMs && (x.t.group_id === null || !this.groups.has(x.t.group_id))) {
        this.transitions.delete(id);
        orphaned++;
      }
    }
    if (orphaned > 0) out.push({ kind: 'orphaned', transitions: orphaned });
    return out;
  }

  /** Per topic/partition, the lowest offset still needed (commit up to it, exclusive). */
  lowestPending(): Map<string, number> {
    const low = new Map<string, number>();
    const note = (p: Position) => {
      const k = `${p.topic}\u0000${p.partition}`;
      low.set(k, Math.min(low.get(k) ?? Infinity, p.offset));
    };
    for (const x of this.transitions.values()) note(x.pos);
    for (const g of this.groups.values()) for (const e of g.episodes.values()) note(e.pos);
    return low;
  }

  get pendingGroups(): number {
    return this.groups.size;
  }

  private check(uid: string | null): GroupEvent[] {
    if (uid === null) return [];
    const g = this.groups.get(uid);
    if (!g || g.episodes.size < this.options.groupSize) return [];
    for (const { episode } of g.episodes.values()) for (const id of episode.transition_ids) if (!this.transitions.has(id)) return [];
    const batch = this.build(uid, g);
    this.finish(uid, g);
    return [{ kind: 'group', batch }];
  }

  private finish(uid: string, g: PendingGroup): void {
    for (const { episode } of g.episodes.values()) for (const id of episode.transition_ids) this.transitions.delete(id);
    for (const [id, x] of this.transitions) if (x.t.group_id === uid) this.transitions.delete(id);
    this.groups.delete(uid);
    this.done.add(uid);
  }

  private build(uid: string, g: PendingGroup): GroupBatch {
    const episodes = [...g.episodes.values()]
      .map((p) => p.episode)
      .sort((a, b) => (a.rollout_id < b.rollout_id ? -1 : a.rollout_id > b.rollout_id ? 1 : a.attempt_id < b.attempt_id ? -1 : 1));
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
      episodes: episodes.map((e) => ({
        rollout_id: e.rollout_id,
        attempt_id: e.attempt_id,
        final_reward: e.final_reward,
        episode_status: e.episode_status,
        transitions: e.transitions,
        policy_version_lag: e.policy_version_lag ?? null,
      })),
      batch,
      skipped_no_token_ids: skipped,
    };
  }
}
