import { open, readdir } from 'node:fs/promises';
import path from 'node:path';
import type { EpisodeSummary, Trajectory } from '../model/records';
import type { Position, Rows } from './groups';
import type { WireTransition } from './prompt-delta';

/** One line of the file exporter's output, decoded, or why it could not be. */
export type FileLine =
  | { kind: 'trajectory'; record: Trajectory; pos: Position; where: string }
  | { kind: 'transition'; record: WireTransition; pos: Position; where: string }
  | { kind: 'episode'; record: EpisodeSummary; pos: Position; where: string }
  | { kind: 'undecodable'; where: string };

/** Bytes read from a file at a time: lines longer than this are put together from several reads. */
const READ_BYTES = 1 << 20;

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * The file exporter's output, `{dir}/trajectories/`, `transitions/` and `episodes/*.ndjson`, read
 * as the Python client's `FileSource` reads it: each pass reads the new whole lines of the record
 * directory `rows` names (trajectories or transitions), then those of `episodes/`, each directory's
 * files in name order (the exporter names them `{kind}-{start}-{pid}-{n}.ndjson`, so rotated files
 * sort in the order they were written). The exporter writes an episode's records before its
 * episode line, so files read whole give every record an episode lists before the episode (a pass
 * that races the exporter may see an episode first: its group completes on the next pass). A line
 * still being written (no newline yet) is left for the next pass. Lines are read in 1 MiB reads,
 * never a whole file at once. Files carry no chunks (those are Kafka messages only); prompt deltas
 * (`exporters.file.prompt_ids: delta`) are left to the assembler.
 */
export class FileSource {
  /** Per file, how far whole lines have been read: bytes and lines. */
  private readonly read = new Map<string, { bytes: number; lines: number }>();
  /** One read buffer: passes, and the files of a pass, are read one after the other. */
  private readonly buffer = Buffer.allocUnsafe(READ_BYTES);

  constructor(
    readonly dir: string,
    readonly rows: Rows,
  ) {}

  /** The lines written since the last pass. */
  async *pass(): AsyncGenerator<FileLine> {
    for (const [kind, sub] of [
      [this.rows === 'trajectories' ? 'trajectory' : 'transition', this.rows],
      ['episode', 'episodes'],
    ] as const) {
      for (const file of await ndjsonFiles(path.join(this.dir, sub))) yield* this.newLines(kind, file);
    }
  }

  private async *newLines(kind: 'trajectory' | 'transition' | 'episode', file: string): AsyncGenerator<FileLine> {
    const done = this.read.get(file) ?? { bytes: 0, lines: 0 };
    this.read.set(file, done);
    let handle;
    try {
      handle = await open(file, 'r');
    } catch (err) {
      // Removed since the directory was listed (by an operator: the exporter never removes files).
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw err;
    }
    try {
      const buffer = this.buffer;
      let partial: Buffer[] = [];
      let at = done.bytes;
      for (;;) {
        const { bytesRead } = await handle.read(buffer, 0, READ_BYTES, at);
        if (bytesRead === 0) return;
        const chunk = buffer.subarray(0, bytesRead);
        let start = 0;
        for (let nl = chunk.indexOf(10); nl !== -1; nl = chunk.indexOf(10, start)) {
          const line = partial.length === 0 ? chunk.subarray(start, nl) : Buffer.concat([...partial, chunk.subarray(start, nl)]);
          partial = [];
          start = nl + 1;
          done.bytes = at + start;
          done.lines++;
          const decoded = decode(kind, line, file, done.lines);
          if (decoded) yield decoded;
        }
        if (start < bytesRead) partial.push(Buffer.from(chunk.subarray(start)));
        at += bytesRead;
      }
    } finally {
      await handle.close();
    }
  }
}

/** The `.ndjson` files of `dir` by name; none when the directory is not there (yet). */
async function ndjsonFiles(dir: string): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  return names
    .filter((n) => n.endsWith('.ndjson'))
    .sort()
    .map((n) => path.join(dir, n));
}

/** A JSON object, or undecodable; a blank line is nothing. */
function decode(kind: 'trajectory' | 'transition' | 'episode', line: Buffer, file: string, lineNo: number): FileLine | null {
  const where = `${file}:${lineNo}`;
  let record: unknown;
  try {
    const text = utf8.decode(line);
    if (text.trim() === '') return null;
    record = JSON.parse(text);
  } catch {
    return { kind: 'undecodable', where };
  }
  if (typeof record !== 'object' || record === null || Array.isArray(record)) return { kind: 'undecodable', where };
  // Nothing is committed from files (the state file is the progress), so no group waits for
  // another's records: each line is a partition of its own.
  const pos: Position = { topic: file, partition: lineNo, offset: 0 };
  return { kind, record, pos, where } as FileLine;
}
