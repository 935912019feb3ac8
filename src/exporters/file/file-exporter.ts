import path from 'node:path';
import { isEncoded, NO_JOURNAL, type Exporter, type ExportItem } from '../exporter';
import { TransitionWriter } from '../transition-json';
import type { ClosedEpisode } from '../../model/records';
import { NdjsonWriter } from './ndjson-writer';
import { deltaJsonParts, PromptDeltaBytes } from '../prompt-delta-bytes';
import { once } from '../../model/component';
import { trajectoryJsonParts } from '../trajectory-json';

export interface FileExporterOptions {
  dir: string;
  maxFileBytes: number;
  /** `delta`: a transition that continues the previous call of its episode carries only its new prompt ids. */
  promptIds?: 'full' | 'delta';
  /** What is written per attempt (`exporters.records`); default both. */
  records?: 'trajectories' | 'transitions' | 'both';
}

/**
 * The embedded default: `{dir}/trajectories/*.ndjson`, `{dir}/transitions/*.ndjson` (as
 * `records` asks) and `{dir}/episodes/*.ndjson` (docs/output-contract.md).
 */
const RUN_BYTES = 1 << 20;

export function createFileExporter(
  options: FileExporterOptions,
): Exporter & { files(): { transitions: string | null; trajectories: string | null; episodes: string | null } } {
  const records = options.records ?? 'both';
  const transitions = records !== 'trajectories' ? new NdjsonWriter(path.join(options.dir, 'transitions'), 'transitions', options.maxFileBytes) : null;
  const trajectories = records !== 'transitions' ? new NdjsonWriter(path.join(options.dir, 'trajectories'), 'trajectories', options.maxFileBytes) : null;
  const episodes = new NdjsonWriter(path.join(options.dir, 'episodes'), 'episodes', options.maxFileBytes);
  // Bodies are read into one reused buffer (allocating a fresh one per body costs page faults
  // per byte); a run is written once it or the arena is full.
  // Writes are synchronous, so one export is done with the arena before the next begins.
  const arena = Buffer.allocUnsafeSlow(2 * RUN_BYTES);
  return {
    name: 'file',
    async start() {},
    async export(batch: ExportItem[], read = NO_JOURNAL) {
      // Nothing is encoded ahead for files (no encodeAhead): a file is never away for long.
      if (batch.some(isEncoded)) throw new Error('exporter file: episodes encoded ahead are not supported');
      exportBatch(batch as ClosedEpisode[], new TransitionWriter(read, arena));
    },
    shutdown: once(async () => {
      transitions?.close();
      trajectories?.close();
      episodes.close();
    }),
    files: () => ({ transitions: transitions?.currentFile ?? null, trajectories: trajectories?.currentFile ?? null, episodes: episodes.currentFile }),
  };

  function exportBatch(batch: ClosedEpisode[], writer: TransitionWriter): void {
    // Transitions and trajectories first: an episode line means all its records are on disk.
    // Lines are written in runs of about 1 MiB: few writes for many small episodes, bounded
    // memory for big ones.
    let lines: Buffer[][] = [];
    let trajectoryLines: Buffer[][] = [];
    let bytes = 0;
    const flush = (): void => {
      transitions?.append(lines);
      trajectories?.append(trajectoryLines);
      writer.reuseArena();
      lines = [];
      trajectoryLines = [];
      bytes = 0;
    };
    const add = (to: Buffer[][], parts: Buffer[]): void => {
      to.push(parts);
      for (const p of parts) bytes += p.length;
      if (bytes >= RUN_BYTES || writer.arenaUsed >= RUN_BYTES) flush();
    };
    for (const c of batch) {
      if (transitions) {
        const deltas = options.promptIds === 'delta' ? new PromptDeltaBytes(writer) : null;
        for (const t of c.transitions) {
          const delta = deltas?.next(t) ?? null;
          add(lines, delta ? deltaJsonParts(writer, t, delta) : writer.jsonParts(t));
        }
      }
      if (trajectories) {
        for (const t of c.trajectories)
          add(
            trajectoryLines,
            trajectoryJsonParts(writer, t).map((p) => (typeof p === 'string' ? Buffer.from(p) : p)),
          );
      }
    }
    flush();
    episodes.append(batch.map((c) => Buffer.from(JSON.stringify(c.episode))));
  }
}
