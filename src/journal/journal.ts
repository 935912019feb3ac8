import { closeSync, fsyncSync, ftruncateSync, mkdirSync, openSync, readdirSync, readFileSync, writeSync } from 'node:fs';
import { open, unlink, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { RefusedError } from '../pipeline/component';
import type { Logger } from '../telemetry/logger';
import { decodeFrame, encodeFrame } from './frame';

export type FsyncPolicy = 'always' | 'never' | number;

export interface JournalOptions {
  dir: string;
  /** `always`: fsync before an append resolves; a number: fsync every N ms; `never`: leave it to the OS. */
  fsync: FsyncPolicy;
  maxBytes: number;
  segmentBytes: number;
  /** Appends are refused above this share of maxBytes (readiness turns false there too). */
  highWatermark: number;
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
}

interface Waiter {
  frame: Buffer;
  offset: number;
  resolve: (offset: number) => void;
  reject: (err: Error) => void;
}

const SEGMENT = /^(\d{20})\.seg$/;
const segmentName = (first: number) => `${String(first).padStart(20, '0')}.seg`;

/**
 * A segmented append-only log. Appends are group-committed: all appends of one tick become one
 * write (and one fsync under `always`); each resolves with its offset once its bytes are written
 * (and synced, under `always`). Offsets are monotonic across restarts: the active segment is
 * never deleted, and its name and frames carry them.
 */
export class Journal {
  private segments: Segment[] = [];
  private fh: FileHandle | null = null;
  private nextOffset = 0;
  private queue: Waiter[] = [];
  private flushing: Promise<void> | null = null;
  private dirty = false;
  private queuedBytes = 0;
  /** An append was refused for space and nothing has been released since. */
  private refusedForSpace = false;
  private syncTimer: NodeJS.Timeout | null = null;
  private closed = false;
  lastWriteError: Error | null = null;

  constructor(
    private readonly options: JournalOptions,
    private readonly logger: Logger,
  ) {}

  /**
   * Scans every segment, truncating a torn or corrupt tail and setting a corrupt middle
   * segment's rest aside, and hands each intact record to `onRecord` in offset order.
   */
  async open(onRecord: (offset: number, payload: Buffer) => void): Promise<RecoveryReport> {
    const dir = this.options.dir;
    mkdirSync(dir, { recursive: true });
    const report: RecoveryReport = { records: 0, tornTails: 0, corruptTails: 0, corruptSegments: 0, quarantined: [] };
    const names = readdirSync(dir).filter((f) => SEGMENT.test(f)).sort();
    for (const [i, name] of names.entries()) {
      const file = path.join(dir, name);
      const buf = readFileSync(file);
      const last = i === names.length - 1;
      let at = 0;
      for (;;) {
        if (at === buf.length) break;
        const r = decodeFrame(buf, at);
        if (r.kind === 'frame') {
          onRecord(r.offset, r.payload);
          report.records++;
          this.nextOffset = Math.max(this.nextOffset, r.offset + 1);
          at = r.next;
          continue;
        }
        const rest = buf.subarray(at);
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
      this.segments.push({ first: Number(SEGMENT.exec(name)![1]), file, bytes: Math.min(at, buf.length) });
    }
    if (this.segments.length === 0) this.segments.push({ first: 0, file: path.join(dir, segmentName(0)), bytes: 0 });
    this.nextOffset = Math.max(this.nextOffset, this.active().first);
    this.fh = await open(this.active().file, 'a');
    if (typeof this.options.fsync === 'number') {
      this.syncTimer = setInterval(() => void this.syncNow(), this.options.fsync);
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
   * released) may use the room between the high watermark and `maxBytes`.
   * Throws RefusedError(JOURNAL_FULL) above the high watermark, JOURNAL_CLOSED after close.
   */
  append(payload: Buffer, priority = false): { offset: number; durable: Promise<number> } {
    if (this.closed) throw new RefusedError('JOURNAL_CLOSED', 'journal: closed for shutdown', 1000);
    const frameBytes = payload.length + 16;
    const limit = priority ? this.options.maxBytes : this.options.maxBytes * this.options.highWatermark;
    if (this.bytes + frameBytes > limit) {
      if (!priority) this.refusedForSpace = true;
      throw new RefusedError('JOURNAL_FULL', `journal: full (${this.bytes} of ${this.options.maxBytes} bytes, service.journal.max_bytes)`, 1000);
    }
    const offset = this.nextOffset++;
    this.queuedBytes += frameBytes;
    const durable = new Promise<number>((resolve, reject) => {
      this.queue.push({ frame: encodeFrame(offset, payload), offset, resolve, reject });
    });
    this.flushing ??= new Promise<void>((r) => setImmediate(r)).then(() => this.flush());
    return { offset, durable };
  }

  private async flush(): Promise<void> {
    try {
      while (this.queue.length > 0) {
        const batch = this.queue;
        this.queue = [];
        for (const w of batch) this.queuedBytes -= w.frame.length;
        try {
          if (this.active().bytes >= this.options.segmentBytes) await this.rotate(batch[0].offset);
          const bytes = batch.length === 1 ? batch[0].frame : Buffer.concat(batch.map((w) => w.frame));
          await this.fh!.write(bytes);
          this.active().bytes += bytes.length;
          if (this.options.fsync === 'always') await this.fh!.sync();
          else this.dirty = true;
          this.lastWriteError = null;
          for (const w of batch) w.resolve(w.offset);
        } catch (err) {
          this.lastWriteError = err as Error;
          this.logger.once(`write:${(err as NodeJS.ErrnoException).code}`, 'error', 'journal: write failed; records refused', { err });
          // Whatever part of the batch reached the file is unacknowledged: replay may see it, which is at-least-once.
          for (const w of batch) w.reject(new RefusedError('JOURNAL_UNWRITABLE', `journal: cannot write (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`, 1000));
        }
      }
    } finally {
      this.flushing = null;
    }
  }

  private active(): Segment {
    return this.segments[this.segments.length - 1];
  }

  /** Opens the next segment first: if that fails the active one stays usable and the next flush retries. */
  private async rotate(first: number): Promise<void> {
    const file = path.join(this.options.dir, segmentName(first));
    const next = await open(file, 'a');
    const previous = this.fh!;
    this.fh = next;
    this.segments.push({ first, file, bytes: 0 });
    await previous.sync().catch((err) => this.logger.once('fsync', 'error', 'journal: fsync failed', { err }));
    await previous.close().catch(() => {});
  }

  private async syncNow(): Promise<void> {
    if (!this.dirty || !this.fh) return;
    this.dirty = false;
    try {
      await this.fh.sync();
    } catch (err) {
      this.logger.once('fsync', 'error', 'journal: fsync failed', { err });
    }
  }

  /**
   * Deletes every non-active segment whose records all lie below `lowWatermark` (everything
   * before it is delivered or no longer needed).
   */
  async release(lowWatermark: number): Promise<number> {
    let removed = 0;
    while (this.segments.length > 1 && this.segments[1].first <= lowWatermark) {
      const seg = this.segments.shift()!;
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
    this.closed = true;
    if (this.syncTimer) clearInterval(this.syncTimer);
    while (this.flushing) await this.flushing;
    if (this.fh) {
      await this.fh.sync().catch(() => {});
      await this.fh.close();
      this.fh = null;
    }
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
