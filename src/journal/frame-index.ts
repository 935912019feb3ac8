/**
 * Where a segment's body frames lie: for each frame offset, the position and length of its bytes
 * in the segment file, and whether it is a reference frame (its bytes are extents). Kept as three
 * growing typed arrays sorted by offset (frames are written in offset order), found by binary
 * search: the offset as its distance from the segment's first offset (4 bytes), the position
 * (8), the length (4; a reference frame's as -(length + 1)): 16 bytes a frame, grown by half
 * again when full. A sidecar holds every frame of its journal through an exporter outage (a
 * 10-minute one at the soak's load: millions), so the bytes a frame count.
 */
export class FrameIndex {
  private offsets = new Uint32Array(16);
  private positions = new Float64Array(16);
  private lengths = new Int32Array(16);
  private n = 0;

  /** `base`: the segment's first offset; a frame below it moves the base down (see `add`). */
  constructor(private base = 0) {}

  /** How many frames are indexed. */
  get size(): number {
    return this.n;
  }

  add(offset: number, pos: number, len: number, ref: boolean): void {
    // A segment's frames are at or above its first offset; should one ever come from below, the
    // stored distances move with the base rather than the frame being lost.
    if (offset < this.base || (this.n === 0 && offset - this.base > 0xffffffff)) this.rebase(offset);
    const rel = offset - this.base;
    if (rel > 0xffffffff) throw new RangeError(`frame offset ${offset} is over 2^32 past its segment's first offset ${this.base}`);
    if (this.n === this.offsets.length) this.grow();
    // Frames arrive in offset order; anything else is put in its place.
    let i = this.n;
    if (i > 0 && this.offsets[i - 1] >= rel) {
      i = this.lowerBound(rel);
      if (i < this.n && this.offsets[i] === rel) {
        this.set(i, rel, pos, len, ref);
        return;
      }
      this.offsets.copyWithin(i + 1, i, this.n);
      this.positions.copyWithin(i + 1, i, this.n);
      this.lengths.copyWithin(i + 1, i, this.n);
    }
    this.set(i, rel, pos, len, ref);
    this.n++;
  }

  /** The index of the frame at `offset`, or -1. */
  find(offset: number): number {
    const rel = offset - this.base;
    if (!(rel >= 0 && rel <= 0xffffffff)) return -1;
    const i = this.lowerBound(rel);
    return i < this.n && this.offsets[i] === rel ? i : -1;
  }

  offsetAt(i: number): number {
    return this.base + this.offsets[i];
  }

  pos(i: number): number {
    return this.positions[i];
  }

  len(i: number): number {
    const v = this.lengths[i];
    return v < 0 ? -v - 1 : v;
  }

  isRef(i: number): boolean {
    return this.lengths[i] < 0;
  }

  private rebase(base: number): void {
    const by = this.base - base;
    for (let i = 0; i < this.n; i++) {
      if (this.offsets[i] + by > 0xffffffff) throw new RangeError(`frame offsets span more than 2^32 in one segment`);
      this.offsets[i] += by;
    }
    this.base = base;
  }

  private grow(): void {
    const size = this.offsets.length + Math.max(16, this.offsets.length >> 1);
    const offsets = new Uint32Array(size);
    const positions = new Float64Array(size);
    const lengths = new Int32Array(size);
    offsets.set(this.offsets);
    positions.set(this.positions);
    lengths.set(this.lengths);
    this.offsets = offsets;
    this.positions = positions;
    this.lengths = lengths;
  }

  private set(i: number, rel: number, pos: number, len: number, ref: boolean): void {
    this.offsets[i] = rel;
    this.positions[i] = pos;
    this.lengths[i] = ref ? -len - 1 : len;
  }

  /** The first index whose relative offset is ≥ `rel`. */
  private lowerBound(rel: number): number {
    let lo = 0;
    let hi = this.n;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.offsets[mid] < rel) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}
