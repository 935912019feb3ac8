import { RejectedError } from '../model/component';
import type { EpisodeStatus } from '../model/records';
import type { EpisodeClose } from '../processors/episodes/assembler';
import type { Context } from './context';
import type { ExportQueue } from './export-queue';
import type { JournalRecord } from './records';

/** A record that must reach an open episode: its rollout, what it is, where it came from (metric labels). */
interface Target {
  rollout: { rolloutId: string; attemptId: string } | null;
  kind: 'reward' | 'end' | 'tool_span';
  source: string;
}

/**
 * Records in: each is appended to the journal first (its offset assigned synchronously) and
 * applied in offset order; rewards, ends and tool spans that can never apply are rejected before
 * they are journaled; a record that cannot be applied is quarantined.
 */
export class Intake {
  /** Call end records appended but not yet applied, in offset order. */
  private deferred: { record: JournalRecord; offset: number }[] = [];

  constructor(
    private readonly ctx: Context,
    private readonly queue: ExportQueue,
    private readonly applyRecord: (record: JournalRecord, offset: number) => EpisodeClose[],
  ) {}

  /**
   * Intake for the rollout API and OTLP: resolves when durable; rejects with RefusedError (full,
   * retry later) or RejectedError (can never apply: late, or for no known rollout).
   */
  submit(record: JournalRecord): Promise<unknown> {
    const { m } = this.ctx;
    try {
      const target = this.target(record);
      const rejected = target && this.rejection(target);
      if (target && rejected) {
        const { kind, source } = target;
        if (kind === 'tool_span') m.lateRecords.inc({ kind, outcome: 'rejected' });
        else m.rewards.inc({ source, kind, outcome: rejected.code });
        this.ctx.warnLimited(`rejected_${kind}_${rejected.code}`, rejected.message, { code: rejected.code });
        return Promise.reject(rejected);
      }
      const durable = this.append(record);
      // A reward span of a trace no call has shown yet is parked, not applied (the span metrics count it).
      if (target && target.kind !== 'tool_span' && target.rollout) m.rewards.inc({ source: target.source, kind: target.kind, outcome: 'applied' });
      return durable;
    } catch (err) {
      return Promise.reject(err instanceof Error ? err : new Error(String(err)));
    }
  }

  /** Appends, applies in offset order, and resolves when durable. Throws RefusedError when full. */
  append(record: JournalRecord): Promise<unknown> {
    return this.appendAt(record).durable;
  }

  appendAt(record: JournalRecord): { offset: number; durable: Promise<unknown> } {
    // A call's end record completes a call whose start the journal took (the proxy journals an end
    // only then; so does replay for a call a crash cut): it may use the room above the high
    // watermark, as rewards and ends do, so the call is recorded, truncated where its bytes were
    // refused, instead of lost. One record per call in flight when the watermark is crossed (no
    // new call starts above it); its size grows with the body frames it lists (~10 bytes each: a
    // long stream, or a translated one with a frame per event, can reach tens of KB).
    const priority = record.type === 'reward' || record.type === 'end' || record.type === 'call';
    if (!priority && this.queue.full) throw this.queue.refusal();
    // A call's start goes with its answer's first bytes (or anything else written before).
    const { offset, durable } = this.ctx.journal.append(Buffer.from(JSON.stringify(record)), priority, record.type === 'call_start');
    if (record.type === 'call') {
      // A call's end is applied once the proxy is done with the call (a microtask): the agent's
      // answer waits for the journal's write, not for the episode's bookkeeping.
      if (this.deferred.length === 0) queueMicrotask(this.applyDeferred);
      this.deferred.push({ record, offset });
    } else {
      // Records apply in offset order: ends not yet applied go first.
      this.applyDeferred();
      this.apply(record, offset);
    }
    this.ctx.journalMetrics();
    return { offset, durable };
  }

  /** Applies the call ends not applied yet (a bound function: it is queued as a microtask). */
  readonly applyDeferred = (): void => {
    while (this.deferred.length > 0) {
      const batch = this.deferred;
      this.deferred = [];
      for (const d of batch) this.apply(d.record, d.offset);
    }
  };

  /** Time passes: parked spans expire, idle episodes close. */
  tick(): void {
    const { m, router, assembler } = this.ctx;
    this.applyDeferred();
    const at = this.ctx.now();
    for (const o of router.expire(at)) m.spansClassified.inc({ kind: o.what.kind, result: 'unattributed' });
    m.pendingSpans.set(router.pending);
    this.queue.enqueue(assembler.step({ type: 'tick', at }));
  }

  private apply(record: JournalRecord, offset: number): void {
    try {
      this.queue.enqueue(this.applyRecord(record, offset));
    } catch (err) {
      this.ctx.quarantine(offset, record, err);
    }
  }

  /** What a reward, end or tool span is for (its rollout: null for a span whose trace is not known yet); null for other records. */
  private target(record: JournalRecord): Target | null {
    if (record.type === 'reward') return { rollout: record, kind: 'reward', source: record.source };
    if (record.type === 'end') return { rollout: record, kind: 'end', source: 'rollout_api' };
    if (record.type === 'span' && record.what.kind !== 'agent')
      return { rollout: this.ctx.router.rolloutOf(record), kind: record.what.kind === 'reward' ? 'reward' : 'tool_span', source: 'span' };
    return null;
  }

  /**
   * Why a reward, end or tool span cannot reach an episode, or null when it can: its episode
   * closed (within the last `closed_window` closes), or, for a reward or end, no episode of its
   * rollout attempt exists. Checked against the assembler's state where the record would apply
   * (call ends not yet applied go first), so what is accepted is applied.
   */
  private rejection({ rollout, kind }: Target): RejectedError | null {
    if (!rollout) return null;
    this.applyDeferred();
    const s = this.ctx.assembler.standing(rollout.rolloutId, rollout.attemptId);
    if (s.state === 'open') return null;
    const what = kind === 'tool_span' ? 'a tool span' : kind === 'end' ? 'an end' : 'a reward';
    const who = `rollout '${rollout.rolloutId}' attempt '${rollout.attemptId}'`;
    if (s.state === 'closed') {
      const closed = `${s.status} at ${new Date(s.at).toISOString()}, final_reward ${s.finalReward}`;
      return new RejectedError(
        'episode_closed',
        `${what} for ${who} came after its episode closed (${closed}) and cannot be applied; ${this.lateHint(s.status)}`,
      );
    }
    // A tool span may come before anything else of its rollout (an agent that traces tools only).
    if (kind === 'tool_span') return null;
    const window = this.ctx.config.processors.episodes.closed_window;
    return new RejectedError(
      'unknown_rollout',
      `${what} for ${who}, but no call of that rollout attempt went through this sidecar (or its episode closed more than ${window} closes ago): name the rollout and attempt_id of the calls it rewards`,
    );
  }

  private lateHint(status: EpisodeStatus): string {
    const e = this.ctx.config.processors.episodes;
    switch (status) {
      case 'timed_out':
        return `it had been idle for processors.episodes.idle_timeout_ms (${e.idle_timeout_ms} ms): raise it if rewards take longer`;
      case 'completed':
        return `a final reward or end closed it (after processors.episodes.tool_span_wait_ms, ${e.tool_span_wait_ms} ms): send other rewards before the final one`;
      case 'evicted':
        return `more than processors.episodes.max_open_episodes (${e.max_open_episodes}) episodes were open`;
      case 'shutdown':
        return 'the sidecar stopped while it was open';
    }
  }
}
