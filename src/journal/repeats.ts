import { hash } from 'node:crypto';
import type { Journal } from './journal';

/**
 * Agents resend their whole history on every call, so a rollout's requests grow turn after turn,
 * each starting with the bytes of the one before; with vLLM's `return_token_ids` every answer
 * repeats the previous prompt's token ids too. Journaling those bytes again every turn makes a
 * rollout's journal grow with the square of its turns. A body writer journals only what a body
 * adds to the previous body of the same kind in the same rollout: the bytes that repeat it become
 * a reference frame naming where they already are (see `Journal.appendRef`), the rest is
 * journaled as it is. Readers get the same bytes back either way.
 *
 * Requests are compared from their first byte. Responses are compared from just after their
 * prompt token ids begin (`"prompt_token_ids":[`): what comes before differs every call (id,
 * timestamps, the answer itself), and the ids that follow start with the previous prompt's.
 *
 * The previous body is compared byte for byte: a base holds the bytes it was given (the chunks
 * themselves, no copy), so the shared part is found with `memcmp` and ends exactly where the bodies
 * part. Bases live in memory within a byte budget (`BaseStore`); one pushed out of it keeps a
 * SHA-256 digest of each whole block of 16 KiB instead (32 bytes a block), and a body compared with
 * it is hashed block by block: nothing is read back from the journal on the hot path either way.
 */

/**
 * Where a body's bytes lie in the journal from its anchor on: extents (flat triples), how many
 * bytes they name, and either the bytes themselves or a digest of each whole block of them (what
 * the next body is compared with).
 */
export interface BodyBase {
  extents: number[];
  bytes: number;
  /** The bytes from the anchor on, as the chunks they came in; null once the base holds digests. */
  chunks: Buffer[] | null;
  /** Memory the chunks keep alive (a chunk keeps its whole allocation). */
  held: number;
  /** SHA-256 of each whole BLOCK bytes from the anchor, DIGEST bytes each (when `chunks` is null). */
  digests: Buffer | null;
  /** The lowest frame offset the extents name (a base older than its episode is not used). */
  lowest: number;
  /**
   * What the proxy noted about this body (where member names it looks for lie), for the next body
   * of the rollout: what it finds in the bytes the two share holds for both.
   */
  notes?: unknown;
}

const RESPONSE_ANCHOR = Buffer.from('"prompt_token_ids":[');
/** Bodies shorter than a block after their anchor leave no base; digests are taken a block at a time. */
export const BLOCK = 16 * 1024;
const DIGEST = 32;

export class BodyWriter {
  private seeking: boolean;
  /** Every byte so far (or every whole block, against digests) equals the base's. */
  private matching: boolean;
  /** Bytes after the anchor: seen, in the journal, and matched but not yet written as a reference. */
  private pos = 0;
  private done = 0;
  private refEnd = 0;
  /** The bytes after the anchor, as they came (the next call's base). */
  private kept: Buffer[] = [];
  /** Against bytes: where `pos` lies in the base's chunks. */
  private baseChunk = 0;
  private baseAt = 0;
  /** Against digests: bytes refEnd..pos, held until their block is compared (or the body is flushed). */
  private pending: Buffer[] = [];
  /** Against digests: the bytes of the block being filled. */
  private block: Buffer[] = [];
  private readonly own: number[] = [];
  /** While seeking: the end of the previous chunk, for an anchor cut in two. */
  private tail: Buffer | null = null;
  private readonly anchor: Buffer | null;
  /** Bytes after the anchor found equal to the base's (compared, or whole blocks whose digests matched). */
  private verified = 0;
  /** What the proxy noted about this body; goes with it into the next call's base. */
  notes: unknown = undefined;

  constructor(
    private readonly journal: Journal,
    private readonly callId: number,
    private readonly kind: 'request' | 'response',
    private readonly base: BodyBase | null,
  ) {
    this.anchor = kind === 'response' ? RESPONSE_ANCHOR : null;
    this.seeking = this.anchor !== null;
    this.matching = base !== null && (base.chunks !== null ? base.bytes > 0 : base.digests !== null && base.digests.length > 0);
  }

  /**
   * Takes one chunk of the body, pushing the offsets of the frames written onto `frames`. Bytes
   * that repeat the base are not written until the bodies part or `flush` is called. Throws when
   * the journal refuses.
   */
  write(bytes: Buffer, frames: number[]): void {
    if (bytes.length === 0) return;
    let from = 0;
    if (this.seeking) {
      from = this.anchorEnd(bytes);
      if (from < 0) {
        frames.push(this.journal.appendBody(this.callId, this.kind, bytes));
        return;
      }
      this.seeking = false;
      this.tail = null;
    }
    if (!this.matching) {
      // Nothing to compare: the chunk is one frame, and what it adds to the body is noted for the next.
      const frame = this.journal.appendBody(this.callId, this.kind, bytes);
      frames.push(frame);
      if (from < bytes.length) this.track(from > 0 ? bytes.subarray(from) : bytes, frame, from);
      return;
    }
    if (from > 0) frames.push(this.journal.appendBody(this.callId, this.kind, bytes.subarray(0, from)));
    if (from < bytes.length) {
      const rest = from > 0 ? bytes.subarray(from) : bytes;
      if (this.base!.chunks !== null) this.compare(rest, frames);
      else this.consume(rest, frames);
    }
  }

  /**
   * Takes consecutive chunks of the body (a streamed answer's, handed over together): once the
   * body has parted from its base, or has none, they are one frame.
   */
  writeParts(parts: readonly Buffer[], frames: number[]): void {
    let i = 0;
    while (i < parts.length && (this.seeking || this.matching)) this.write(parts[i++], frames);
    const rest = i === 0 ? parts : parts.slice(i);
    let length = 0;
    for (const p of rest) length += p.length;
    if (length === 0) return;
    const frame = this.journal.appendBody(this.callId, this.kind, rest);
    frames.push(frame);
    let from = 0;
    for (const p of rest) {
      if (p.length > 0) this.track(p, frame, from);
      from += p.length;
    }
  }

  /**
   * How many of the body's first bytes (after its anchor) are known to equal the base's: 0 without
   * a base. It stops growing where the bodies part.
   */
  get shared(): number {
    return this.verified;
  }

  /** What was noted about the base's bytes (see `BodyBase.notes`). */
  get baseNotes(): unknown {
    return this.base?.notes;
  }

  /** Writes what is held: the agent is about to get these bytes, or the body is complete. */
  flush(frames: number[]): void {
    this.writeRef(frames);
    this.writeLiteral(this.pending, frames);
    this.pending = [];
  }

  /**
   * Lets go of the body's bytes (the call is over, or its body is sent again); `result` must come
   * first. The writer itself may outlive its call in the old generation of the heap; what it
   * points to must not.
   */
  close(): void {
    this.block = [];
    this.pending = [];
    this.kept = [];
    this.tail = null;
  }

  /**
   * This body as the base for the next one of its rollout: its bytes after the anchor and where
   * they are (null when it has no anchor or is shorter than a block). Flush first.
   */
  result(): BodyBase | null {
    if (this.seeking || this.pos < BLOCK) return null;
    let lowest = Infinity;
    for (let i = 0; i < this.own.length; i += 3) lowest = Math.min(lowest, this.own[i]);
    let held = 0;
    let last: ArrayBufferLike | null = null;
    for (const c of this.kept) {
      if (c.buffer !== last) held += c.buffer.byteLength;
      last = c.buffer;
    }
    let chunks = this.kept;
    if (held > 2 * this.pos + 64 * 1024) {
      // Small pieces of big allocations: one copy costs less than what they keep alive.
      chunks = [Buffer.concat(chunks, this.pos)];
      held = this.pos;
    }
    return { extents: this.own.slice(), bytes: this.pos, chunks, held, digests: null, lowest, notes: this.notes };
  }

  /** Against the base's bytes: the shared part becomes a reference, the rest is written as it is. */
  private compare(bytes: Buffer, frames: number[]): void {
    const base = this.base!;
    const n = Math.min(bytes.length, base.bytes - this.pos);
    let same = 0;
    const chunks = base.chunks!;
    while (same < n) {
      const c = chunks[this.baseChunk];
      const take = Math.min(c.length - this.baseAt, n - same);
      const equal = sameBytes(bytes, same, c, this.baseAt, take);
      same += equal;
      this.baseAt += equal;
      if (this.baseAt === c.length) {
        this.baseChunk++;
        this.baseAt = 0;
      }
      if (equal < take) break;
    }
    this.pos += same;
    this.refEnd = this.pos;
    this.verified = this.pos;
    if (same === bytes.length) {
      this.kept.push(bytes);
      return;
    }
    // The bodies part here: the shared bytes go out as a reference, the rest as it is.
    this.matching = false;
    this.writeRef(frames);
    const rest = same > 0 ? bytes.subarray(same) : bytes;
    if (same > 0) this.kept.push(bytes.subarray(0, same));
    const frame = this.journal.appendBody(this.callId, this.kind, rest);
    frames.push(frame);
    this.track(rest, frame, 0);
  }

  /** Against digests: bytes are held until their block is compared. */
  private consume(bytes: Buffer, frames: number[]): void {
    for (let at = 0; at < bytes.length;) {
      if (!this.matching) {
        const rest = at === 0 ? bytes : bytes.subarray(at);
        const frame = this.journal.appendBody(this.callId, this.kind, rest);
        frames.push(frame);
        this.track(rest, frame, 0);
        return;
      }
      const blockEnd = (Math.floor(this.pos / BLOCK) + 1) * BLOCK;
      const n = Math.min(blockEnd - this.pos, bytes.length - at);
      const part = n === bytes.length ? bytes : bytes.subarray(at, at + n);
      at += n;
      this.pending.push(part);
      this.kept.push(part);
      this.block.push(part);
      this.pos += n;
      if (this.pos !== blockEnd) continue;
      const digest = hash('sha256', this.block.length === 1 ? this.block[0] : Buffer.concat(this.block, BLOCK), 'buffer');
      this.block = [];
      const i = blockEnd / BLOCK - 1;
      const digests = this.base!.digests!;
      if (digests.length >= (i + 1) * DIGEST && digest.equals(digests.subarray(i * DIGEST, (i + 1) * DIGEST))) {
        this.refEnd = this.pos;
        this.verified = this.pos;
        this.pending = [];
      } else {
        // The bodies part in this block: what is held goes out as it is, and so does the rest.
        this.matching = false;
        this.block = [];
        this.flush(frames);
      }
    }
  }

  /** Bytes `from`.. of `frame` (`bytes`), just written as they are: the body's next bytes. */
  private track(bytes: Buffer, frame: number, from: number): void {
    this.kept.push(bytes);
    this.pos += bytes.length;
    this.written(frame, from, bytes.length);
  }

  private writeRef(frames: number[]): void {
    if (this.refEnd <= this.done) return;
    const part = slice(this.base!.extents, this.done, this.refEnd - this.done);
    frames.push(this.journal.appendRef(this.callId, this.kind, part));
    for (let i = 0; i < part.length; i += 3) this.keep(part[i], part[i + 1], part[i + 2]);
    this.done = this.refEnd;
  }

  private writeLiteral(parts: Buffer[], frames: number[]): void {
    if (parts.length === 0) return;
    const f = this.journal.appendBody(this.callId, this.kind, parts);
    frames.push(f);
    let n = 0;
    for (const p of parts) n += p.length;
    this.written(f, 0, n);
  }

  /** `length` bytes of `frame` from `start` are the body's next bytes, written as they are. */
  private written(frame: number, start: number, length: number): void {
    this.keep(frame, start, length);
    this.done += length;
    this.refEnd = this.done;
  }

  private keep(frame: number, start: number, length: number): void {
    if (length === 0) return;
    const n = this.own.length;
    // Consecutive bytes of one frame are one extent.
    if (n > 0 && this.own[n - 3] === frame && this.own[n - 2] + this.own[n - 1] === start) this.own[n - 1] += length;
    else this.own.push(frame, start, length);
  }

  /** Where the anchor ends in `bytes` (it may begin in the previous chunk), or -1. */
  private anchorEnd(bytes: Buffer): number {
    const anchor = this.anchor!;
    const i = bytes.indexOf(anchor);
    if (i >= 0) return i + anchor.length;
    if (this.tail) {
      const joined = Buffer.concat([this.tail, bytes.subarray(0, anchor.length - 1)]);
      const j = joined.indexOf(anchor);
      if (j >= 0) return j + anchor.length - this.tail.length;
    }
    const keep = Math.min(anchor.length - 1, bytes.length);
    this.tail = Buffer.from(bytes.subarray(bytes.length - keep));
    return -1;
  }
}

/** How many leading bytes of a[ai..ai+n) equal b[bi..bi+n) (memcmp, halving down to where they part). */
export function sameBytes(a: Buffer, ai: number, b: Buffer, bi: number, n: number): number {
  if (n === 0) return 0;
  if (a.compare(b, bi, bi + n, ai, ai + n) === 0) return n;
  let lo = 0;
  let hi = n;
  // The first difference lies in [lo, hi): halve while the range is long.
  while (hi - lo > 32) {
    const mid = (lo + hi) >>> 1;
    if (a.compare(b, bi + lo, bi + mid, ai + lo, ai + mid) === 0) lo = mid;
    else hi = mid;
  }
  while (lo < hi && a[ai + lo] === b[bi + lo]) lo++;
  return lo;
}

/**
 * The bases of open rollouts, least recently used first. Their bytes stay in memory up to
 * `maxBytes`; beyond it the oldest give their bytes up for block digests (`toDigests`).
 */
export class BaseStore<K> {
  private readonly entries = new Map<K, { request: BodyBase | null; response: BodyBase | null }>();
  /** Keys whose bases still hold bytes, least recently set first. */
  private readonly inMemory = new Map<K, number>();
  private held = 0;

  constructor(
    private readonly maxEntries: number,
    private readonly maxBytes: number,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  /** Memory the bases' bytes keep alive. */
  get heldBytes(): number {
    return this.held;
  }

  get(key: K, kind: 'request' | 'response'): BodyBase | null {
    return this.entries.get(key)?.[kind] ?? null;
  }

  set(key: K, request: BodyBase | null, response: BodyBase | null): void {
    this.delete(key);
    this.entries.set(key, { request, response });
    const held = (request?.chunks ? request.held : 0) + (response?.chunks ? response.held : 0);
    if (held > 0) {
      this.inMemory.set(key, held);
      this.held += held;
    }
    if (this.entries.size > this.maxEntries) this.delete(this.entries.keys().next().value as K);
    while (this.held > this.maxBytes && this.inMemory.size > 0) {
      const oldest = this.inMemory.keys().next().value as K;
      this.held -= this.inMemory.get(oldest)!;
      this.inMemory.delete(oldest);
      const e = this.entries.get(oldest)!;
      if (e.request) e.request = toDigests(e.request);
      if (e.response) e.response = toDigests(e.response);
    }
  }

  delete(key: K): void {
    if (!this.entries.delete(key)) return;
    const held = this.inMemory.get(key);
    if (held !== undefined) {
      this.held -= held;
      this.inMemory.delete(key);
    }
  }

  clear(): void {
    this.entries.clear();
    this.inMemory.clear();
    this.held = 0;
  }
}

/** A base that keeps a digest of each whole block instead of its bytes (null when it has no whole block). */
export function toDigests(base: BodyBase): BodyBase | null {
  if (base.chunks === null) return base;
  const blocks = Math.floor(base.bytes / BLOCK);
  if (blocks === 0) return null;
  const all = base.chunks.length === 1 ? base.chunks[0] : Buffer.concat(base.chunks, base.bytes);
  const digests = Buffer.allocUnsafe(blocks * DIGEST);
  for (let i = 0; i < blocks; i++) hash('sha256', all.subarray(i * BLOCK, (i + 1) * BLOCK), 'buffer').copy(digests, i * DIGEST);
  const bytes = blocks * BLOCK;
  return {
    extents: slice(base.extents, 0, bytes),
    bytes,
    chunks: null,
    held: 0,
    digests,
    lowest: base.lowest,
    notes: base.notes,
  };
}

/** The extents naming bytes `from`..`from + length` of what `extents` name. */
export function slice(extents: readonly number[], from: number, length: number): number[] {
  const out: number[] = [];
  let skip = from;
  let left = length;
  for (let i = 0; i < extents.length && left > 0; i += 3) {
    const len = extents[i + 2];
    if (skip >= len) {
      skip -= len;
      continue;
    }
    const take = Math.min(len - skip, left);
    out.push(extents[i], extents[i + 1] + skip, take);
    left -= take;
    skip = 0;
  }
  return out;
}
