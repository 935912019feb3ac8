import type { SpillRef } from '../journal/spill';
import type { EpisodeClose } from '../processors/episodes/assembler';

/** One closed episode waiting on disk, as it comes out of the queue. */
export interface SpilledEpisode {
  /** Where it waits; null when it could not be written there and waits in memory (`close`). */
  ref: SpillRef | null;
  /** What `ref` holds: the episode's records encoded ahead by the exporter, or its facts (JSON). */
  encoded: boolean;
  close: EpisodeClose | null;
  firstOffset: number;
  marker: number;
  weight: number;
  /** Its close marker's write, while that is not settled; resolved otherwise. */
  durable: Promise<unknown>;
}

/** The `durable` of an episode whose close marker needs no wait (replayed, or none journaled). */
export const SETTLED: Promise<unknown> = Promise.resolve();

/** The ring's size when empty. */
const INITIAL = 1024;

/**
 * The closed episodes that wait for the exporter on disk, in close order: what a long exporter
 * outage queues (hundreds of thousands of episodes). Each is held as seven numbers in typed arrays
 * (37 bytes), not as an object with its spill reference and promise (about 160 bytes): the
 * queue's memory stays a small fraction of what it would hold, however long the outage.
 * An episode that could not be written to disk keeps its place here and its close in memory.
 */
export class SpilledEpisodes {
  private file!: Uint32Array;
  private at!: Float64Array;
  private length_!: Uint32Array;
  private first!: Float64Array;
  private marker!: Float64Array;
  private weight!: Uint32Array;
  private encoded!: Uint8Array;
  /** The ring's first entry and its count. */
  private head = 0;
  private n = 0;
  /**
   * Entries by sequence number whose close is in memory: not written yet (an exporter that encodes
   * ahead has it written in the background), or a spill write failed. In sequence order.
   */
  private readonly held = new Map<number, EpisodeClose>();
  /** Entries by sequence number whose close marker is not written yet. */
  private readonly writing = new Map<number, Promise<unknown>>();
  /** Sequence number of the ring's first entry (grows by one per entry taken). */
  private seq = 0;

  constructor() {
    this.resize(INITIAL);
  }

  get length(): number {
    return this.n;
  }

  /** The marker of the first entry (Infinity when empty). */
  get firstMarker(): number {
    return this.n === 0 ? Infinity : this.marker[this.head];
  }

  /** The first entry whose close is in memory, by sequence number (null when none is). */
  firstHeld(): { seq: number; close: EpisodeClose; weight: number } | null {
    for (const [seq, close] of this.held) return { seq, close, weight: this.weight[this.index(seq)] };
    return null;
  }

  /**
   * The first entry from sequence number `from` on that waits on disk as facts (not encoded), or
   * null; `seq` is where to go on from next time.
   */
  nextFacts(from: number): { seq: number; ref: SpillRef; weight: number } | null {
    for (let seq = Math.max(from, this.seq), end = this.seq + this.n; seq < end; seq++) {
      const i = this.index(seq);
      if (this.at[i] >= 0 && this.encoded[i] === 0) return { seq, ref: this.refAt(i)!, weight: this.weight[i] };
    }
    return null;
  }

  /** An entry held in memory (`firstHeld`), or waiting on disk, is written (again): it waits at `ref` now. */
  store(seq: number, ref: SpillRef, encoded: boolean): void {
    if (seq < this.seq || seq >= this.seq + this.n) throw new RangeError(`spilled episode ${seq} is not in the queue`);
    const i = this.index(seq);
    if (!this.held.delete(seq) && this.at[i] < 0) throw new RangeError(`spilled episode ${seq} is neither held nor on disk`);
    this.file[i] = ref.file;
    this.at[i] = ref.at;
    this.length_[i] = ref.length;
    this.encoded[i] = encoded ? 1 : 0;
  }

  private index(seq: number): number {
    return (this.head + (seq - this.seq)) % this.file.length;
  }

  /** Where the entry at ring index `i` waits on disk (null when it is held in memory). */
  private refAt(i: number): SpillRef | null {
    return this.at[i] < 0 ? null : { file: this.file[i], at: this.at[i], length: this.length_[i] };
  }

  push(e: Omit<SpilledEpisode, 'durable' | 'encoded'> & { encoded?: boolean }, durable: Promise<unknown>): void {
    if (this.n === this.file.length) this.resize(this.file.length + (this.file.length >> 1));
    const i = (this.head + this.n) % this.file.length;
    const seq = this.seq + this.n;
    this.file[i] = e.ref?.file ?? 0;
    this.at[i] = e.ref?.at ?? -1;
    this.length_[i] = e.ref?.length ?? 0;
    this.encoded[i] = e.ref && e.encoded ? 1 : 0;
    this.first[i] = e.firstOffset;
    this.marker[i] = e.marker;
    this.weight[i] = e.weight;
    if (!e.ref) this.held.set(seq, e.close!);
    if (durable !== SETTLED) {
      this.writing.set(seq, durable);
      const forget = (): void => {
        this.writing.delete(seq);
      };
      durable.then(forget, forget);
    }
    this.n++;
  }

  /** Takes the first entry. */
  shift(): SpilledEpisode {
    if (this.n === 0) throw new RangeError('no spilled episode to take');
    const i = this.head;
    const seq = this.seq;
    const close = this.held.get(seq) ?? null;
    const e: SpilledEpisode = {
      ref: this.refAt(i),
      encoded: this.encoded[i] === 1,
      close,
      firstOffset: this.first[i],
      marker: this.marker[i],
      weight: this.weight[i],
      durable: this.writing.get(seq) ?? SETTLED,
    };
    this.held.delete(seq);
    this.writing.delete(seq);
    this.head = (this.head + 1) % this.file.length;
    this.n--;
    this.seq++;
    // Empty again: the arrays a long outage grew are given back.
    if (this.n === 0 && this.file.length !== INITIAL) this.resize(INITIAL);
    else if (this.n === 0) this.head = 0;
    return e;
  }

  /** The lowest first offset among the entries (Infinity when empty). */
  lowestFirstOffset(): number {
    let low = Infinity;
    const size = this.file.length;
    for (let k = 0, i = this.head; k < this.n; k++, i = i + 1 === size ? 0 : i + 1) if (this.first[i] < low) low = this.first[i];
    return low;
  }

  /** New arrays of `size` holding the entries in order from index 0 (none on the first call). */
  private resize(size: number): void {
    const move = <T extends Uint8Array | Uint32Array | Float64Array>(a: T | undefined, make: (n: number) => T): T => {
      const b = make(size);
      for (let k = 0; k < this.n; k++) b[k] = a![(this.head + k) % a!.length];
      return b;
    };
    this.file = move(this.file, (s) => new Uint32Array(s));
    this.at = move(this.at, (s) => new Float64Array(s));
    this.length_ = move(this.length_, (s) => new Uint32Array(s));
    this.first = move(this.first, (s) => new Float64Array(s));
    this.marker = move(this.marker, (s) => new Float64Array(s));
    this.weight = move(this.weight, (s) => new Uint32Array(s));
    this.encoded = move(this.encoded, (s) => new Uint8Array(s));
    this.head = 0;
  }
}
