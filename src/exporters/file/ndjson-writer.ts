import { close, closeSync, ftruncateSync, mkdirSync, openSync, writevSync } from 'node:fs';
import path from 'node:path';

/**
 * Appends NDJSON lines to `{dir}/{prefix}-{start}-{n}.ndjson`, starting a new file once the
 * current one reaches `maxFileBytes`. Writes are synchronous `writev`s of a whole batch of lines,
 * as the journal's are: a write to the page cache costs less than a trip through the thread pool
 * (a handoff and a wake-up each way), and batches keep them few. `append` returns once the bytes
 * are handed to the OS; it throws when they cannot be.
 */
export class NdjsonWriter {
  private fd: number | null = null;
  private size = 0;
  private index = 0;
  private readonly stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\..*/, '');
  currentFile: string | null = null;

  constructor(
    private readonly dir: string,
    private readonly prefix: string,
    private readonly maxFileBytes: number,
  ) {}

  /** Appends lines, each a buffer or a list of buffers written one after the other. */
  append(lines: (Buffer | Buffer[])[]): void {
    if (lines.length === 0) return;
    const parts: Buffer[] = [];
    let bytes = 0;
    for (const l of lines) {
      for (const p of Array.isArray(l) ? l : [l]) {
        parts.push(p);
        bytes += p.length;
      }
      parts.push(NEWLINE);
      bytes++;
    }
    if (this.fd === null || (this.size > 0 && this.size + bytes > this.maxFileBytes)) this.rotate();
    let written = 0;
    try {
      // writev takes at most IOV_MAX buffers a call; a short write continues with the rest.
      while (written < bytes) {
        const n = writevSync(this.fd!, remaining(parts, written).slice(0, 1024));
        if (n === 0) throw new Error(`ndjson: no progress writing ${this.currentFile}`);
        written += n;
      }
    } catch (err) {
      // No half line stays behind for readers to trip on: the batch is written again whole.
      if (written > 0) ftruncateSync(this.fd!, this.size);
      throw err;
    }
    this.size += bytes;
  }

  private rotate(): void {
    // The finished file is closed in the thread pool (closing a file with much just written can
    // take milliseconds on ext4).
    if (this.fd !== null) close(this.fd, () => {});
    this.fd = null;
    mkdirSync(this.dir, { recursive: true });
    this.index++;
    this.currentFile = path.join(this.dir, `${this.prefix}-${this.stamp}-${process.pid}-${String(this.index).padStart(4, '0')}.ndjson`);
    this.fd = openSync(this.currentFile, 'a');
    this.size = 0;
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

const NEWLINE = Buffer.from('\n');

/** The buffers left after the first `skip` bytes. */
function remaining(parts: Buffer[], skip: number): Buffer[] {
  if (skip === 0) return parts;
  const out: Buffer[] = [];
  for (const p of parts) {
    if (skip >= p.length) {
      skip -= p.length;
      continue;
    }
    out.push(skip > 0 ? p.subarray(skip) : p);
    skip = 0;
  }
  return out;
}
