import { FileSource, type FileLine } from '../trainer/file-source';
import { GroupAssembler, type GroupEvent } from '../trainer/groups';
import type { CliIo } from './command';
import { stopOnSignals } from './consumer-runner';
import { GroupOutput, type GroupsRun } from './groups-output';
import type { EpisodeTally } from './groups-state';

/** Between passes over files that had nothing new, when following them. */
const POLL_MS = 250;

/**
 * `groups --data-dir`: the Python client's loop over the file exporter's files, step for step, so
 * the two emit the same groups in the same order. Each pass reads every new line (records first,
 * then episodes) into the assembler; when following, timeouts tick between passes, as often as on
 * Kafka. Without `follow` one pass is the run, and groups still incomplete then are left for a
 * later run (not given up on: their episodes may be in files not written yet). Nothing is
 * committed: emitted groups are in the state file (or `--out`), and a run reads the files from
 * their start.
 */
export async function groupsFromFiles(
  run: GroupsRun,
  files: { dir: string; follow: boolean },
  done: Set<string>,
  tally: EpisodeTally,
  io: CliIo,
): Promise<{ code: number; emitted: number }> {
  const assembler = new GroupAssembler({ groupSize: run.groupSize, timeoutMs: run.timeoutMs, rows: run.rows }, new Set(done));
  const output = new GroupOutput(run, io);
  const source = new FileSource(files.dir, run.rows);
  let stopped = false;
  let wake = (): void => {};
  const release = stopOnSignals(() => {
    stopped = true;
    wake();
  });
  const tickMs = Math.min(1000, Math.max(50, run.timeoutMs / 4));
  let lastTick = Date.now();
  let lastActivity = lastTick;
  let ended = false;
  const emit = async (events: GroupEvent[]): Promise<void> => {
    await output.write(events);
    if (output.emitted >= run.maxGroups) stopped = true;
  };
  try {
    output.open();
    while (!stopped) {
      let lines = 0;
      for await (const line of source.pass()) {
        lines++;
        lastActivity = Date.now();
        await emit(add(line, assembler, tally, io));
        if (stopped) break;
      }
      const now = Date.now();
      // Read once, the files are all there is: a group incomplete at their end is left for a later
      // run over more of them, not given up on, however long the read took.
      if (files.follow && now - lastTick >= tickMs) {
        lastTick = now;
        await emit(assembler.tick(now));
      }
      if (!files.follow) {
        ended = !stopped;
        break;
      }
      if (now - lastActivity > run.idleExitMs) break;
      if (lines === 0 && !stopped)
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, POLL_MS);
        });
    }
  } finally {
    release();
    output.close();
  }
  if (ended && assembler.pendingGroups > 0) io.err.write(`groups: ${assembler.pendingGroups} groups still incomplete at the end of ${files.dir}\n`);
  return { code: 0, emitted: output.emitted };
}

function add(line: FileLine, assembler: GroupAssembler, tally: EpisodeTally, io: CliIo): GroupEvent[] {
  const now = Date.now();
  const skip = (): GroupEvent[] => {
    io.err.write(`groups: skipping an undecodable line at ${line.where}\n`);
    return [];
  };
  if (line.kind === 'undecodable') return skip();
  try {
    if (line.kind === 'episode') {
      tally.note(line.record);
      return assembler.addEpisode(line.record, line.pos, now);
    }
    return line.kind === 'trajectory' ? assembler.addTrajectory(line.record, line.pos, now) : assembler.addTransition(line.record, line.pos, now);
  } catch {
    // A JSON object that is not a record (fields missing).
    return skip();
  }
}
