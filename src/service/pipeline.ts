import type { Exporter } from '../exporters/exporter';
import type { RecoveryReport } from '../journal/journal';
import { once } from '../model/component';
import type { SequenceCounter } from '../model/sequence';
import type { Logger } from '../telemetry/logger';
import type { Metrics } from '../telemetry/metrics';
import { createApply } from '../pipeline/apply';
import { BodyWriters } from '../pipeline/body-writers';
import { createCaptureSink } from '../pipeline/capture';
import { createContext, type PipelineConfig } from '../pipeline/context';
import { ExportQueue } from '../pipeline/export-queue';
import { Intake } from '../pipeline/intake';
import type { JournalRecord } from '../pipeline/records';
import { Replay } from '../pipeline/replay';
import { keyOf, type EpisodeClose } from '../processors/episodes/assembler';

export type { DeliveredMarker, EpisodeClosedMarker, JournalRecord } from '../pipeline/records';

export interface PipelineDeps {
  logger: Logger;
  metrics: Metrics;
  exporter: Exporter;
  /** Seeded from replayed calls so new calls of a resumed rollout continue its `seq`. */
  sequences?: SequenceCounter;
  now?: () => number;
  /** A full garbage collection, for replay to run between segments (see `Replay`). */
  collect?: () => void;
  /** Closed episodes began (true) or stopped (false) waiting on disk: the exporter is behind. */
  backlogOnDisk?: (onDisk: boolean) => void;
  /** Calls are expected to carry token ids (false when the model server is configured as plain OpenAI). */
  idsExpected?: boolean;
}

/**
 * Records in, closed episodes out. Every record is appended to the journal first: its offset
 * is assigned synchronously and the record is applied to the assembler in that order, so a
 * replay of the journal rebuilds the same state. Intake is acknowledged once the record is
 * durable. Episode closes and deliveries are journaled as markers; closed episodes go to the
 * exporter in close order, retried with backoff; segments below the lowest offset still needed
 * are deleted. The parts are in src/pipeline/; this wires them.
 */
export function createPipeline(config: PipelineConfig, deps: PipelineDeps) {
  const ctx = createContext(config, deps);
  const { journal, assembler, router } = ctx;
  const writers = new BodyWriters(journal, config.processors.episodes.max_open_episodes);
  const queue = new ExportQueue(ctx, {
    exporter: deps.exporter,
    floor: () => Math.min(assembler.minOffset(), router.minParkedOffset(), writers.floor()),
    // Its calls are no base for a later episode's.
    closed: (rolloutId, attemptId) => writers.forget(keyOf(rolloutId, attemptId)),
    onDisk: deps.backlogOnDisk,
    idsExpected: deps.idsExpected,
  });
  const applyRecord = createApply(ctx, queue);
  const intake = new Intake(ctx, queue, applyRecord);
  const replay = new Replay(ctx, { intake, queue, applyRecord, sequences: deps.sequences, collect: deps.collect });
  let recovery: RecoveryReport | null = null;
  let timer: NodeJS.Timeout | null = null;

  return {
    capture: createCaptureSink(ctx, intake, writers),
    assembler,
    journal,
    /**
     * Intake for the rollout API and OTLP: resolves when durable; rejects with RefusedError (full,
     * retry later) or RejectedError (can never apply: late, or for no known rollout).
     */
    submit(record: JournalRecord): Promise<unknown> {
      return intake.submit(record);
    },
    recovery: () => recovery,
    /** Why intake is refused for the export backlog (readiness), or null. */
    backlogFull(): string | null {
      return queue.full ? queue.message() : null;
    },
    async start(): Promise<void> {
      await replay.run((report) => {
        recovery = report;
        queue.open();
      });
      timer = setInterval(() => intake.tick(), config.processors.episodes.tick_interval_ms);
      timer.unref();
      queue.pump();
    },
    /** Closes what is still open (when configured), flushes to the exporter, closes the journal. */
    shutdown: once(async () => {
      if (timer) clearInterval(timer);
      intake.applyDeferred();
      const open = assembler.openCount;
      const drained = config.service.drain_on_shutdown ? assembler.drain(ctx.now()) : [];
      if (config.service.drain_on_shutdown) queue.enqueue(drained);
      await queue.stop();
      logShutdownCloses(ctx.log, drained, open, queue.length === 0);
      await journal.close();
      queue.close();
    }),
  };
}

export type Pipeline = ReturnType<typeof createPipeline>;

/**
 * Says what shutdown did with the episodes still open: those closed with `episode_status:
 * "shutdown"` have no final reward (null), which a trainer that does not filter them reads as
 * reward-0 rows.
 */
function logShutdownCloses(log: Logger, drained: EpisodeClose[], open: number, exported: boolean): void {
  if (open === 0) return;
  const cut = drained.filter((c) => c.status === 'shutdown').length;
  if (drained.length === 0) {
    log.info(`shutdown left ${open} open episode${open === 1 ? '' : 's'} in the journal; the next start resumes them (service.drain_on_shutdown is false)`, {
      open_episodes: open,
    });
    return;
  }
  if (cut === 0) return;
  const where = exported ? 'written' : 'closed (not all exported yet: they stay in the journal for the next start)';
  log.info(
    `shutdown closed ${cut} open episode${cut === 1 ? '' : 's'}, ${where} with episode_status "shutdown" and a null final_reward: ` +
      'trainers should filter episode_status == "shutdown" (they become reward-0 rows otherwise)',
    { shutdown_episodes: cut, completed_episodes: drained.length - cut, exported },
  );
}
