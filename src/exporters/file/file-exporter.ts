import path from 'node:path';
import type { Exporter } from '../exporter';
import type { ClosedEpisode } from '../../pipeline/records';
import { NdjsonWriter } from './ndjson-writer';
import { once } from '../../pipeline/component';

export interface FileExporterOptions {
  dir: string;
  maxFileBytes: number;
}

/** The embedded default: `{dir}/transitions/*.ndjson` and `{dir}/episodes/*.ndjson` (DESIGN §4.4). */
export function createFileExporter(options: FileExporterOptions): Exporter & { files(): { transitions: string | null; episodes: string | null } } {
  const transitions = new NdjsonWriter(path.join(options.dir, 'transitions'), 'transitions', options.maxFileBytes);
  const episodes = new NdjsonWriter(path.join(options.dir, 'episodes'), 'episodes', options.maxFileBytes);
  return {
    name: 'file',
    async start() {},
    async export(batch: ClosedEpisode[]) {
      // Transitions first: an episode line means all its transitions are on disk.
      await transitions.append(batch.flatMap((c) => c.transitions.map((t) => JSON.stringify(t))));
      await episodes.append(batch.map((c) => JSON.stringify(c.episode)));
    },
    shutdown: once(async () => {
      await transitions.close();
      await episodes.close();
    }),
    files: () => ({ transitions: transitions.currentFile, episodes: episodes.currentFile }),
  };
}
