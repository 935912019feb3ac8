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
 * Bodies are compared in blocks of 16 KiB by SHA-256 digest (kept for the previous body of each
 * rollout, 32 bytes a block), so nothing is read back on the hot path; a block whose digest
 * differs, and the rest of the body after it, is journaled as it is.
 */

/**
 * Where a body's bytes lie in the journal from its anchor on: extents (flat triples), how many
 * bytes they name, and a digest of each whole block of them (what the next body is compared with).
 */
export interface BodyBase {
  extents: number[];
  bytes: number;
  /** SHA-256 of each whole BLOCK bytes from the anchor, DIGEST bytes each. */
  digests: Buffer;
  /** The lowest frame offset the extents name (a base older than its episode is not used). */
  lowest: number;
}

const RESPONSE_ANCHOR = Buffer.from('"prompt_token_ids":[');
/** Bodies are compared block by block, by digest: no read of the journal on the hot path. */
export const BLOCK = 16 * 1024;
const DIGEST = 32;

export class BodyWriter {
  private seeking: boolean;
  /** Every whole block so far equals the base's. */
  private matching: boolean;
  /** Bytes after the anchor: seen, in the journal, and matched but not yet written as a reference. */
  private pos = 0;
  private done = 0;
  private refEnd = 0;
  /** Bytes refEnd..pos, held until their block is compared (or the body is flushed). */
  private pending: Buffer[] = [];
  /** The bytes of the block being filled (hashed once it is whole: a body shorter than a block is never hashed). */
  private block: Buffer[] = [];
  private readonly digests: Buffer[] = [];
  private readonly own: number[] = [];
  /** While seeking: the end of the previous chunk, for an anchor cut in two. */
  private tail: Buffer | null = null;
  private readonly anchor: Buffer | null;

  constructor(
    private readonly journal: Journal,
    private readonly callId: number,
    private readonly kind: 'request' | 'response',
    private readonly base: BodyBase | null,
  ) {
    this.anchor = kind === 'response' ? RESPONSE_ANCHOR : null;
    this.seeking = this.anchor !== null;
    this.matching = base !== null && base.digests.length > 0;
  }

  /**
   * Takes one chunk of the body, pushing the offsets of the frames written onto `frames`. Bytes
   * that may repeat the base are held until their block is whole; `flush` writes them out.
   * Throws when the journal refuses.
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
      // Nothing to hold: the chunk is one frame, and what it adds to the body is noted for the next.
      const frame = this.journal.appendBody(this.callId, this.kind, bytes);
      frames.push(frame);
      this.track(bytes, from, frame);
      return;
    }
    if (from > 0) frames.push(this.journal.appendBody(this.callId, this.kind, bytes.subarray(0, from)));
    if (from < bytes.length) this.consume(from > 0 ? bytes.subarray(from) : bytes, frames);
  }

  /** Writes what is held: the agent is about to get these bytes, or the body is complete. */
  flush(frames: number[]): void {
    this.writeRef(frames);
    this.writeLiteral(this.pending, frames);
    this.pending = [];
  }

  /**
   * Lets go of the body's bytes (the call is over, or its body is sent again). The writer itself
   * may outlive its call in the old generation of the heap; what it points to must not.
   */
  close(): void {
    this.block = [];
    this.pending = [];
    this.tail = null;
  }

  /**
   * This body as the base for the next one of its rollout: its whole blocks, which is all a later
   * body can match (null when it has no anchor or no whole block). Flush first.
   */
  result(): BodyBase | null {
    if (this.seeking || this.digests.length === 0) return null;
    const bytes = this.digests.length * BLOCK;
    const extents = slice(this.own, 0, bytes);
    let lowest = Infinity;
    for (let i = 0; i < extents.length; i += 3) lowest = Math.min(lowest, extents[i]);
    return { extents, bytes, digests: Buffer.concat(this.digests), lowest };
  }

  /** While every block so far matches: bytes are held until their block is compared. */
  private consume(bytes: Buffer, frames: number[]): void {
    for (let at = 0; at < bytes.length;) {
      if (!this.matching) {
        const rest = at === 0 ? bytes : bytes.subarray(at);
        const frame = this.journal.appendBody(this.callId, this.kind, rest);
        frames.push(frame);
        this.track(rest, 0, frame);
        return;
      }
      const blockEnd = (Math.floor(this.pos / BLOCK) + 1) * BLOCK;
      const n = Math.min(blockEnd - this.pos, bytes.length - at);
      const part = n === bytes.length ? bytes : bytes.subarray(at, at + n);
      at += n;
      this.pending.push(part);
      const digest = this.hashed(part);
      if (digest === null) continue;
      const i = blockEnd / BLOCK - 1;
      const base = this.base!;
      if (base.digests.length >= (i + 1) * DIGEST && digest.equals(base.digests.subarray(i * DIGEST, (i + 1) * DIGEST))) {
        this.refEnd = this.pos;
        this.pending = [];
      } else {
        // The bodies part here: what is held goes out as it is, and so does the rest.
        this.matching = false;
        this.flush(frames);
      }
    }
  }

  /** Bytes `from`.. of `bytes`, just written as (the same bytes of) `frame`: part of this body. */
  private track(bytes: Buffer, from: number, frame: number): void {
    if (from >= bytes.length) return;
    this.written(frame, from, bytes.length - from);
    for (let at = from; at < bytes.length;) {
      const n = Math.min(BLOCK - (this.pos % BLOCK), bytes.length - at);
      this.hashed(at === 0 && n === bytes.length ? bytes : bytes.subarray(at, at + n));
      at += n;
    }
  }

  /** Counts `part` (never past the end of a block) into the body; the block's digest once it is whole. */
  private hashed(part: Buffer): Buffer | null {
    this.block.push(part);
    this.pos += part.length;
    if (this.pos % BLOCK !== 0) return null;
    const digest = hash('sha256', this.block.length === 1 ? this.block[0] : Buffer.concat(this.block, BLOCK), 'buffer');
    this.block = [];
    this.digests.push(digest);
    return digest;
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
