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

  append(lines: string[]): Promise<void> {
    if (lines.length === 0) return this.tail;
    const next = this.tail.then(() => this.write(Buffer.from(lines.join('\n') + '\n')));
    this.tail = next.catch(() => {});
    return next;
  }

  private async write(bytes: Buffer): Promise<void> {
    if (!this.handle || (this.size > 0 && this.size + bytes.length > this.maxFileBytes)) await this.rotate();
    await this.handle!.write(bytes);
    if (this.fsync) await this.handle!.sync();
    this.size += bytes.length;
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
