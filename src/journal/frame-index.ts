/** Frames a block: one checkpoint (first offset, position, where its bytes start) for each. */
const BLOCK = 64;

/**
 * Where a segment's body frames lie: for each frame offset, the position and length of its bytes
 * in the segment file, and whether it is a reference frame (its bytes are extents).
 *
 * A sidecar holds every frame of its journal through an exporter outage (a 10-minute one at the
 * soak's load: millions), so the bytes a frame count. Frames are kept in offset order as
 * variable-length deltas from the frame before: offset distance, position distance (zigzag), and
 * length·2 + reference: 5 to 7 bytes a frame for bodies of up to a few hundred KB, against 16
 * in three typed arrays, 24 before that. Every 64 frames a checkpoint holds the block's first
 * offset and position in full and where its bytes start, so a lookup is a binary search over the
 * checkpoints and a decode of at most 64 frames; the last decoded frame is kept, so a walk in
 * index order and `find` followed by `pos`/`len` decode each frame once.
 *
 * Frames arrive in offset order (the journal writes them so). One that does not, or one below the
 * segment's first offset, is put in its place by decoding and encoding the whole index again.
 */
export class FrameIndex {
  /** The encoded frames. */
  private bytes = new Uint8Array(256);
  private used = 0;
  /** Per block: its first frame's offset (from `base`), its position, where its bytes start. */
  private blockRel: number[] = [];
  private blockPos: number[] = [];
  private blockAt: number[] = [];
  private n = 0;
  /** The last frame added, what the next one is encoded against. */
  private lastRel = -1;
  private lastPos = 0;
  /** The frame last decoded (`at`: where the next one's bytes start). */
  private cur = { i: -1, rel: 0, pos: 0, len: 0, ref: false, at: 0 };

  /** `base`: the segment's first offset; a frame below it moves the base down (see `add`). */
  constructor(private base = 0) {}

  /** How many frames are indexed. */
  get size(): number {
    return this.n;
  }

  /** Bytes the index holds (its encoded frames and checkpoints). */
  get heldBytes(): number {
    return this.bytes.length + this.blockRel.length * 3 * 8;
  }

  add(offset: number, pos: number, len: number, ref: boolean): void {
    const rel = offset - this.base;
    if (rel <= this.lastRel) {
      this.insert(offset, pos, len, ref);
      return;
    }
    if (this.n % BLOCK === 0) {
      this.blockRel.push(rel);
      this.blockPos.push(pos);
      this.blockAt.push(this.used);
    } else {
      this.put(rel - this.lastRel);
      const d = pos - this.lastPos;
      this.put(d >= 0 ? d * 2 : -d * 2 - 1);
    }
    this.put(len * 2 + (ref ? 1 : 0));
    this.lastRel = rel;
    this.lastPos = pos;
    this.n++;
  }

  /** Gives back what the encoded frames do not use (a segment that is written to no more). */
  trim(): void {
    if (this.bytes.length > this.used) this.bytes = this.bytes.slice(0, this.used);
  }

  /** The index of the frame at `offset`, or -1. */
  find(offset: number): number {
    const rel = offset - this.base;
    if (!(rel >= 0) || this.n === 0) return -1;
    // The last block whose first offset is ≤ rel.
    let lo = 0;
    let hi = this.blockRel.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.blockRel[mid] <= rel) lo = mid + 1;
      else hi = mid;
    }
    if (lo === 0) return -1;
    const block = lo - 1;
    const end = Math.min(this.n, (block + 1) * BLOCK);
    const c = this.cur;
    let i = c.i >= block * BLOCK && c.i < end && c.rel <= rel ? c.i : this.decode(block * BLOCK);
    while (c.rel < rel && i + 1 < end) i = this.decode(i + 1);
    return c.rel === rel ? i : -1;
  }

  offsetAt(i: number): number {
    return this.base + this.at(i).rel;
  }

  pos(i: number): number {
    return this.at(i).pos;
  }

  len(i: number): number {
    return this.at(i).len;
  }

  isRef(i: number): boolean {
    return this.at(i).ref;
  }

  private at(i: number): FrameIndex['cur'] {
    if (!(i >= 0 && i < this.n)) throw new RangeError(`frame index ${i} is not in 0..${this.n - 1}`);
    if (this.cur.i !== i) this.decode(i);
    return this.cur;
  }

  /** Decodes frame `i` into `cur`, going on from `cur` when it is an earlier frame of the same block. */
  private decode(i: number): number {
    const c = this.cur;
    const block = Math.floor(i / BLOCK);
    if (!(c.i >= block * BLOCK && c.i <= i)) {
      c.i = block * BLOCK;
      c.rel = this.blockRel[block];
      c.pos = this.blockPos[block];
      c.at = this.blockAt[block];
      this.lengthAt(c);
    }
    while (c.i < i) {
      c.i++;
      c.rel += this.get(c);
      const z = this.get(c);
      c.pos += z % 2 === 0 ? z / 2 : -(z + 1) / 2;
      this.lengthAt(c);
    }
    return i;
  }

  private lengthAt(c: FrameIndex['cur']): void {
    const v = this.get(c);
    c.ref = v % 2 === 1;
    c.len = (v - (v % 2)) / 2;
  }

  /** Reads the varint at `c.at`, moving past it. */
  private get(c: { at: number }): number {
    let v = 0;
    let scale = 1;
    for (;;) {
      const b = this.bytes[c.at++];
      v += (b & 0x7f) * scale;
      if (b < 0x80) return v;
      scale *= 128;
    }
  }

  /** Appends `v` (a non-negative integer up to 2^53) as a varint. */
  private put(v: number): void {
    if (this.used + 8 > this.bytes.length) {
      const bigger = new Uint8Array(this.bytes.length + Math.max(256, this.bytes.length >> 1));
      bigger.set(this.bytes.subarray(0, this.used));
      this.bytes = bigger;
    }
    while (v >= 0x80) {
      this.bytes[this.used++] = (v % 128) | 0x80;
      v = Math.floor(v / 128);
    }
    this.bytes[this.used++] = v;
  }

  /** A frame out of offset order, or below the base: every frame is encoded again, in order. */
  private insert(offset: number, pos: number, len: number, ref: boolean): void {
    const frames: [number, number, number, boolean][] = [];
    for (let i = 0; i < this.n; i++) {
      const f = this.at(i);
      if (this.base + f.rel !== offset) frames.push([this.base + f.rel, f.pos, f.len, f.ref]);
    }
    frames.push([offset, pos, len, ref]);
    frames.sort((a, b) => a[0] - b[0]);
    this.base = Math.min(this.base, offset);
    this.bytes = new Uint8Array(256);
    this.used = 0;
    this.blockRel = [];
    this.blockPos = [];
    this.blockAt = [];
    this.n = 0;
    this.lastRel = -1;
    this.lastPos = 0;
    this.cur.i = -1;
    for (const [o, p, l, r] of frames) this.add(o, p, l, r);
  }
}
