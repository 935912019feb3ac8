import { RefusedError, type CaptureSink } from '../model/component';
import type { CallRecord, CallStartRecord } from '../model/records';
import { keyOf } from '../processors/episodes/assembler';
import type { BodyWriters } from './body-writers';
import type { Context } from './context';
import type { Intake } from './intake';

/** A request's body bytes handed over at once up to this many are kept in memory for the export (see `body`). */
const KEEP_REQUEST_BYTES = 16 * 1024;

/**
 * What the LLM proxy journals a call through: its start and end records (via intake) and its
 * bodies, as deltas against its rollout's previous call when it has one (body-writers.ts).
 * Proxied calls are never refused: a capture the journal cannot take is counted and dropped.
 */
export function createCaptureSink(ctx: Context, intake: Intake, writers: BodyWriters): CaptureSink {
  const { journal, assembler, m, log } = ctx;

  function submitCapture(record: CallStartRecord | CallRecord): number | null {
    try {
      const { offset, durable } = intake.appendAt(record);
      durable.catch(() => m.captureDrops.inc({ reason: 'journal_unwritable' }));
      return offset;
    } catch (err) {
      refusedCapture(err);
      return null;
    }
  }

  function refusedCapture(err: unknown): void {
    const code = err instanceof RefusedError ? err.code : null;
    const reason = code === 'JOURNAL_FULL' ? 'journal_full' : code === 'EXPORT_BACKLOG' ? 'export_backlog' : 'journal_unwritable';
    m.captureDrops.inc({ reason });
    const why = reason === 'export_backlog' ? 'the exporter is behind' : 'journal cannot take captures';
    log.once(`capture_${reason}`, 'warn', `${why}; proxied calls are still served`, { err });
  }

  return {
    callStarted(record: CallStartRecord): number | null {
      const id = submitCapture(record);
      const { rolloutId, attemptId, source } = record.correlation;
      const floor = id === null || source === 'self' ? null : assembler.floorOf(rolloutId, attemptId);
      if (floor !== null) writers.begin(id!, keyOf(rolloutId, attemptId), floor);
      return id;
    },
    body(callId: number, kind: 'request' | 'response' | 'agent_request' | 'agent_response', bytes: Buffer | readonly Buffer[], frames: number[]): boolean {
      try {
        const writer = kind === 'request' || kind === 'response' ? writers.writerFor(callId, kind) : null;
        if (writer) {
          if (Buffer.isBuffer(bytes)) writer.write(bytes, frames);
          else writer.writeParts(bytes, frames);
        }
        // Journaled as they are (a call that names no rollout, whose episode is exported as soon
        // as it ends): a copy stays in memory for that export. Not of a large request's bytes: the
        // export reads a request only for what the proxy did not note (whether it names an image),
        // and the copy cost ~150 µs a MiB of prompt (read from the file when it is needed).
        else frames.push(journal.appendBody(callId, kind, bytes, kind === 'request' ? KEEP_REQUEST_BYTES : Infinity));
        return true;
      } catch (err) {
        refusedCapture(err);
        return false;
      }
    },
    bodyFlush(callId: number, kind: 'request' | 'response', frames: number[]): boolean {
      try {
        writers.current(callId, kind)?.flush(frames);
        return true;
      } catch (err) {
        refusedCapture(err);
        return false;
      }
    },
    restartBody(callId: number, kind: 'request' | 'response'): void {
      writers.restart(callId, kind);
    },
    requestRepeats(callId: number): { shared: number; notes: unknown } | null {
      const writer = writers.current(callId, 'request');
      return writer ? { shared: writer.shared, notes: writer.baseNotes } : null;
    },
    noteRequest(callId: number, notes: unknown): void {
      const writer = writers.current(callId, 'request');
      if (writer) writer.notes = notes;
    },
    callEnded(record: CallRecord): void {
      writers.ended(record);
      if (submitCapture(record) === null) {
        // Its start may have been kept: the lost call must not hold its episode open.
        assembler.abandonCall(record.correlation.rolloutId, record.correlation.attemptId, record.seq);
      }
    },
    flush(): void {
      journal.flushNow();
    },
    afterWrite(then: () => void): void {
      journal.afterWrite(then);
    },
    writeSoon(): void {
      journal.writeSoon();
    },
    beforeWrite(then: () => void): void {
      journal.beforeWrite(then);
    },
    read(frames: readonly number[], scratch?: Buffer): Buffer {
      journal.flushNow();
      return journal.readBodies(frames, scratch);
    },
  };
}
