import type { PromptIdsDelta } from '../../model/prompt-delta';
import type { TransitionRecord } from '../../model/records';
import type { TransitionWriter } from '../transition-json';

/**
 * Walks an episode's transitions in order and, for each that continues the previous call,
 * gives the delta: the previous call's (first choice's) prompt and answer ids are the prefix.
 * Holds one call's ids at a time.
 */
export class DeltaTracker {
  private prev: { id: string; ids: number[] } | null = null;
  private pending: { seq: number; id: string; ids: number[] } | null = null;
  private lastSeq = -1;

  constructor(private readonly writer: TransitionWriter) {}

  /** The delta for `t`, or null when it must carry its full prompt. Call in order, every transition. */
  next(t: TransitionRecord): PromptIdsDelta | null {
    if (t.seq !== this.lastSeq) {
      if (this.pending) this.prev = { id: this.pending.id, ids: this.pending.ids };
      else this.prev = null;
      this.pending = null;
      this.lastSeq = t.seq;
    }
    const prompt = this.writer.ids(t, t.prompt_token_ids);
    if (t.choice_index === 0 || this.pending === null) {
      const response = this.writer.ids(t, t.response_token_ids);
      this.pending = prompt && response ? { seq: t.seq, id: t.transition_id, ids: prompt.concat(response) } : null;
    }
    const prev = this.prev;
    if (!t.continues_previous || prev === null || prompt === null || prompt.length < prev.ids.length) return null;
    for (let i = 0; i < prev.ids.length; i++) if (prompt[i] !== prev.ids[i]) return null;
    return { previous_transition_id: prev.id, prefix_length: prev.ids.length, suffix: prompt.slice(prev.ids.length) };
  }
}
