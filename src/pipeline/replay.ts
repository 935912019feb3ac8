import { isBodyPayload, readBodyHeader } from '../journal/frame';
import type { RecoveryReport } from '../journal/journal';
import type { CallRecord, CallStartRecord } from '../model/records';
import type { SequenceCounter } from '../model/sequence';
import type { EpisodeClose } from '../processors/episodes/assembler';
import type { Context } from './context';
import type { ExportQueue } from './export-queue';
import type { Intake } from './intake';
import type { JournalRecord } from './records';
import { extend } from '../model/extend';

/** Calls started but not ended in the journal, with their body frames (a process killed mid-call). */
type Unended = Map<number, { start: CallStartRecord; bodies: Record<'request' | 'response' | 'agent_request' | 'agent_response', number[]> }>;

export interface ReplayDeps {
  intake: Intake;
  queue: ExportQueue;
  applyRecord: (record: JournalRecord, offset: number) => EpisodeClose[];
  /** Seeded from replayed calls so new calls of a resumed rollout continue its `seq`. */
  sequences?: SequenceCounter;
  /**
   * A full garbage collection, run after every 16 MiB replayed and at the end: replay parses
   * every record of a journal that may have grown for a whole exporter outage, and the heap V8
   * keeps committed for that garbage would otherwise stay in the process's memory.
   */
  collect?: () => void;
}

/**
 * Rebuilds the pipeline's state from the journal at start-up: every record applied in offset
 * order, closed episodes queued for export again until a delivered marker covers them, calls a
 * crash cut recorded as aborted.
 */
export class Replay {
  constructor(
    private readonly ctx: Context,
    private readonly deps: ReplayDeps,
  ) {}

  /** Replays the journal; `opened` is told as soon as the journal is open, before cut calls are recorded. */
  async run(opened: (report: RecoveryReport) => void): Promise<RecoveryReport> {
    const { assembler, journal, m, log } = this.ctx;
    assembler.replaying = true;
    const unended: Unended = new Map();
    const recovery = await journal.open((offset, payload) => this.record(unended, offset, payload), this.deps.collect);
    opened(recovery);
    assembler.replaying = false;
    assembler.forgetInFlight();
    this.recoverUnended(unended);
    this.deps.intake.applyDeferred();
    m.journalRecovered.inc({ kind: 'torn_tail' }, recovery.tornTails);
    m.journalRecovered.inc({ kind: 'corrupt_tail' }, recovery.corruptTails);
    m.journalRecovered.inc({ kind: 'corrupt_segment' }, recovery.corruptSegments);
    this.ctx.journalMetrics();
    if (recovery.records > 0) {
      this.deps.collect?.();
      log.info('journal replayed', extend(recovery, { open_episodes: assembler.openCount, to_export: this.deps.queue.length }));
    }
    return recovery;
  }

  private record(unended: Unended, offset: number, payload: Buffer): void {
    if (isBodyPayload(payload)) {
      const { callId, kind } = readBodyHeader(payload);
      unended.get(callId)?.bodies[kind].push(offset);
      return;
    }
    let record: JournalRecord;
    try {
      record = JSON.parse(payload.toString('utf8')) as JournalRecord;
    } catch (err) {
      this.ctx.quarantine(offset, payload.toString('base64'), err);
      return;
    }
    try {
      if (record.type === 'call_start' || record.type === 'call') {
        if (record.correlation.source !== 'self') this.deps.sequences?.observe(record.correlation.rolloutId, record.correlation.attemptId, record.seq);
      }
      if (record.type === 'call_start') unended.set(offset, { start: record, bodies: { request: [], response: [], agent_request: [], agent_response: [] } });
      else if (record.type === 'call' && record.callId !== undefined) unended.delete(record.callId);
      // While replaying only close markers close episodes, so each closed episode here has its marker.
      this.deps.queue.enqueue(this.deps.applyRecord(record, offset), offset);
    } catch (err) {
      this.ctx.quarantine(offset, record, err);
    }
  }

  /**
   * A call whose response began but whose end record is missing (the process was killed while
   * it streamed) is recorded as aborted with what its body frames hold, so whatever the agent got
   * is not lost. Calls with no response bytes never answered anything and are forgotten.
   */
  private recoverUnended(unended: Unended): void {
    for (const [callId, { start, bodies }] of unended) {
      if (bodies.response.length === 0) continue;
      let streamed = true;
      try {
        const head = this.ctx.journal.readBodies([bodies.response[0]]);
        streamed = head.toString('latin1', 0, 64).trimStart()[0] !== '{';
      } catch {
        // Unreadable: extraction will say so.
      }
      const record: CallRecord = {
        type: 'call',
        correlation: start.correlation,
        seq: start.seq,
        api: start.api ?? 'chat.completions',
        traceId: start.traceId,
        spanId: null,
        callId,
        bodies: { request: bodies.request, response: bodies.response, encoding: null },
        streamed,
        status: 'aborted',
        httpStatus: null,
        error: 'the journal has no end for this call (the sidecar stopped before it ended, or the journal was full); recovered from the journal',
        injected: [],
        truncated: true,
        startedAt: start.at,
        endedAt: start.at,
        latencyMs: 0,
        ttftMs: null,
      };
      try {
        this.deps.intake.append(record).catch(() => {});
        this.ctx.m.journalRecovered.inc({ kind: 'unended_call' });
      } catch (err) {
        this.ctx.log.once('recover_unended', 'warn', 'a call cut by a restart could not be recorded', { err });
      }
    }
  }
}
