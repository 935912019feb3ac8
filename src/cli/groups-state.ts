import { appendFileSync, closeSync, existsSync, fsyncSync, openSync, readFileSync } from 'node:fs';
import type { EpisodeSummary } from '../model/records';

/**
 * The groups handled before this run: every group line of the output file (`--out`), and the
 * state file's lines (`{uid, status: 'emitted' | 'incomplete', at}`), each a JSON object. A uid
 * listed both ways counts as emitted.
 */
export interface DoneGroups {
  /** Every uid to skip: emitted or given up on. */
  uids: Set<string>;
  /** The emitted ones, in either file. */
  emitted: Set<string>;
  /** The output file and the groups it lists, with `--out`. */
  out: { path: string; uids: Set<string> } | null;
  /** The state file and what it alone lists (what the start line reports). */
  state: { path: string; emitted: number; givenUp: number };
}

export function loadDone(statePath: string, out: string | undefined): DoneGroups {
  const inOut = new Set(out === undefined ? [] : listed(out).keys());
  const inState = listed(statePath);
  const stateEmitted = [...inState.values()].filter((s) => s === 'emitted').length;
  return {
    uids: new Set([...inOut, ...inState.keys()]),
    emitted: new Set([...inOut, ...[...inState].filter(([, s]) => s === 'emitted').map(([uid]) => uid)]),
    out: out === undefined ? null : { path: out, uids: inOut },
    state: { path: statePath, emitted: stateEmitted, givenUp: inState.size - stateEmitted },
  };
}

/** The groups a file lists, by uid: emitted (a group line, or a state line) or given up on. */
function listed(file: string): Map<string, 'emitted' | 'incomplete'> {
  const uids = new Map<string, 'emitted' | 'incomplete'>();
  if (!existsSync(file)) return uids;
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    let o: { uid?: unknown; status?: unknown } | null;
    try {
      o = JSON.parse(line) as typeof o;
    } catch {
      // A torn last line (crash mid-write) is not a record.
      continue;
    }
    if (typeof o?.uid !== 'string') continue;
    if (uids.get(o.uid) !== 'emitted') uids.set(o.uid, o.status === 'incomplete' ? 'incomplete' : 'emitted');
  }
  return uids;
}

/** Appends a done group to the state file, fsync'd before anything moves past it. */
export function remember(statePath: string, uid: string, status: 'emitted' | 'incomplete'): void {
  const fd = openSync(statePath, 'a');
  try {
    appendFileSync(fd, JSON.stringify({ uid, status, at: new Date().toISOString() }) + '\n');
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * Said at start when the state file lists groups: a run that emits nothing because of an old
 * state file says so before it reads anything. The Python client prints the same line.
 */
export function stateLine(done: DoneGroups): string | null {
  const { path, emitted, givenUp } = done.state;
  if (emitted + givenUp === 0) return null;
  return `groups: state file ${path} lists ${emitted} groups already emitted and ${givenUp} given up on; they are not emitted again (delete it or pass --state FILE to start over)\n`;
}

/** The episodes a run read, so that a run that emits no group can say why (`noGroupLine`). */
export class EpisodeTally {
  private readonly episodes = new Set<string>();
  private readonly groups = new Set<string>();

  constructor(private readonly done: DoneGroups) {}

  note(e: EpisodeSummary): void {
    this.episodes.add(`${e.rollout_id}\u0000${e.attempt_id}`);
    if (typeof e.group_id === 'string') this.groups.add(e.group_id);
  }

  /** Why nothing was emitted: the first of these that applies. The Python client prints the same lines. */
  noGroupLine(groupSize: number): string {
    const again = [...this.groups].filter((uid) => this.done.emitted.has(uid));
    if (again.length > 0) {
      // Named where they are listed: the output file with --out, else the state file.
      const { out, state } = this.done;
      const where = out && again.some((uid) => out.uids.has(uid)) ? out.path : state.path;
      return `groups: emitted no group: ${again.length} complete groups were already emitted (listed in ${where})\n`;
    }
    if (this.episodes.size > 0)
      return `groups: emitted no group: ${this.episodes.size} episodes read in ${this.groups.size} groups, none complete (--group-size ${groupSize})\n`;
    return 'groups: emitted no group: no episodes read\n';
  }
}
