import type { Exporter } from '../../src/exporters/exporter';
import type { BodyReader } from '../../src/formats/extract';
import type { ClosedEpisode } from '../../src/model/records';

/** An exporter that hands each batch, with the journal's reader, to the test (throw to refuse it). */
export function memoryExporter(onBatch: (batch: ClosedEpisode[], read: BodyReader) => void): Exporter {
  return {
    name: 'memory',
    start: async () => {},
    shutdown: async () => {},
    export: async (batch: ClosedEpisode[], read?: BodyReader) => onBatch(batch, read!),
  };
}
