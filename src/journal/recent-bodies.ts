/**
 * The newest body frames' bytes, copied into one ring buffer allocated once: an episode exported
 * soon after its calls ended (a one-call rollout, a final reward right after the last answer) is
 * built without reading its bodies back from the file, and a frame read from the file is read
 * once while it is here (a rollout's bodies name the frames of its earlier bodies again and
 * again, and an episode's responses are read to build it and again to export it). Copies, not
 * references: a socket chunk keeps its whole allocation alive (often 64 KiB for 1 KiB of body),
 * so holding the chunks themselves would cost many times the bytes they hold. Frames are forgotten oldest first as
 * newer bytes overwrite them; frames over `maxFrameBytes` are not kept.
 */
export class RecentBodies {
  private ring: Buffer | null = null;
  /** Bytes ever copied in: positions below `written - size` are overwritten. */
  private written = 0;
  private readonly frames = new Map<number, { start: number; length: number }>();
  /** Frame offsets in the order they were kept, from `head` on (some may be forgotten already). */
  private order: number[] = [];
  private head = 0;

  constructor(
    private readonly size: number,
    readonly maxFrameBytes = 64 * 1024,
  ) {}

  /** Keeps a copy of a frame's bytes (the concatenation of `parts`). */
  keep(offset: number, parts: readonly Buffer[], length: number): void {
    if (length > this.maxFrameBytes || length > this.size || length === 0) return;
    this.ring ??= Buffer.allocUnsafeSlow(this.size);
    // What the new bytes will overwrite is forgotten first.
    const floor = this.written + length - this.size;
    while (this.head < this.order.length) {
      const f = this.frames.get(this.order[this.head]);
      if (f && f.start >= floor) break;
      if (f) this.frames.delete(this.order[this.head]);
      this.head++;
    }
    if (this.head > 1024 && this.head * 2 > this.order.length) {
      this.order.splice(0, this.head);
      this.head = 0;
    }
    const start = this.written;
    let at = start % this.size;
    for (const p of parts) {
      let from = 0;
      while (from < p.length) {
        const n = Math.min(p.length - from, this.size - at);
        p.copy(this.ring, at, from, from + n);
        from += n;
        at = (at + n) % this.size;
      }
    }
    this.written += length;
    this.frames.set(offset, { start, length });
    this.order.push(offset);
  }

  has(offset: number): boolean {
    return this.frames.has(offset);
  }

  /** The length of a kept frame, or -1. */
  lengthOf(offset: number): number {
    return this.frames.get(offset)?.length ?? -1;
  }

  /** Copies `length` bytes from `from` within a kept frame into `out` at `at`. */
  copy(offset: number, from: number, length: number, out: Buffer, at: number): void {
    const f = this.frames.get(offset);
    if (!f || from + length > f.length) throw new Error(`journal: body frame ${offset} is not in memory`);
    let pos = (f.start + from) % this.size;
    let done = 0;
    while (done < length) {
      const n = Math.min(length - done, this.size - pos);
      this.ring!.copy(out, at + done, pos, pos + n);
      done += n;
      pos = 0;
    }
  }

  forget(offset: number): void {
    this.frames.delete(offset);
  }
}
