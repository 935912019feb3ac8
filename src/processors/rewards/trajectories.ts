import type {
  EpisodeStatus,
  SegmentStart,
  TokenIds,
  TrajectoryRecord,
  TrajectoryTurn,
  TransitionRecord,
  UnmergedReason,
  WeightVersionSpan,
} from '../../model/records';
import { resolveIds, type CallFacts } from '../../formats/extract';
import { trajectoryRouting } from '../../formats/routed-experts';
import { trajectorySamplingMask } from './sampling-mask';
import { concatIds, continuesFrom, idsLength, sameIds, startsWith } from './continuity';

/**
 * Segments kept comparable once they are no longer the latest (their last call's ids held as
 * numbers, a few hundred KB each at most); a call can continue any of them, so interleaved
 * subagents of one rollout each keep their trajectory. Past this, the least recently continued
 * one can no longer be continued: its next call starts a new segment.
 */
const MAX_TAILS = 16;

interface Choice {
  index: number;
  response: TokenIds;
  length: number;
}

interface Turn {
  seq: number;
  agent: string | null;
  prompt: TokenIds;
  promptLength: number;
  /** The choices it could be continued from; one once a later call chose, or at the end. */
  choices: Choice[];
}

interface Segment {
  index: number;
  start: SegmentStart;
  /** The segment whose call came last before this one began (same attempt), if any. */
  parent: number | null;
  turns: Turn[];
  /** Its last turn's prompt + answer ids, per choice, while it is not the latest segment. */
  tails: { choice: number; ids: Int32Array }[] | null;
  used: number;
}

/** A segment as planned: which call and choice each turn is, and where its ids lie. */
export interface PlannedSegment {
  start: SegmentStart;
  parent: number | null;
  turns: { seq: number; choice: number; responseStart: number; responseEnd: number }[];
}

export interface SegmentPlan {
  segments: PlannedSegment[];
  /** Calls (and choices; null: every choice of the call) in no segment. */
  unmerged: { seq: number; choice: number | null; reason: UnmergedReason }[];
}

/**
 * Splits an attempt's calls, in seq order, into segments: runs of calls in which each call's
 * prompt ids start with an earlier call's prompt ids followed by that call's answer ids. The rule
 * (docs/output-contract.md#how-calls-become-trajectories):
 * - a call continues the segment of the latest call it extends (the previous call first, compared
 *   as bytes; then any segment still comparable, as numbers);
 * - a call whose prompt is the prompt of a segment's last call is a retry: it replaces that call
 *   (the agent went on from the answer it got last), which is left out as `retried`;
 * - an `n > 1` call is continued from the choice the next call extends; when no call extends it,
 *   choice 0 stays; the other choices are left out as `other_choice`;
 * - otherwise the call starts a new segment: `first`, `other_agent` (its agent is not the previous
 *   call's), or `diverged` (a chat template that re-renders history, a compacted context);
 * - a call that is not `ok`, was truncated, or has no ids (or an empty answer) is left out and
 *   breaks nothing: the next call is compared with the calls before it.
 * `add` must be given each call while its response body is readable; the previous call's body
 * must stay readable until the next call has been added.
 */
export class Segmenter {
  private readonly segments: Segment[] = [];
  private readonly unmerged: SegmentPlan['unmerged'] = [];
  private prev: { seg: Segment; turn: Turn; body: Buffer | null } | null = null;
  private clock = 0;

  /** The body the next call is compared with (keep it readable until the next `add`). */
  get pinned(): Buffer | null {
    return this.prev?.body ?? null;
  }

  /** `promptLength`: its prompt's length when the caller has it (counted from `body` otherwise). */
  add(call: CallFacts, body: Buffer | null, promptLength: number | null = null): void {
    const leave = (reason: UnmergedReason): void => {
      this.unmerged.push({ seq: call.seq, choice: null, reason });
    };
    if (call.status !== 'ok') return leave('not_ok');
    if (call.truncated) return leave('truncated');
    const prompt = call.choices[0]?.promptTokenIds ?? call.promptTokenIds;
    promptLength = prompt === null ? null : (promptLength ?? idsLength(prompt, body));
    const withIds = call.choices.filter((c) => c.responseTokenIds !== null);
    if (prompt === null || promptLength === null || withIds.length === 0) return leave('no_token_ids');
    const choices: Choice[] = [];
    for (const c of withIds) {
      const length = idsLength(c.responseTokenIds!, body);
      if (length === null) this.unmerged.push({ seq: call.seq, choice: c.index, reason: 'no_token_ids' });
      else if (length === 0) this.unmerged.push({ seq: call.seq, choice: c.index, reason: 'empty_response' });
      else choices.push({ index: c.index, response: c.responseTokenIds!, length });
    }
    if (choices.length === 0) return;
    const turn: Turn = { seq: call.seq, agent: call.correlation.agentName, prompt, promptLength, choices };
    const seg = this.place(turn, body);
    seg.used = ++this.clock;
    seg.tails = null;
    this.prev = { seg, turn, body };
  }

  /** The segments and what was left out; pending choices settle on the first. */
  finish(): SegmentPlan {
    const segments = this.segments.map((s) => ({
      start: s.start,
      parent: s.parent,
      turns: s.turns.map((t) => {
        this.choose(t, t.choices[0].index);
        const c = t.choices[0];
        return { seq: t.seq, choice: c.index, responseStart: t.promptLength, responseEnd: t.promptLength + c.length };
      }),
    }));
    return { segments, unmerged: this.unmerged };
  }

  private place(turn: Turn, body: Buffer | null): Segment {
    const prev = this.prev;
    if (prev) {
      const last = prev.turn;
      for (const c of last.choices) {
        if (continuesFrom({ body, prompt: turn.prompt, response: null }, { body: prev.body, prompt: last.prompt, response: c.response })) {
          return this.extend(prev.seg, c.index, turn);
        }
      }
      if (sameIds(turn.prompt, body, last.prompt, prev.body)) return this.retry(prev.seg, turn);
      // No longer the latest: keep its ids to compare later calls with.
      this.keepTails(prev.seg, prev.body);
    }
    const ids = resolveIds(turn.prompt, body);
    if (ids !== null) {
      const candidates = this.segments.filter((s) => s.tails !== null && s !== prev?.seg).sort((a, b) => b.used - a.used);
      for (const s of candidates) {
        const lastLength = s.turns[s.turns.length - 1].promptLength;
        for (const t of s.tails!) {
          if (startsWith(ids, t.ids)) return this.extend(s, t.choice, turn);
          if (ids.length === lastLength && startsWith(t.ids, ids)) return this.retry(s, turn);
        }
      }
    }
    const start: SegmentStart = !prev ? 'first' : prev.turn.agent !== turn.agent ? 'other_agent' : 'diverged';
    const seg: Segment = { index: this.segments.length, start, parent: prev ? prev.seg.index : null, turns: [turn], tails: null, used: 0 };
    this.segments.push(seg);
    return seg;
  }

  private extend(seg: Segment, choice: number, turn: Turn): Segment {
    this.choose(seg.turns[seg.turns.length - 1], choice);
    seg.turns.push(turn);
    return seg;
  }

  /** The segment's last call is replaced by `turn`, which asked the same prompt again. */
  private retry(seg: Segment, turn: Turn): Segment {
    const replaced = seg.turns.pop()!;
    for (const c of replaced.choices) this.unmerged.push({ seq: replaced.seq, choice: c.index, reason: 'retried' });
    seg.turns.push(turn);
    return seg;
  }

  /** Keeps one choice of a turn; the others are left out. */
  private choose(turn: Turn, index: number): void {
    if (turn.choices.length === 1) return;
    for (const c of turn.choices) if (c.index !== index) this.unmerged.push({ seq: turn.seq, choice: c.index, reason: 'other_choice' });
    turn.choices = turn.choices.filter((c) => c.index === index);
  }

  private keepTails(seg: Segment, body: Buffer | null): void {
    const last = seg.turns[seg.turns.length - 1];
    const prompt = resolveIds(last.prompt, body);
    const tails: { choice: number; ids: Int32Array }[] = [];
    for (const c of last.choices) {
      const response = resolveIds(c.response, body);
      if (prompt !== null && response !== null) tails.push({ choice: c.index, ids: concatIds(prompt, response) });
    }
    seg.tails = tails;
    const kept = this.segments.filter((s) => s.tails !== null);
    if (kept.length > MAX_TAILS) kept.reduce((a, b) => (a.used <= b.used ? a : b)).tails = null;
  }
}

export interface TrajectoryContext {
  rolloutId: string;
  attemptId: string;
  groupId: string | null;
  status: EpisodeStatus;
  finalReward: number | null;
  airWeight: number;
  /** The calls' facts by seq (correlation: agent and lineage). */
  calls: Map<number, CallFacts>;
  /** The transitions by `${seq}.${choice}`. */
  transitions: Map<string, TransitionRecord>;
  /** Sampling masks were asked for: every trajectory says whether they came. */
  samplingMasks?: boolean;
  /** `processors.sampling.logprobs_mode`, recorded on every trajectory (null: not configured). */
  logprobsMode?: string | null;
}

export function trajectoryId(rolloutId: string, attemptId: string, segment: number): string {
  return `${rolloutId}/${attemptId}/s${segment}`;
}

/**
 * The trajectory records of a plan. Rewards are placed on sampled tokens: each call's AIR reward
 * (`air.weight` × its intermediate reward) on its last sampled token, the final reward on the
 * segment's last sampled token (every segment of the attempt gets it; `segments` says how many).
 */
export function buildTrajectories(plan: SegmentPlan, ctx: TrajectoryContext): TrajectoryRecord[] {
  const { rolloutId, attemptId } = ctx;
  return plan.segments.map((s, index) => {
    const turns: TrajectoryTurn[] = [];
    const turnLogprobs: (number[] | null)[] = [];
    const rewards = new Map<number, number>();
    const versions = new Set<string>();
    let last!: TransitionRecord;
    for (const t of s.turns) {
      last = ctx.transitions.get(`${t.seq}.${t.choice}`)!;
      const length = t.responseEnd - t.responseStart;
      const logprobs = last.response_logprobs !== null && last.response_logprobs.length === length ? last.response_logprobs : null;
      turns.push({
        transition_id: last.transition_id,
        seq: t.seq,
        choice_index: t.choice,
        response_start: t.responseStart,
        response_end: t.responseEnd,
        has_logprobs: logprobs !== null,
        finish_reason: last.finish_reason,
        tool_calls: last.tool_calls,
        intermediate_reward: last.intermediate_reward,
        reward: last.reward,
        policy_version: last.policy_version,
        ...(last.sampling ? { sampling: last.sampling } : {}),
      });
      turnLogprobs.push(logprobs);
      if (last.policy_version !== null) versions.add(last.policy_version);
      if (last.intermediate_reward !== null && ctx.airWeight !== 0) add(rewards, t.responseEnd - 1, ctx.airWeight * last.intermediate_reward);
    }
    const end = s.turns[s.turns.length - 1].responseEnd;
    const weightVersions = trajectoryVersions(s.turns, ctx.calls);
    const chosen = s.turns.map((t) => ({ t, choice: ctx.calls.get(t.seq)?.choices.find((c) => c.index === t.choice) }));
    const routing = trajectoryRouting(
      chosen.map(({ t, choice }) => ({
        responseStart: t.responseStart,
        responseEnd: t.responseEnd,
        routing: choice?.routing ?? null,
        error: choice?.routingError,
      })),
      end,
    );
    const samplingMask = trajectorySamplingMask(
      chosen.map(({ t, choice }) => ({ responseStart: t.responseStart, responseEnd: t.responseEnd, choice })),
      end,
      ctx.samplingMasks === true,
    );
    if (ctx.finalReward !== null) add(rewards, end - 1, ctx.finalReward);
    const tokenRewards = [...rewards].sort((a, b) => a[0] - b[0]).map(([position, value]) => ({ position, value }));
    const first = ctx.calls.get(s.turns[0].seq)!;
    const parent = first.correlation.parentRolloutId ?? null;
    const parentAttempt = parent === null ? null : (first.correlation.parentAttemptId ?? '0');
    const firstTransition = ctx.transitions.get(`${s.turns[0].seq}.${s.turns[0].choice}`)!;
    return {
      schema: 'lightning.trajectory.v1',
      trajectory_id: trajectoryId(rolloutId, attemptId, index),
      rollout_id: rolloutId,
      attempt_id: attemptId,
      group_id: firstTransition.group_id ?? ctx.groupId,
      agent_name: firstTransition.agent_name,
      segment: index,
      segments: plan.segments.length,
      start_reason: s.start,
      parent_trajectory_id: s.parent === null ? null : trajectoryId(rolloutId, attemptId, s.parent),
      parent_rollout_id: parent,
      parent_attempt_id: parentAttempt,
      parent_transition_id: parent !== null && first.correlation.parentSeq !== undefined ? `${parent}/${parentAttempt}/${first.correlation.parentSeq}` : null,
      prompt_length: s.turns[0].responseStart,
      turns,
      token_rewards: tokenRewards,
      reward: tokenRewards.reduce((n, r) => n + r.value, 0),
      final_reward: ctx.finalReward,
      episode_status: ctx.status,
      policy_versions: [...versions],
      started_at: firstTransition.started_at,
      ended_at: last.ended_at,
      last,
      length: end,
      turnLogprobs,
      routing,
      weightVersions,
      samplingMask,
      logprobsMode: ctx.logprobsMode ?? null,
      images: null,
    };
  });
}

function add(rewards: Map<number, number>, position: number, value: number): void {
  rewards.set(position, (rewards.get(position) ?? 0) + value);
}

/**
 * A segment's weight-version spans over `token_ids` positions: each turn's, shifted to where its
 * sampled ids lie (one version for the whole answer when the server gave only that), adjacent
 * equal versions merged; null when no turn's answer said. A turn whose answer said nothing leaves
 * its positions out.
 */
function trajectoryVersions(turns: PlannedSegment['turns'], calls: ReadonlyMap<number, CallFacts>): WeightVersionSpan[] | null {
  const out: WeightVersionSpan[] = [];
  let said = false;
  const push = (version: string, start: number, end: number): void => {
    if (end <= start) return;
    const last = out[out.length - 1];
    if (last && last.version === version && last.end === start) last.end = end;
    else out.push({ version, start, end });
  };
  for (const t of turns) {
    const v = calls.get(t.seq)?.choices.find((c) => c.index === t.choice)?.weightVersions;
    if (v === undefined) continue;
    said = true;
    if (!Array.isArray(v)) push(v.whole, t.responseStart, t.responseEnd);
    else for (const s of v) push(s.version, t.responseStart + s.start, Math.min(t.responseEnd, t.responseStart + s.end));
  }
  return said ? out : null;
}
