import type { Component } from '../pipeline/component';
import type { ClosedEpisode } from '../pipeline/records';

/** An exporter takes closed episodes; it resolves once they are delivered (and rejects otherwise). */
export interface Exporter extends Component {
  readonly name: string;
  export(batch: ClosedEpisode[]): Promise<void>;
}
