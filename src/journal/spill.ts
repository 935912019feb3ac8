import { closeSync, mkdirSync, openSync, readSync, rmSync, unlinkSync, writeSync } from 'node:fs';
import path from 'node:path';

/** Where one spilled value lies: its file and byte range. */
export interface SpillRef {
  file: number;
  at: number;
  length: number;
}

/**
 * Values (closed episodes waiting for the exporter) kept on disk instead of the heap: appended as
 * JSON to files of up to `fileBytes`, read back when needed, each file deleted once every value in
 * it is released. A cache of what the journal already holds: nothing here survives a restart (the
 * journal's replay rebuilds it), so the directory is emptied when the spill is opened.
 */
export class Spill {
  private current: { n: number; fd: number; size: number } | null = null;
  /** Open files by number: their descriptor and how many values in them are not released. */
  private readonly files = new Map<number, { fd: number; live: number }>();
  private next = 0;

  constructor(
    private readonly dir: string,
    private readonly fileBytes = 64 * 1024 * 1024,
  ) {
    rmSync(dir, { recursive: true, force: true });
  }

  /** Values spilled and not yet released. */
  get size(): number {
    let n = 0;
    for (const f of this.files.values()) n += f.live;
    return n;
  }

  write(value: unknown): SpillRef {
    const bytes = Buffer.from(JSON.stringify(value));
    if (!this.current || this.current.size + bytes.length > this.fileBytes) this.rotate();
    const c = this.current!;
    writeSync(c.fd, bytes, 0, bytes.length, c.size);
    const ref = { file: c.n, at: c.size, length: bytes.length };
    c.size += bytes.length;
    this.files.get(c.n)!.live++;
    return ref;
  }

  read(ref: SpillRef): unknown {
    const f = this.files.get(ref.file);
    if (!f) throw new Error(`spill file ${ref.file} is gone`);
    const bytes = Buffer.allocUnsafe(ref.length);
    readSync(f.fd, bytes, 0, ref.length, ref.at);
    return JSON.parse(bytes.toString('utf8'));
  }

  /** The value is no longer needed; a file none of whose values is needed is deleted (the next write starts another). */
  release(ref: SpillRef): void {
    const f = this.files.get(ref.file);
    if (!f) return;
    f.live--;
    if (f.live <= 0) this.drop(ref.file);
  }

  /** Deletes every file. */
  close(): void {
    for (const n of [...this.files.keys()]) this.drop(n);
    this.current = null;
  }

  private rotate(): void {
    mkdirSync(this.dir, { recursive: true });
    const n = this.next++;
    const fd = openSync(this.file(n), 'w+');
    this.files.set(n, { fd, live: 0 });
    this.current = { n, fd, size: 0 };
  }

  private drop(n: number): void {
    const f = this.files.get(n);
    if (!f) return;
    this.files.delete(n);
    closeSync(f.fd);
    unlinkSync(this.file(n));
    if (this.current?.n === n) this.current = null;
  }

  private file(n: number): string {
    return path.join(this.dir, `spill-${String(n).padStart(6, '0')}.ndjson`);
  }
}
