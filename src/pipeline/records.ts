import type { EpisodeStatus, PipelineRecord } from '../model/records';
import type { SpanObservation } from './span-router';

/** Journal markers: where an episode closed, and how far delivery got. */
export interface EpisodeClosedMarker {
  type: 'episode_closed';
  rolloutId: string;
  attemptId: string;
  status: EpisodeStatus;
  at: number;
}
export interface DeliveredMarker {
  type: 'delivered';
  /** Every episode whose close marker is at or below this offset is delivered. */
  upTo: number;
}
export type JournalRecord = Exclude<PipelineRecord, { type: 'tool_span' } | { type: 'agent_span' }> | SpanObservation | EpisodeClosedMarker | DeliveredMarker;
