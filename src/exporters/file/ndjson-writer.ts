import { mkdir, open, type FileHandle } from 'node:fs/promises';
import path from 'node:path';

/**
 * Appends NDJSON lines to `{dir}/{prefix}-{start}-{n}.ndjson`, starting a new file once the
 * current one reaches `maxFileBytes`. Writes are serialised; each `append` resolves after its
 * bytes are handed to the OS (and fsync'd when `fsync` is set).
 */
export class NdjsonWriter {
  private handle: FileHandle | null = null;
  private size = 0;
  private index = 0;
  private readonly stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\..*/, '');
  private tail: Promise<void> = Promise.resolve();
  currentFile: string | null = null;

  constructor(
    private readonly dir: string,
    private readonly prefix: string,
    private readonly maxFileBytes: number,
    private readonly fsync = false,
  ) {}

  /** Appends lines, each a buffer or a list of buffers written one after the other. */
  append(lines: (Buffer | Buffer[])[]): Promise<void> {
    if (lines.length === 0) return this.tail;
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
    const next = this.tail.then(() => this.write(parts, bytes));
    this.tail = next.catch(() => {});
    return next;
  }

  private async write(parts: Buffer[], bytes: number): Promise<void> {
    if (!this.handle || (this.size > 0 && this.size + bytes > this.maxFileBytes)) await this.rotate();
    let written = 0;
    // writev takes at most IOV_MAX buffers a call; a short write continues with the rest.
    while (written < bytes) {
      const r = await this.handle!.writev(remaining(parts, written).slice(0, 1024));
      if (r.bytesWritten === 0) throw new Error(`ndjson: no progress writing ${this.currentFile}`);
      written += r.bytesWritten;
    }
    if (this.fsync) await this.handle!.sync();
    this.size += bytes;
  }

  private async rotate(): Promise<void> {
    await this.handle?.close();
    await mkdir(this.dir, { recursive: true });
    this.index++;
    this.currentFile = path.join(this.dir, `${this.prefix}-${this.stamp}-${process.pid}-${String(this.index).padStart(4, '0')}.ndjson`);
    this.handle = await open(this.currentFile, 'a');
    this.size = 0;
  }

  async close(): Promise<void> {
    await this.tail;
    await this.handle?.close();
    this.handle = null;
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
