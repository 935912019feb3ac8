import { appendFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import type { Config } from '../config/schema';
import type { BodyReader } from '../formats/extract';
import { Journal } from '../journal/journal';
import { EpisodeAssembler } from '../processors/episodes/assembler';
import { LimitedWarnings, type Logger } from '../telemetry/logger';
import type { Metrics } from '../telemetry/metrics';
import { ImageStore } from './image-store';
import { TraceRouter } from './span-router';

/**
 * The settings the pipeline reads: its service settings, the processors, and which records the
 * exporter writes. A test (or another host) builds the pipeline from these alone.
 */
export type PipelineConfig = {
  service: Pick<
    Config['service'],
    'data_dir' | 'journal' | 'max_export_backlog' | 'export_backlog_memory_records' | 'export_backlog_encoded_bytes' | 'drain_on_shutdown'
  >;
  processors: Config['processors'];
  exporters: Pick<Config['exporters'], 'records'>;
};

export interface ContextDeps {
  logger: Logger;
  metrics: Metrics;
  now?: () => number;
}

/** What the parts of the pipeline share: the journal, the state it rebuilds, and how they report. */
export interface Context {
  config: PipelineConfig;
  log: Logger;
  m: Metrics;
  now: () => number;
  dataDir: string;
  journal: Journal;
  assembler: EpisodeAssembler;
  router: TraceRouter;
  /** Reads body frames back from the journal. */
  read: (offsets: readonly number[], scratch?: Buffer) => Buffer;
  /** Counts, logs and sets aside a record that cannot be processed; it is skipped. */
  quarantine(offset: number, record: unknown, err: unknown): void;
  /** A warning, at most one line per key each 10 s. */
  warnLimited(key: string, msg: string, fields: object): void;
  /** Sets the journal's size gauges. */
  journalMetrics(): void;
  /** Where trajectories' images are stored (`{data_dir}/images`). */
  images: ImageStore;
}

export function createContext(config: PipelineConfig, deps: ContextDeps): Context {
  const log = deps.logger.child('pipeline');
  const m = deps.metrics;
  const dataDir = path.resolve(config.service.data_dir);
  const j = config.service.journal;
  const journal = new Journal(
    { dir: path.join(dataDir, 'journal'), fsync: j.fsync, maxBytes: j.max_bytes, segmentBytes: j.segment_bytes, highWatermark: j.high_watermark },
    log.child('journal'),
  );
  m.journalHighWatermark.set(Math.floor(j.max_bytes * j.high_watermark));
  const read: BodyReader = Object.assign((offsets: readonly number[], scratch?: Buffer) => journal.readBodies(offsets, scratch), {
    range: (offsets: readonly number[], start: number, end: number, scratch?: Buffer) => journal.readBodyRange(offsets, start, end, scratch),
  });
  const assembler = new EpisodeAssembler({
    episodes: config.processors.episodes,
    credit: config.processors.credit,
    air: config.processors.air,
    capture: config.processors.capture,
    routedExperts: config.processors.routed_experts,
    sampling: config.processors.sampling,
    images: config.processors.images,
    read,
    records: config.exporters.records,
    onLate: (kind, rolloutId, attemptId) => {
      const outcome = kind === 'call' ? 'new_episode' : 'dropped';
      m.lateRecords.inc({ kind, outcome });
      warnLimited(
        `late_${kind}`,
        kind === 'call'
          ? 'a call came after its episode closed; it starts a new episode with the same rollout and attempt ids'
          : `a ${kind.replace('_', ' ')} came after its episode closed (it was in flight or waited for its trace); dropped`,
        { rollout_id: rolloutId, attempt_id: attemptId },
      );
    },
  });
  /** At most one line per key each 10 s. */
  const limited = new LimitedWarnings(log, 10_000);
  function warnLimited(key: string, msg: string, fields: object): void {
    limited.warn(key, msg, fields);
  }
  const router = new TraceRouter({ waitMs: config.processors.spans.unattributed_wait_ms, maxParked: config.processors.spans.max_pending_spans });

  function quarantine(offset: number, record: unknown, err: unknown): void {
    m.journalQuarantined.inc();
    log.once('quarantine', 'error', 'a record could not be processed; it is quarantined and skipped', { err, offset });
    try {
      const dir = path.join(dataDir, 'quarantine');
      mkdirSync(dir, { recursive: true });
      appendFileSync(path.join(dir, 'records.ndjson'), JSON.stringify({ offset, error: String(err), record }) + '\n');
    } catch {
      // Counted and logged already; the quarantine itself is best effort.
    }
  }

  function journalMetrics(): void {
    m.journalBytes.set(journal.bytes);
    m.journalSegments.set(journal.segmentCount);
  }

  const images = new ImageStore(path.join(dataDir, 'images'), m);
  return { config, log, m, now: deps.now ?? Date.now, dataDir, journal, assembler, router, read, quarantine, warnLimited, journalMetrics, images };
}
