import type { Component } from '../model/component';
import type { ClosedEpisode } from '../model/records';
import type { BodyReader } from '../formats/extract';

/**
 * An exporter takes closed episodes; it resolves once they are delivered (and rejects otherwise).
 * `read` gives the bytes of journaled bodies the transitions refer to (captured calls).
 */
export interface Exporter extends Component {
  readonly name: string;
  export(batch: ClosedEpisode[], read?: BodyReader): Promise<void>;
}

export const NO_JOURNAL: BodyReader = () => {
  throw new Error('no journal to read bodies from');
};
