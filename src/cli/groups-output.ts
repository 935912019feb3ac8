import { closeSync, fsyncSync, openSync, writeSync } from 'node:fs';
import type { Producer } from 'kafkajs';
import type { GroupEvent, Rows } from '../trainer/groups';
import type { CliIo } from './command';
import { remember } from './groups-state';

/** What a `groups` run was asked for, whichever source it reads. */
export interface GroupsRun {
  groupSize: number;
  rows: Rows;
  /** Groups emitted or given up on, one JSON line each. */
  statePath: string;
  /** Append groups to this file (it is their record: no state line per emitted group); else stdout. */
  out: string | undefined;
  timeoutMs: number;
  maxGroups: number;
  idleExitMs: number;
}

/**
 * Where `groups` puts what the assembler yields: each group on stdout, in `--out` (fsync'd) or on
 * `--to-topic`, noted as done before anything moves past it; everything else as a line on stderr.
 */
export class GroupOutput {
  emitted = 0;
  private fd: number | null = null;

  constructor(
    private readonly run: GroupsRun,
    private readonly io: CliIo,
    /** Produce groups to this topic instead of stdout. */
    private readonly toTopic?: { producer: Producer; topic: string },
  ) {}

  /** Opens `--out` (created if need be). */
  open(): void {
    if (this.run.out !== undefined && this.fd === null) this.fd = openSync(this.run.out, 'a');
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }

  async write(events: GroupEvent[]): Promise<void> {
    const { groupSize, statePath } = this.run;
    const toTopic = this.toTopic;
    const err = (line: string): void => void this.io.err.write(`groups: ${line}\n`);
    for (const ev of events) {
      if (ev.kind === 'group') {
        const line = JSON.stringify(ev.batch) + '\n';
        if (this.fd !== null) {
          writeSync(this.fd, line);
          fsyncSync(this.fd);
        } else if (toTopic) {
          await toTopic.producer.send({ topic: toTopic.topic, acks: -1, messages: [{ key: ev.batch.uid, value: line.trimEnd() }] });
          remember(statePath, ev.batch.uid, 'emitted');
        } else {
          this.io.out.write(line);
          remember(statePath, ev.batch.uid, 'emitted');
        }
        this.emitted++;
        err(`emitted ${ev.batch.uid} (${ev.batch.episodes.length} episodes, ${ev.batch.batch.uid.length} rows)`);
      } else if (ev.kind === 'not_exported') {
        const other = ev.rows === 'trajectories' ? 'transitions' : 'trajectories';
        err(`episode ${ev.rollout_id}/${ev.attempt_id} has no exported ${ev.rows} (exporters.records is ${other}); use --rows ${other} or export ${ev.rows}`);
      } else if (ev.kind === 'incomplete') {
        remember(statePath, ev.uid, 'incomplete');
        err(`gave up on ${ev.uid}: ${ev.episodes} of ${groupSize} episodes after ${ev.waitedMs} ms`);
      } else if (ev.kind === 'late') {
        err(`ignored episode ${ev.rollout_id}/${ev.attempt_id}: group ${ev.uid} is already emitted or full`);
      } else if (ev.kind === 'ungrouped') {
        err(`episode ${ev.rollout_id}/${ev.attempt_id} has no group_id; skipped`);
      } else if (ev.kind === 'unresolved_delta') {
        err(`transition ${ev.transition_id} has a prompt delta that cannot be made whole (${ev.reason}); its row is left out`);
      } else {
        err(`dropped ${ev.records} ${this.run.rows} whose episode never arrived`);
      }
    }
  }
}
