import type { Journal } from '../journal/journal';
import { BaseStore, BodyWriter } from '../journal/repeats';
import type { CallRecord } from '../model/records';

/**
 * Memory the bytes of open rollouts' latest bodies may keep alive (each later body is compared
 * with them byte for byte); beyond it the least recently used keep block digests instead.
 */
const MAX_BASE_BYTES = 32 * 1024 * 1024;

interface Writing {
  key: string;
  floor: number;
  failures: number;
  request: BodyWriter | null;
  response: BodyWriter | null;
}

/**
 * Calls of a rollout in flight, by call id: their bodies are journaled as what they add to the
 * rollout's previous call (see journal/repeats.ts). `floor` is the first offset of the call's
 * open episode: an older base is not used, and nothing from `floor` on is released while the call
 * is in flight (its references are written as it goes), so a reference never outlives what it
 * names. `failures` is the journal's count of failed writes when the call began: a call that saw
 * one may name frames that never reached the file, and is no base for the next.
 */
export class BodyWriters {
  private readonly writing = new Map<number, Writing>();
  /** The bodies of each rollout attempt's latest complete call, while its episode is open. */
  private readonly bases: BaseStore<string>;
  private basesFailures = 0;

  constructor(
    private readonly journal: Journal,
    private readonly maxBases: number,
  ) {
    this.bases = new BaseStore<string>(maxBases, MAX_BASE_BYTES);
  }

  /** A call of rollout attempt `key` began, its episode's first offset `floor`. */
  begin(callId: number, key: string, floor: number): void {
    // Beyond the cap (calls that never end, which the proxy does not do), calls are journaled whole.
    if (this.writing.size < this.maxBases) {
      this.writing.set(callId, { key, floor, failures: this.journal.writeFailures, request: null, response: null });
    }
  }

  /** The writer of a call's body, or null when the call's bodies are journaled whole. */
  writerFor(callId: number, kind: 'request' | 'response'): BodyWriter | null {
    const w = this.writing.get(callId);
    if (!w) return null;
    const existing = w[kind];
    if (existing) return existing;
    if (this.basesFailures !== this.journal.writeFailures) {
      // A write failed: a base may name frames that are not in the journal.
      this.bases.clear();
      this.basesFailures = this.journal.writeFailures;
    }
    const base = this.bases.get(w.key, kind);
    return (w[kind] = new BodyWriter(this.journal, callId, kind, base && base.lowest >= w.floor ? base : null));
  }

  /** The writer of a call's body so far, if any. */
  current(callId: number, kind: 'request' | 'response'): BodyWriter | null {
    return this.writing.get(callId)?.[kind] ?? null;
  }

  /** The body is sent again from its start: a new writer takes it. */
  restart(callId: number, kind: 'request' | 'response'): void {
    const w = this.writing.get(callId);
    if (!w) return;
    w[kind]?.close();
    w[kind] = null;
  }

  /** A call ended: when it completed cleanly its bodies are the base of its rollout's next call. */
  ended(record: CallRecord): void {
    const w = record.callId === undefined ? undefined : this.writing.get(record.callId);
    if (!w) return;
    this.writing.delete(record.callId!);
    const usable =
      record.status === 'ok' && !record.truncated && record.httpStatus !== null && record.httpStatus < 300 && w.failures === this.journal.writeFailures;
    if (usable) this.bases.set(w.key, w.request?.result() ?? null, w.response?.result() ?? null);
    w.request?.close();
    w.response?.close();
  }

  /** Its episode closed: its calls are no base for a later episode's. */
  forget(key: string): void {
    this.bases.delete(key);
  }

  /** The lowest offset a call in flight may still name in a reference. */
  floor(): number {
    let low = Infinity;
    for (const w of this.writing.values()) low = Math.min(low, w.floor);
    return low;
  }
}
