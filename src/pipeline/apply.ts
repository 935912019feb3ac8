import type { EpisodeClose } from '../processors/episodes/assembler';
import type { Context } from './context';
import type { ExportQueue } from './export-queue';
import type { JournalRecord } from './records';
import { spanRecords } from './span-router';

/**
 * Applies one journaled record to the pipeline's state (the span router, the episode assembler,
 * the export queue for delivered markers); returns what closed. Live intake and replay apply the
 * same records in the same offset order, so a replay rebuilds the same state.
 */
export function createApply(ctx: Context, queue: ExportQueue): (record: JournalRecord, offset: number) => EpisodeClose[] {
  const { assembler, router, m, log } = ctx;
  return function applyRecord(record, offset) {
    switch (record.type) {
      case 'span': {
        const r = router.route(record, offset);
        if (r === 'parked') return [];
        if (r === 'dropped') {
          m.spansClassified.inc({ kind: record.what.kind, result: 'dropped' });
          log.once('parked_full', 'warn', 'too many spans wait for their rollout; dropping new ones', {
            max_pending_spans: ctx.config.processors.spans.max_pending_spans,
          });
          return [];
        }
        return spanRecords(record, r).flatMap((rec) => assembler.step(rec, offset));
      }
      case 'call_start': {
        const closed = assembler.step(record, offset);
        if (record.traceId) {
          const released = router.noteTrace(record.traceId, { rolloutId: record.correlation.rolloutId, attemptId: record.correlation.attemptId });
          for (const p of released) for (const rec of spanRecords(p.observation, record.correlation)) closed.push(...assembler.step(rec, p.offset));
        }
        return closed;
      }
      case 'episode_closed': {
        const c = assembler.forceClose(record.rolloutId, record.attemptId, record.status, record.at);
        return c ? [c] : [];
      }
      case 'delivered': {
        queue.delivered(record.upTo);
        return [];
      }
      default:
        return assembler.step(record, offset);
    }
  };
}
