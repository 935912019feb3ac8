import { close, closeSync, fdatasync, fstatSync, fsyncSync, ftruncateSync, mkdirSync, openSync, readdirSync, readSync, writeSync, writevSync } from 'node:fs';
import { unlink } from 'node:fs/promises';
import path from 'node:path';
import { RefusedError } from '../model/component';
import type { Logger } from '../telemetry/logger';
import { FrameIndex } from './frame-index';
import { RecentBodies } from './recent-bodies';
import {
  BODY_HEADER_BYTES,
  bodyHeader,
  decodeExtents,
  decodeFrame,
  encodeExtents,
  frameHeader,
  HEADER_BYTES,
  isBodyPayload,
  isRefPayload,
  type BodyKind,
} from './frame';

export type FsyncPolicy = 'always' | 'never' | number;

export interface JournalOptions {
  dir: string;
  /** `always`: fsync before an append resolves; a number: fsync every N ms; `never`: leave it to the OS. */
  fsync: FsyncPolicy;
  maxBytes: number;
  segmentBytes: number;
  /** Appends are refused above this share of maxBytes (readiness turns false there too). */
  highWatermark: number;
  /**
   * Bytes of the newest body frames kept in memory as well (copies, default 8 MiB): a call whose
   * episode closes soon after it ends (a one-call rollout, a final reward right after the last
   * answer) is extracted and exported without reading its bodies back. Older frames are read
   * from the file.
   */
  cacheBytes?: number;
}

export interface RecoveryReport {
  records: number;
  tornTails: number;
  corruptTails: number;
  corruptSegments: number;
  /** Files holding bytes that could not be read back, for a human to look at. */
  quarantined: string[];
}

interface Segment {
  first: number;
  file: string;
  bytes: number;
  /** Body frames in this segment: offset → where their bytes are. */
  bodies: FrameIndex;
  /** Read descriptor, opened on the first body read. */
  readFd: number | null;
}

interface Waiter {
  /** Frame header, then the payload's parts (written with one writev, never concatenated). */
  parts: Buffer[];
  bytes: number;
  offset: number;
  /** Set for body frames: the body's length (its bytes follow the two headers). */
  body: number | null;
  ref: boolean;
  resolve: (offset: number) => void;
  reject: (err: Error) => void;
}

const SEGMENT = /^(\d{20})\.seg$/;
const segmentName = (first: number) => `${String(first).padStart(20, '0')}.seg`;

/**
 * A segmented append-only log. Appends are group-committed: all appends of one tick become one
 * `writev` (and one fsync under `always`); each resolves with its offset once its bytes are
 * written (and synced, under `always`). `flushNow` writes what is queued at once, so a caller can
 * make sure bytes are in the kernel before it answers anyone. Writes are synchronous: a write to
 * the page cache costs less than a trip through the thread pool and keeps frames in offset order.
 *
 * Two kinds of frames: records (JSON) and body frames (raw bytes of a proxied call's request or
 * response, appended as they pass, by reference). Body frames are indexed by offset so their
 * bytes can be read back (from the page cache) when the call's episode is exported.
 *
 * Offsets are monotonic across restarts: the active segment is never deleted, and its name and
 * frames carry them.
 */
export class Journal {
  private segments: Segment[] = [];
  private fd: number | null = null;
  private nextOffset = 0;
  private queue: Waiter[] = [];
  private flushing: NodeJS.Immediate | null = null;
  /** Writes lazy appends that nothing else wrote (see `LAZY_MS`). */
  private lazyTimer: NodeJS.Timeout | null = null;
  private pendingSyncs = 0;
  private dirty = false;
  private queuedBytes = 0;
  /** An append was refused for space and nothing has been released since. */
  private refusedForSpace = false;
  private syncTimer: NodeJS.Timeout | null = null;
  private closed = false;
  /** Reused for reading runs of frames. */
  private span: Buffer | null = null;
  /**
   * Flat pairs (reference frame, lowest frame it names), in offset order: a segment is kept
   * while a reference frame that is still needed names a frame in it.
   */
  private pins: number[] = [];
  /**
   * Copies of the newest body frames appended with `keepUpTo` or read from a segment (`cacheBytes` of
   * them). Frames still queued are read from here too (a call's episode may be built before the
   * batch of its turn is written); a batch that cannot be written is dropped from it.
   */
  private readonly recent: RecentBodies;
  /** The extents of the newest reference frames written or read (see `MAX_REFS`), and how many numbers they hold. */
  private readonly refs = new Map<number, readonly number[]>();
  private refNumbers = 0;
  /** Run once the batch queued now is written (or could not be): see `afterWrite`. */
  private afterWriting: (() => void)[] = [];
  /** Run right before the next write: see `beforeWrite`. */
  private beforeWriting: (() => void)[] = [];
  lastWriteError: Error | null = null;
  /** Batches that could not be written (their body frames are not in the journal). */
  writeFailures = 0;

  constructor(
    private readonly options: JournalOptions,
    private readonly logger: Logger,
  ) {
    this.recent = new RecentBodies(options.cacheBytes ?? DEFAULT_CACHE_BYTES);
  }

  /**
   * Scans every segment, truncating a torn or corrupt tail and setting a corrupt middle
   * segment's rest aside, and hands each intact record to `onRecord` in offset order.
   */
  /**
   * `onSegment` is told after each segment is read, and every `REPLAY_STRETCH` bytes within one
   * (the replay's chance to let go of its garbage before it piles up: a 64 MiB segment's records
   * parsed leave more garbage than the process otherwise holds).
   */
  async open(onRecord: (offset: number, payload: Buffer) => void, onSegment?: () => void): Promise<RecoveryReport> {
    const dir = this.options.dir;
    mkdirSync(dir, { recursive: true });
    const report: RecoveryReport = { records: 0, tornTails: 0, corruptTails: 0, corruptSegments: 0, quarantined: [] };
    const names = readdirSync(dir)
      .filter((f) => SEGMENT.test(f))
      .sort();
    for (const [i, name] of names.entries()) {
      const file = path.join(dir, name);
      const last = i === names.length - 1;
      const reader = new SegmentReader(file);
      // Listed before its frames are handed out: an episode closed during replay reads its
      // calls' bodies from the frames already scanned.
      const first = Number(SEGMENT.exec(name)![1]);
      const segment: Segment = { first, file, bytes: reader.size, bodies: new FrameIndex(first), readFd: null };
      this.segments.push(segment);
      let at = 0;
      let told = 0;
      try {
        for (;;) {
          if (at === reader.size) break;
          if (at - told >= REPLAY_STRETCH) {
            told = at;
            onSegment?.();
          }
          const { r, base } = reader.decodeAt(at);
          if (r.kind === 'frame') {
            if (isBodyPayload(r.payload)) {
              const ref = isRefPayload(r.payload);
              if (ref) this.pin(r.offset, decodeExtents(r.payload.subarray(BODY_HEADER_BYTES)));
              segment.bodies.add(r.offset, at + HEADER_BYTES + BODY_HEADER_BYTES, r.payload.length - BODY_HEADER_BYTES, ref);
            }
            onRecord(r.offset, r.payload);
            report.records++;
            this.nextOffset = Math.max(this.nextOffset, r.offset + 1);
            at = base + r.next;
            continue;
          }
          const rest = reader.tail(at);
          const saved = path.join(dir, `${name}.${at}.${r.kind}`);
          writeWhole(saved, rest);
          report.quarantined.push(saved);
          if (r.kind === 'torn' && last) report.tornTails++;
          else if (last) report.corruptTails++;
          else report.corruptSegments++;
          this.logger.warn('journal: unreadable bytes set aside', { segment: name, at, bytes: rest.length, kind: r.kind, saved_as: path.basename(saved) });
          truncate(file, at);
          break;
        }
      } finally {
        reader.close();
        if (!last) segment.bodies.trim();
      }
      segment.bytes = Math.min(at, reader.size);
      onSegment?.();
    }
    SegmentReader.release();
    if (this.segments.length === 0) this.segments.push({ first: 0, file: path.join(dir, segmentName(0)), bytes: 0, bodies: new FrameIndex(), readFd: null });
    this.nextOffset = Math.max(this.nextOffset, this.active().first);
    this.fd = openSync(this.active().file, 'a');
    if (typeof this.options.fsync === 'number') {
      this.syncTimer = setInterval(() => this.syncNow(), this.options.fsync);
      this.syncTimer.unref();
    }
    return report;
  }

  get bytes(): number {
    return this.segments.reduce((n, s) => n + s.bytes, 0) + this.queuedBytes;
  }

  get segmentCount(): number {
    return this.segments.length;
  }

  /** Whether appends are refused now (at or above the high watermark). */
  get full(): boolean {
    return this.refusedForSpace || this.bytes >= this.options.maxBytes * this.options.highWatermark;
  }

  /** The offset the next append will get. */
  get next(): number {
    return this.nextOffset;
  }

  /**
   * Appends one record. The offset is assigned now, synchronously, so callers can order their
   * own work by it; `durable` resolves once the bytes are written (and synced under `always`).
   * Segments rotate between batches, so one may exceed `segmentBytes` by up to one batch.
   * `priority` records (rewards, ends, markers: small, and what lets episodes close and space be
   * released; and the end records of calls already under way, whose size grows with the number of
   * body frames they list) may use the room between the high watermark and `maxBytes`. A `lazy` record does
   * not call for a write of its own: it goes with the next one (see `LAZY_MS`).
   * Throws RefusedError(JOURNAL_FULL) above the high watermark, JOURNAL_CLOSED after close.
   */
  append(payload: Buffer, priority = false, lazy = false): { offset: number; durable: Promise<number> } {
    return this.enqueue([payload], payload.length, null, false, priority, lazy);
  }

  /**
   * Appends raw bytes of a call's request or response (one buffer or pieces) as a body frame, without copying them.
   * `callId` names the call (the offset of its start record). Refused like `append`. Body
   * frames are lazy: what must be in the file before an agent sees it is written through by the
   * call's end record (`afterWrite`), or by `writeSoon` when a streamed answer begins. A frame of
   * at most `keepUpTo` bytes leaves a copy in memory for a while (see `recent`): for calls whose
   * episode is exported right after they end.
   */
  appendBody(callId: number, kind: BodyKind, bytes: Buffer | readonly Buffer[], keepUpTo = 0): number {
    const parts = Buffer.isBuffer(bytes) ? [bytes] : bytes;
    let length = 0;
    for (const b of parts) length += b.length;
    const { offset } = this.enqueue([bodyHeader(callId, kind), ...parts], BODY_HEADER_BYTES + length, length, false, false, true);
    if (length <= keepUpTo) this.recent.keep(offset, parts, length);
    return offset;
  }

  /**
   * Appends a part of a call's request or response that repeats bytes already in the journal,
   * as the extents that hold them (flat triples: body frame offset, start in its bytes, length;
   * never other reference frames). Readers get the bytes back as if they had been appended.
   * Refused like `append`.
   */
  appendRef(callId: number, kind: 'request' | 'response', extents: readonly number[]): number {
    const payload = encodeExtents(extents);
    const { offset } = this.enqueue([bodyHeader(callId, kind, true), payload], BODY_HEADER_BYTES + payload.length, payload.length, true, false, true);
    this.pin(offset, extents);
    this.rememberRef(offset, extents);
    return offset;
  }

  private pin(offset: number, extents: readonly number[]): void {
    let lowest = Infinity;
    for (let i = 0; i < extents.length; i += 3) lowest = Math.min(lowest, extents[i]);
    if (lowest < offset) this.pins.push(offset, lowest);
  }

  private enqueue(
    payload: Buffer[],
    payloadBytes: number,
    body: number | null,
    ref: boolean,
    priority: boolean,
    lazy: boolean,
  ): { offset: number; durable: Promise<number> } {
    if (this.closed) throw new RefusedError('JOURNAL_CLOSED', 'journal: closed for shutdown', 1000);
    const frameBytes = payloadBytes + HEADER_BYTES;
    const limit = priority ? this.options.maxBytes : this.options.maxBytes * this.options.highWatermark;
    if (this.bytes + frameBytes > limit) {
      if (!priority) this.refusedForSpace = true;
      throw new RefusedError('JOURNAL_FULL', `journal: full (${this.bytes} of ${this.options.maxBytes} bytes, service.journal.max_bytes)`, 1000);
    }
    const offset = this.nextOffset++;
    this.queuedBytes += frameBytes;
    const parts = [frameHeader(offset, payload, payloadBytes), ...payload];
    let durable: Promise<number>;
    if (body !== null) {
      // Body frames are made durable by the call's end record, written after them; no promise each.
      this.queue.push({ parts, bytes: frameBytes, offset, body, ref, resolve: noop, reject: noop });
      durable = BODY_DURABLE;
    } else {
      durable = new Promise<number>((resolve, reject) => {
        this.queue.push({ parts, bytes: frameBytes, offset, body, ref, resolve, reject });
      });
    }
    if (!lazy || this.queuedBytes >= LAZY_MAX_BYTES) this.flushSoon();
    else this.flushLater();
    return { offset, durable };
  }

  /** Writes what is queued at the end of this turn of the event loop (lazy appends included). */
  writeSoon(): void {
    if (this.queue.length > 0 || this.beforeWriting.length > 0) this.flushSoon();
  }

  /**
   * Runs `then` right before the next write, which it does not call for (it comes within
   * `LAZY_MS`): a streamed answer's chunks are appended then, as one frame, instead of one frame
   * a chunk.
   */
  beforeWrite(then: () => void): void {
    this.beforeWriting.push(then);
    this.flushLater();
  }

  private flushSoon(): void {
    this.flushing ??= setImmediate(() => this.flushNow());
  }

  /** Writes within `LAZY_MS` unless a write comes sooner (one is already due this turn, or will be called for). */
  private flushLater(): void {
    if (this.flushing === null) this.lazyTimer ??= setTimeout(() => this.flushNow(), LAZY_MS).unref();
  }

  /**
   * Runs `then` once what is queued now is written (or could not be), with the batch of this
   * turn of the event loop: callers that must not answer before their bytes are in the kernel
   * share one write instead of one each. `then` runs at once when nothing is queued.
   */
  afterWrite(then: () => void): void {
    if (this.queue.length === 0 && this.beforeWriting.length === 0) {
      then();
      return;
    }
    this.afterWriting.push(then);
    this.flushSoon();
  }

  /** Writes everything queued now, synchronously (the bytes are in the kernel when it returns). */
  flushNow(): void {
    this.runBeforeWrite();
    if (this.flushing) {
      clearImmediate(this.flushing);
      this.flushing = null;
    }
    if (this.lazyTimer) {
      clearTimeout(this.lazyTimer);
      this.lazyTimer = null;
    }
    try {
      this.writeQueued();
    } finally {
      this.runEach('afterWriting', 'after_write', 'journal: a write-through callback failed');
    }
  }

  /** What waits to be appended goes in (a callback may add more: they run too). */
  private runBeforeWrite(): void {
    while (this.beforeWriting.length > 0) this.runEach('beforeWriting', 'before_write', 'journal: a before-write callback failed');
  }

  /** Runs and clears one list of callbacks; one caller's failure does not keep the others back. */
  private runEach(list: 'beforeWriting' | 'afterWriting', key: string, message: string): void {
    if (this[list].length === 0) return;
    const callbacks = this[list];
    this[list] = [];
    for (const then of callbacks) {
      try {
        then();
      } catch (err) {
        this.logger.once(key, 'error', message, { err });
      }
    }
  }

  private writeQueued(): void {
    if (this.queue.length === 0 || this.fd === null) return;
    const batch = this.queue;
    this.queue = [];
    let bytes = 0;
    for (const w of batch) bytes += w.bytes;
    this.queuedBytes -= bytes;
    try {
      if (this.active().bytes >= this.options.segmentBytes) this.rotate(batch[0].offset);
      const seg = this.active();
      const parts: Buffer[] = [];
      for (const w of batch) for (const p of w.parts) parts.push(p);
      try {
        writeAll(this.fd, parts, bytes);
      } catch (err) {
        // A part of the batch may be in the file: cut it off, so the next frames land where they are counted.
        try {
          ftruncateSync(this.fd, seg.bytes);
        } catch {
          seg.bytes = sizeOr(this.fd, seg.bytes);
        }
        throw err;
      }
      let pos = seg.bytes;
      for (const w of batch) {
        if (w.body !== null) seg.bodies.add(w.offset, pos + HEADER_BYTES + BODY_HEADER_BYTES, w.body, w.ref);
        pos += w.bytes;
      }
      seg.bytes += bytes;
      this.lastWriteError = null;
    } catch (err) {
      this.lastWriteError = err as Error;
      this.writeFailures++;
      this.logger.once(`write:${(err as NodeJS.ErrnoException).code}`, 'error', 'journal: write failed; records refused', { err });
      // Whatever part of the batch reached the file is unacknowledged: replay may see it, which is at-least-once.
      const refused = new RefusedError('JOURNAL_UNWRITABLE', `journal: cannot write (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`, 1000);
      for (const w of batch) {
        // What never reached the file is not read back from memory either.
        if (w.body !== null) this.recent.forget(w.offset);
        w.reject(refused);
      }
      return;
    }
    if (this.options.fsync === 'always') {
      this.pendingSyncs++;
      fdatasync(this.fd, (err) => {
        this.pendingSyncs--;
        if (err) this.logger.once('fsync', 'error', 'journal: fsync failed', { err });
        for (const w of batch) w.resolve(w.offset);
      });
    } else {
      this.dirty = true;
      for (const w of batch) w.resolve(w.offset);
    }
  }

  /**
   * The bytes of body frames, in the order given, as one buffer (read from the page cache), into
   * `scratch` when it is big enough (the caller then owns the bytes only until it reuses it).
   * Reference frames read as the bytes they name. Throws when a frame is gone (its segment
   * released) or cannot be read.
   */
  readBodies(offsets: readonly number[], scratch?: Buffer): Buffer {
    return this.readPieces(this.piecesOf(offsets), scratch);
  }

  /**
   * Bytes `[start, end)` of the body `readBodies(offsets)` reads (clamped to it), reading only the
   * frames, and the parts of frames, that hold them: a few hundred KiB of token ids from a 17 MB
   * answer without reading the rest.
   */
  readBodyRange(offsets: readonly number[], start: number, end: number, scratch?: Buffer): Buffer {
    const all = this.piecesOf(offsets);
    const clipped: number[] = [];
    let at = 0;
    for (let i = 0; i < all.length && at < end; i += 3) {
      const length = all[i + 2];
      const from = Math.max(start, at);
      const to = Math.min(end, at + length);
      if (to > from) clipped.push(all[i], all[i + 1] + from - at, to - from);
      at += length;
    }
    return this.readPieces(clipped, scratch);
  }

  /** The body's pieces as flat triples: frame, start in its bytes, length. */
  private piecesOf(offsets: readonly number[]): number[] {
    const pieces: number[] = [];
    for (const offset of offsets) {
      const kept = this.recent.lengthOf(offset);
      if (kept >= 0) {
        pieces.push(offset, 0, kept);
        continue;
      }
      const [seg, i] = this.locate(offset);
      if (!seg.bodies.isRef(i)) {
        pieces.push(offset, 0, seg.bodies.len(i));
        continue;
      }
      const extents = this.refs.get(offset) ?? this.refExtents(seg, i, offset);
      for (let i = 0; i < extents.length; i += 3) pieces.push(extents[i], extents[i + 1], extents[i + 2]);
    }
    return pieces;
  }

  /** The segment holding a body frame and the frame's index there. */
  private locate(offset: number): [Segment, number] {
    const seg = this.segmentOf(offset);
    const i = seg ? seg.bodies.find(offset) : -1;
    if (!seg || i < 0) throw new Error(`journal: body frame ${offset} is not in the journal`);
    return [seg, i];
  }

  /** The extents a reference frame holds (a small read from the page cache), remembered for a while. */
  private refExtents(seg: Segment, i: number, offset: number): number[] {
    const len = seg.bodies.len(i);
    const bytes = Buffer.allocUnsafe(len);
    seg.readFd ??= openSync(seg.file, 'r');
    readFully(seg, bytes, 0, len, seg.bodies.pos(i));
    const extents = decodeExtents(bytes);
    this.rememberRef(offset, extents);
    return extents;
  }

  private rememberRef(offset: number, extents: readonly number[]): void {
    if (extents.length > MAX_REF_NUMBERS) return;
    this.refs.set(offset, extents);
    this.refNumbers += extents.length;
    // Oldest first: a long rollout's references name many extents each.
    while (this.refs.size > MAX_REFS || this.refNumbers > MAX_REF_NUMBERS) {
      const [oldest, dropped] = this.refs.entries().next().value as [number, readonly number[]];
      this.refs.delete(oldest);
      this.refNumbers -= dropped.length;
    }
  }

  /**
   * The bytes the pieces name, in order. Frames in memory are copied from there; the others are
   * read from their segment, a run of frames close together with one system call, and small
   * frames are kept in memory whole: a rollout's next body names most of them again.
   */
  private readPieces(pieces: readonly number[], scratch?: Buffer): Buffer {
    let total = 0;
    for (let i = 2; i < pieces.length; i += 3) total += pieces[i];
    const out = scratch && scratch.length >= total ? scratch.subarray(0, total) : Buffer.allocUnsafe(total);
    let at = 0;
    for (let i = 0; i < pieces.length;) {
      const [frame, start, length] = [pieces[i], pieces[i + 1], pieces[i + 2]];
      const kept = this.recent.lengthOf(frame);
      if (kept >= 0) {
        if (start + length > kept) throw new Error(`journal: extent ${frame}+${start} does not name body bytes`);
        this.recent.copy(frame, start, length, out, at);
        at += length;
        i += 3;
        continue;
      }
      const [seg, f] = this.locate(frame);
      const frames = seg.bodies;
      if (frames.isRef(f) || start + length > frames.len(f)) throw new Error(`journal: extent ${frame}+${start} does not name body bytes`);
      seg.readFd ??= openSync(seg.file, 'r');
      if (frames.len(f) > this.recent.maxFrameBytes) {
        readFully(seg, out, at, length, frames.pos(f) + start);
        at += length;
        i += 3;
        continue;
      }
      // The run: the next pieces' frames, small, not in memory, further on in this segment and close.
      const pos = frames.pos(f);
      let spanEnd = pos + frames.len(f);
      let j = i + 3;
      while (j < pieces.length && !this.recent.has(pieces[j])) {
        const next = frames.find(pieces[j]);
        if (next < 0 || frames.isRef(next) || frames.len(next) > this.recent.maxFrameBytes || pieces[j + 1] + pieces[j + 2] > frames.len(next)) break;
        const nextPos = frames.pos(next);
        if (nextPos < spanEnd || nextPos - spanEnd > RUN_GAP || nextPos + frames.len(next) - pos > RUN_SPAN) break;
        spanEnd = nextPos + frames.len(next);
        j += 3;
      }
      const span = this.spanBuffer(spanEnd - pos);
      readFully(seg, span, 0, spanEnd - pos, pos);
      for (let k = i; k < j; k += 3) {
        const l = k === i ? f : frames.find(pieces[k]);
        const from = frames.pos(l) - pos;
        const len = frames.len(l);
        this.recent.keep(pieces[k], [span.subarray(from, from + len)], len);
        at += span.copy(out, at, from + pieces[k + 1], from + pieces[k + 1] + pieces[k + 2]);
      }
      i = j;
    }
    return out;
  }

  /** A reused buffer for runs of frames (they are at most RUN_SPAN bytes). */
  private spanBuffer(bytes: number): Buffer {
    if (!this.span || this.span.length < bytes) this.span = Buffer.allocUnsafeSlow(Math.max(bytes, 64 * 1024));
    return this.span;
  }

  private segmentOf(offset: number): Segment | undefined {
    let lo = 0;
    let hi = this.segments.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.segments[mid].first <= offset) lo = mid;
      else hi = mid - 1;
    }
    const seg = this.segments[lo];
    return seg && seg.first <= offset ? seg : undefined;
  }

  private active(): Segment {
    return this.segments[this.segments.length - 1];
  }

  /** Opens the next segment first: if that fails the active one stays usable and the next flush retries. */
  private rotate(first: number): void {
    const file = path.join(this.options.dir, segmentName(first));
    const next = openSync(file, 'a');
    const previous = this.fd!;
    this.fd = next;
    this.active().bodies.trim();
    this.segments.push({ first, file, bytes: 0, bodies: new FrameIndex(first), readFd: null });
    // The finished segment is synced and closed off the event loop (closing a file with much
    // just written can take milliseconds on ext4).
    fdatasync(previous, (err) => {
      if (err) this.logger.once('fsync', 'error', 'journal: fsync failed', { err });
      closeLater(previous);
    });
  }

  private syncNow(): void {
    if (!this.dirty || this.fd === null) return;
    this.dirty = false;
    this.pendingSyncs++;
    fdatasync(this.fd, (err) => {
      this.pendingSyncs--;
      if (err) this.logger.once('fsync', 'error', 'journal: fsync failed', { err });
    });
  }

  /**
   * Deletes every non-active segment whose records all lie below `lowWatermark` (everything
   * before it is delivered or no longer needed).
   */
  async release(lowWatermark: number): Promise<number> {
    // Reference frames still needed keep the frames they name.
    let drop = 0;
    while (drop < this.pins.length && this.pins[drop] < lowWatermark) drop += 2;
    if (drop > 0) this.pins.splice(0, drop);
    let low = lowWatermark;
    for (let i = 1; i < this.pins.length; i += 2) low = Math.min(low, this.pins[i]);
    let removed = 0;
    while (this.segments.length > 1 && this.segments[1].first <= low) {
      const seg = this.segments.shift()!;
      for (let i = 0; i < seg.bodies.size; i++) this.recent.forget(seg.bodies.offsetAt(i));
      if (seg.readFd !== null) closeLater(seg.readFd);
      await unlink(seg.file).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOENT') throw err;
      });
      removed++;
    }
    if (removed > 0) this.refusedForSpace = false;
    return removed;
  }

  /** Whether the journal directory takes writes (readiness). */
  writable(): string | null {
    if (this.lastWriteError) return `last write failed: ${(this.lastWriteError as NodeJS.ErrnoException).code ?? this.lastWriteError.message}`;
    if (this.full) return `at its high watermark (${this.bytes} bytes)`;
    return null;
  }

  /** Flushes what is queued, syncs, and refuses further appends. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    // What waits to be appended goes in before appends are refused.
    this.runBeforeWrite();
    this.closed = true;
    if (this.syncTimer) clearInterval(this.syncTimer);
    this.flushNow();
    while (this.pendingSyncs > 0) await new Promise((r) => setTimeout(r, 1));
    if (this.fd !== null) {
      try {
        fsyncSync(this.fd);
      } catch {
        // Counted by the write path already; nothing more to do at close.
      }
      closeQuietly(this.fd);
      this.fd = null;
    }
    for (const seg of this.segments) {
      if (seg.readFd !== null) closeQuietly(seg.readFd);
      seg.readFd = null;
    }
  }
}

const noop = (): void => {};
const DEFAULT_CACHE_BYTES = 8 * 1024 * 1024;
/** Bytes of a segment replayed between two `onSegment` calls. */
const REPLAY_STRETCH = 16 * 1024 * 1024;
/**
 * Lazy appends (a call's start and body frames, delivery markers) wait for the next write, which
 * a call's end, a streamed answer's first bytes or any other record calls for; at most this long,
 * and while they are fewer than LAZY_MAX_BYTES. A call then costs one write, not one for its
 * start, one for its end and one for every chunk of a streamed answer.
 */
const LAZY_MS = 20;
/** Big bodies are written at the end of their turn: held longer, their chunks would outlive young-generation GC. */
const LAZY_MAX_BYTES = 64 * 1024;
const BODY_DURABLE: Promise<number> = Promise.resolve(-1);
/** Frames this close (bytes between them) are read together; a run's whole span is at most RUN_SPAN. */
const RUN_GAP = 16 * 1024;
const RUN_SPAN = 1024 * 1024;
/**
 * Reference frames whose extents are remembered (they are read again for every later body of their
 * rollout): at most this many, holding at most MAX_REF_NUMBERS numbers (~1 MiB) in all.
 */
const MAX_REFS = 4096;
const MAX_REF_NUMBERS = 128 * 1024;

/** Reads `len` bytes of a segment at `pos` into `into` at `at` (short reads continue). */
function readFully(seg: Segment, into: Buffer, at: number, len: number, pos: number): void {
  let done = 0;
  while (done < len) {
    const n = readSync(seg.readFd!, into, at + done, len - done, pos + done);
    if (n === 0) throw new Error(`journal: body frame at ${seg.file}:${pos} is cut short`);
    done += n;
  }
}

function writeAll(fd: number, parts: Buffer[], total: number): void {
  // writev takes at most IOV_MAX (1024) buffers; a short write continues where it stopped.
  let written = 0;
  let i = 0;
  let skip = 0;
  while (written < total) {
    const slice = parts.slice(i, i + 1024);
    if (skip > 0) slice[0] = slice[0].subarray(skip);
    let n = writevSync(fd, slice);
    written += n;
    if (n === 0) throw new Error('journal: write made no progress');
    while (n > 0 && i < parts.length) {
      const left = parts[i].length - skip;
      if (n >= left) {
        n -= left;
        i++;
        skip = 0;
      } else {
        skip += n;
        n = 0;
      }
    }
  }
}

/** The file's size, or `fallback` when it cannot be read. */
function sizeOr(fd: number, fallback: number): number {
  try {
    return fstatSync(fd).size;
  } catch {
    return fallback;
  }
}

/** Closes in the thread pool; a failure means there is nothing left to release. */
function closeLater(fd: number): void {
  close(fd, () => {});
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // Already closed or never opened: nothing to release.
  }
}

/**
 * A segment file read in windows of 8 MiB (or one frame, when a frame is larger), so a replay
 * holds one window in memory and not the whole file: a journal that grew during a long exporter
 * outage replays in bounded memory. A payload handed out lies in the current window and is valid
 * only until the next `decodeAt` (`onRecord` reads it and keeps nothing of it). Windows are
 * read into one buffer, reused by every reader of a replay and dropped after it (`release`): a
 * new 8 MiB buffer a window left a gigabyte of replay as fragments in the C heap that the
 * process kept (glibc serves buffers of that size from its heap once one has been freed).
 */
class SegmentReader {
  static readonly WINDOW = 8 << 20;
  private static spare: Buffer | null = null;

  /** The replay is over: its window buffer goes. */
  static release(): void {
    SegmentReader.spare = null;
  }

  readonly size: number;
  private readonly fd: number;
  private window: Buffer = Buffer.alloc(0);
  /** File position of window[0]. */
  private base = 0;

  constructor(file: string) {
    this.fd = openSync(file, 'r');
    this.size = fstatSync(this.fd).size;
  }

  /** The frame at file position `at` (or why there is none); positions in `r` are relative to `base`. */
  decodeAt(at: number): { r: ReturnType<typeof decodeFrame>; base: number } {
    let r = decodeFrame(this.window, at - this.base);
    // Torn only because the window ends before the file does: refill from `at` with a window, or
    // the whole frame when its header (read by the first refill if need be) says it is larger.
    while (r.kind === 'torn' && this.base + this.window.length < this.size) {
      const rel = at - this.base;
      const need = this.window.length - rel >= HEADER_BYTES ? HEADER_BYTES + this.window.readUInt32BE(rel) : HEADER_BYTES;
      this.load(at, Math.min(this.size - at, Math.max(SegmentReader.WINDOW, need)));
      r = decodeFrame(this.window, 0);
    }
    return { r, base: this.base };
  }

  /** Everything from `at` to the end of the file. */
  tail(at: number): Buffer {
    this.load(at, this.size - at);
    return this.window;
  }

  close(): void {
    closeSync(this.fd);
  }

  private load(at: number, length: number): void {
    let buf: Buffer;
    if (length <= SegmentReader.WINDOW) {
      SegmentReader.spare ??= Buffer.allocUnsafeSlow(SegmentReader.WINDOW);
      buf = SegmentReader.spare.subarray(0, length);
    } else buf = Buffer.allocUnsafe(length);
    let got = 0;
    while (got < length) {
      const n = readSync(this.fd, buf, got, length - got, at + got);
      if (n === 0) break;
      got += n;
    }
    this.window = got === length ? buf : buf.subarray(0, got);
    this.base = at;
  }
}

function writeWhole(file: string, bytes: Buffer): void {
  const fd = openSync(file, 'w');
  try {
    writeSync(fd, bytes);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

function truncate(file: string, length: number): void {
  const fd = openSync(file, 'r+');
  try {
    ftruncateSync(fd, length);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
