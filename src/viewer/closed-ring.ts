import type { EpisodeSummary } from '../model/records';

/**
 * The recently closed episodes the viewer shows (docs/operations.md#the-viewer): the newest first,
 * as many as fit in `maxBytes` of their JSON. Filled only while somebody looks (see `Viewer`).
 */

/** Export state of a closed episode, as the viewer last saw it. */
export type ExportState = 'exporting' | 'delivered' | 'retrying';

export interface ClosedTrajectory {
  trajectory_id: string;
  segment: number;
  start_reason: string;
  tokens: number;
  /** The trajectory as exported, less routing rows and mask ids (JSON bytes). */
  json: Buffer;
  /** Each call's answer as recorded, when tokens cannot be shown as text. */
  turnText: (string | null)[] | null;
}

export interface ClosedEntry {
  key: string;
  episode: EpisodeSummary;
  agents: string[];
  tokens: number;
  trajectories: ClosedTrajectory[];
  export: ExportState;
  /** Why the last export failed, while it is retried. */
  exportError: string | null;
  bytes: number;
}

export class ClosedRing {
  /** Oldest first. */
  private readonly entries = new Map<string, ClosedEntry>();
  private bytes = 0;
  /** Trajectories by id, for the trajectory view. */
  private readonly byTrajectory = new Map<string, ClosedEntry>();

  constructor(private readonly maxBytes: number) {}

  get size(): number {
    return this.entries.size;
  }

  get usedBytes(): number {
    return this.bytes;
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  get(key: string): ClosedEntry | undefined {
    return this.entries.get(key);
  }

  /** Adds an episode, forgetting the oldest until it fits; one bigger than the ring is not kept. */
  add(entry: ClosedEntry): void {
    this.remove(entry.key);
    if (entry.bytes > this.maxBytes) return;
    while (this.bytes + entry.bytes > this.maxBytes && this.entries.size > 0) this.remove(this.entries.keys().next().value!);
    this.entries.set(entry.key, entry);
    this.bytes += entry.bytes;
    for (const t of entry.trajectories) this.byTrajectory.set(t.trajectory_id, entry);
  }

  trajectory(id: string): { entry: ClosedEntry; trajectory: ClosedTrajectory } | null {
    const entry = this.byTrajectory.get(id);
    const trajectory = entry?.trajectories.find((t) => t.trajectory_id === id);
    return entry && trajectory ? { entry, trajectory } : null;
  }

  /** Newest first. */
  list(): ClosedEntry[] {
    return [...this.entries.values()].reverse();
  }

  private remove(key: string): void {
    const old = this.entries.get(key);
    if (!old) return;
    this.entries.delete(key);
    this.bytes -= old.bytes;
    for (const t of old.trajectories) if (this.byTrajectory.get(t.trajectory_id) === old) this.byTrajectory.delete(t.trajectory_id);
  }
}
