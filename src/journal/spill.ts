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
    return this.writeBytes([Buffer.from(JSON.stringify(value))]);
  }

  read(ref: SpillRef): unknown {
    return JSON.parse(this.readBytes(ref).toString('utf8'));
  }

  /** Bytes as one value: `parts` one after another. */
  writeBytes(parts: readonly Buffer[]): SpillRef {
    let length = 0;
    for (const p of parts) length += p.length;
    if (!this.current || (this.current.size > 0 && this.current.size + length > this.fileBytes)) this.rotate();
    const c = this.current!;
    const ref = { file: c.n, at: c.size, length };
    for (const p of parts) {
      for (let done = 0; done < p.length;) done += writeSync(c.fd, p, done, p.length - done, c.size + done);
      c.size += p.length;
    }
    this.files.get(c.n)!.live++;
    return ref;
  }

  /** `length` bytes of a value from `from` on (all of it by default). */
  readBytes(ref: SpillRef, from = 0, length = ref.length - from): Buffer {
    const f = this.files.get(ref.file);
    if (!f) throw new Error(`spill file ${ref.file} is gone`);
    if (from < 0 || length < 0 || from + length > ref.length) throw new RangeError(`spill: bytes ${from}+${length} are outside a value of ${ref.length}`);
    const bytes = Buffer.allocUnsafe(length);
    for (let done = 0; done < length;) {
      const n = readSync(f.fd, bytes, done, length - done, ref.at + from + done);
      if (n === 0) throw new Error(`spill file ${ref.file} is cut short`);
      done += n;
    }
    return bytes;
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
