/**
 * Where a segment's body frames lie: for each frame offset, the position and length of its bytes
 * in the segment file, and whether it is a reference frame (its bytes are extents). Kept as one
 * growing Float64Array of triples sorted by offset (frames are written in offset order), found by
 * binary search: 24 bytes a frame. A Map of small arrays cost ~100 bytes a frame, and a
 * sidecar with many episodes open holds hundreds of thousands of frames.
 */
export class FrameIndex {
  /** Triples: offset, position, length (a reference frame's as -(length + 1)). */
  private data = new Float64Array(3 * 16);
  private n = 0;

  /** How many frames are indexed. */
  get size(): number {
    return this.n;
  }

  add(offset: number, pos: number, len: number, ref: boolean): void {
    if (3 * (this.n + 1) > this.data.length) {
      const grown = new Float64Array(this.data.length * 2);
      grown.set(this.data);
      this.data = grown;
    }
    // Frames arrive in offset order; anything else is put in its place.
    let i = this.n;
    if (i > 0 && this.data[3 * (i - 1)] >= offset) {
      i = this.lowerBound(offset);
      if (i < this.n && this.data[3 * i] === offset) {
        this.set(i, offset, pos, len, ref);
        return;
      }
      this.data.copyWithin(3 * (i + 1), 3 * i, 3 * this.n);
    }
    this.set(i, offset, pos, len, ref);
    this.n++;
  }

  /** The index of the frame at `offset`, or -1. */
  find(offset: number): number {
    const i = this.lowerBound(offset);
    return i < this.n && this.data[3 * i] === offset ? i : -1;
  }

  offsetAt(i: number): number {
    return this.data[3 * i];
  }

  pos(i: number): number {
    return this.data[3 * i + 1];
  }

  len(i: number): number {
    const v = this.data[3 * i + 2];
    return v < 0 ? -v - 1 : v;
  }

  isRef(i: number): boolean {
    return this.data[3 * i + 2] < 0;
  }

  private set(i: number, offset: number, pos: number, len: number, ref: boolean): void {
    this.data[3 * i] = offset;
    this.data[3 * i + 1] = pos;
    this.data[3 * i + 2] = ref ? -len - 1 : len;
  }

  /** The first index whose offset is ≥ `offset`. */
  private lowerBound(offset: number): number {
    let lo = 0;
    let hi = this.n;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.data[3 * mid] < offset) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}
