import type { Component } from '../model/component';
import type { ClosedEpisode } from '../model/records';
import type { BodyReader } from '../formats/extract';

/**
 * An episode whose records an exporter encoded ahead of its export (`Exporter.encodeAhead`),
 * while it was away: what is left to do is send the bytes. They wait on disk; `records(i)` reads
 * back, one at a time, the records `encodeAhead` wrote to section i.
 */
export interface EncodedEpisode {
  readonly encoded: true;
  /** What metrics count on delivery: transitions and trajectories it holds, each transition's end (ms). */
  readonly transitions: number;
  readonly trajectories: number;
  readonly endedAt: readonly number[];
  records(section: number): Iterable<Buffer>;
}

export type ExportItem = ClosedEpisode | EncodedEpisode;

export function isEncoded(item: ExportItem): item is EncodedEpisode {
  return (item as EncodedEpisode).encoded === true;
}

/**
 * An exporter takes closed episodes; it resolves once they are delivered (and rejects otherwise).
 * `read` gives the bytes of journaled bodies the transitions refer to (captured calls).
 */
export interface Exporter extends Component {
  readonly name: string;
  /** Episodes encoded ahead come only to exporters with `encodeAhead`. */
  export(batch: ExportItem[], read?: BodyReader): Promise<void>;
  /**
   * Encodes the episode's records as `export` sends them, handing each to `write` as it is
   * encoded (`parts` make one record), in sections of the exporter's own layout, section by
   * section in order: a backlog waiting for an exporter that is away is encoded while it waits,
   * a record at a time, and the drain afterwards only sends bytes.
   */
  encodeAhead?(c: ClosedEpisode, read: BodyReader, write: (section: number, parts: readonly Buffer[]) => void): void;
}

export const NO_JOURNAL: BodyReader = () => {
  throw new Error('no journal to read bodies from');
};
