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
export function createFileExporter(options: FileExporterOptions): Exporter & { files(): { transitions: string | null; episodes: string | null } } {
  const transitions = new NdjsonWriter(path.join(options.dir, 'transitions'), 'transitions', options.maxFileBytes);
  const episodes = new NdjsonWriter(path.join(options.dir, 'episodes'), 'episodes', options.maxFileBytes);
  return {
    name: 'file',
    async start() {},
    async export(batch: ClosedEpisode[], read = NO_JOURNAL) {
      const writer = new TransitionWriter(read);
      // Transitions first: an episode line means all its transitions are on disk. One episode's
      // transitions at a time, so memory holds one episode's bodies, not the batch's.
      for (const c of batch) await transitions.append(c.transitions.map((t) => writer.jsonParts(t)));
      await episodes.append(batch.map((c) => Buffer.from(JSON.stringify(c.episode))));
    },
    shutdown: once(async () => {
      await transitions.close();
      await episodes.close();
    }),
    files: () => ({ transitions: transitions.currentFile, episodes: episodes.currentFile }),
  };
}
