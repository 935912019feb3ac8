import { isEncoded, type Exporter, type ExportItem } from '../../src/exporters/exporter';
import type { BodyReader } from '../../src/formats/extract';
import type { ClosedEpisode } from '../../src/model/records';

/** An exporter that hands each batch, with the journal's reader, to the test (throw to refuse it). */
export function memoryExporter(onBatch: (batch: ClosedEpisode[], read: BodyReader) => void): Exporter {
  return {
    name: 'memory',
    start: async () => {},
    shutdown: async () => {},
    export: async (batch: ExportItem[], read?: BodyReader) => {
      // No encodeAhead here: the queue gives it episodes only.
      if (batch.some(isEncoded)) throw new Error('memory exporter: given an episode encoded ahead');
      onBatch(batch as ClosedEpisode[], read!);
    },
  };
}
