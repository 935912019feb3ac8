import path from 'node:path';
import { NO_JOURNAL, type Exporter } from '../exporter';
import { TransitionWriter } from '../transition-json';
import type { ClosedEpisode } from '../../model/records';
import { NdjsonWriter } from './ndjson-writer';
import { once } from '../../model/component';

export interface FileExporterOptions {
  dir: string;
  maxFileBytes: number;
}

/** The embedded default: `{dir}/transitions/*.ndjson` and `{dir}/episodes/*.ndjson` (docs/output-contract.md). */
const RUN_BYTES = 1 << 20;

export function createFileExporter(options: FileExporterOptions): Exporter & { files(): { transitions: string | null; episodes: string | null } } {
  const transitions = new NdjsonWriter(path.join(options.dir, 'transitions'), 'transitions', options.maxFileBytes);
  const episodes = new NdjsonWriter(path.join(options.dir, 'episodes'), 'episodes', options.maxFileBytes);
  return {
    name: 'file',
    async start() {},
    async export(batch: ClosedEpisode[], read = NO_JOURNAL) {
      const writer = new TransitionWriter(read);
      // Transitions first: an episode line means all its transitions are on disk. Lines are
      // written in runs of about 1 MiB: few writes for many small episodes, bounded memory for big ones.
      let lines: Buffer[][] = [];
      let bytes = 0;
      for (const c of batch) {
        for (const t of c.transitions) {
          const parts = writer.jsonParts(t);
          lines.push(parts);
          for (const p of parts) bytes += p.length;
        }
        if (bytes >= RUN_BYTES) {
          await transitions.append(lines);
          lines = [];
          bytes = 0;
        }
      }
      await transitions.append(lines);
      await episodes.append(batch.map((c) => Buffer.from(JSON.stringify(c.episode))));
    },
    shutdown: once(async () => {
      await transitions.close();
      await episodes.close();
    }),
    files: () => ({ transitions: transitions.currentFile, episodes: episodes.currentFile }),
  };
}
