import { closeSync, mkdirSync, openSync, readSync, rmSync, unlinkSync, writeSync } from 'node:fs';
import path from 'node:path';

/** Where one spilled value lies: its file and byte range. */
export interface SpillRef {
  file: number;
  at: number;
  length: number;
}

/** Bytes of small parts gathered into one write (`Spill.begin`). */
const STAGE_BYTES = 256 * 1024;

/** A value being written (`Spill.begin`). */
export interface SpillValue {
  append(bytes: Buffer): void;
  end(): SpillRef;
  abort(): void;
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
  /** A value is being written (`begin`). */
  private writing = false;
  /** Where `begin`'s small parts are gathered. */
  private stage: Buffer | null = null;

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
    const v = this.begin();
    try {
      for (const p of parts) v.append(p);
    } catch (err) {
      v.abort();
      throw err;
    }
    return v.end();
  }

  /**
   * A value written in parts as they come (one value at a time, within one synchronous step):
   * `end` says where it lies; `abort` forgets it, and the next value is written over its bytes.
   * A file is closed to new values once past `fileBytes`; one value may take it past.
   */
  begin(): SpillValue {
    if (this.writing) throw new Error('spill: a value is being written');
    if (!this.current || this.current.size >= this.fileBytes) this.rotate();
    const c = this.current!;
    const start = c.size;
    // Small parts are gathered and written together: one write for many records.
    const stage = (this.stage ??= Buffer.allocUnsafeSlow(STAGE_BYTES));
    let written = 0;
    let staged = 0;
    const put = (b: Buffer): void => {
      for (let done = 0; done < b.length;) done += writeSync(c.fd, b, done, b.length - done, start + written + done);
      written += b.length;
    };
    const flush = (): void => {
      if (staged > 0) put(stage.subarray(0, staged));
      staged = 0;
    };
    this.writing = true;
    return {
      append: (b) => {
        if (b.length >= STAGE_BYTES / 4 || staged + b.length > STAGE_BYTES) flush();
        if (b.length >= STAGE_BYTES / 4) put(b);
        else staged += b.copy(stage, staged);
      },
      end: () => {
        try {
          flush();
        } finally {
          this.writing = false;
        }
        c.size = start + written;
        this.files.get(c.n)!.live++;
        return { file: c.n, at: start, length: written };
      },
      abort: () => {
        this.writing = false;
      },
    };
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
