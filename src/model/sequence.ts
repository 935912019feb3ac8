/**
 * Per-(rollout, attempt) call counters: `seq` starts at 0 and is assigned when a call starts.
 * Bounded: the least recently used keys are forgotten past `maxKeys` (a rollout idle that long has
 * long been closed by the idle timeout).
 */
export class SequenceCounter {
  private readonly next = new Map<string, number>();
  constructor(private readonly maxKeys = 100_000) {}

  take(rolloutId: string, attemptId: string): number {
    const key = `${rolloutId}\u0000${attemptId}`;
    const seq = this.next.get(key) ?? 0;
    this.next.delete(key);
    this.next.set(key, seq + 1);
    if (this.next.size > this.maxKeys) {
      const oldest = this.next.keys().next().value as string;
      this.next.delete(oldest);
    }
    return seq;
  }

  /** The seq last taken for a (rollout, attempt), or null when none is known. */
  last(rolloutId: string, attemptId: string): number | null {
    const next = this.next.get(`${rolloutId}\u0000${attemptId}`);
    return next === undefined ? null : next - 1;
  }

  /** How many (rollout, attempt) keys are kept. */
  get size(): number {
    return this.next.size;
  }

  /** Makes the next seq at least `seq + 1` (journal replay). */
  observe(rolloutId: string, attemptId: string, seq: number): void {
    const key = `${rolloutId}\u0000${attemptId}`;
    if ((this.next.get(key) ?? 0) <= seq) {
      this.next.delete(key);
      this.next.set(key, seq + 1);
    }
  }
}
