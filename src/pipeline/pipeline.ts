import type { Config } from '../config/schema';
import type { Exporter } from '../exporters/exporter';
import { EpisodeAssembler } from '../processors/episodes/assembler';
import type { Logger } from '../telemetry/logger';
import type { Metrics } from '../telemetry/metrics';
import { once, type CaptureSink, type RecordSink } from './component';
import type { CallRecord, CallStartRecord, ClosedEpisode, PipelineRecord } from './records';

export interface PipelineDeps {
  logger: Logger;
  metrics: Metrics;
  exporter: Exporter;
  now?: () => number;
}

/**
 * Records in, closed episodes out: feeds the assembler, ticks it, and hands what closes to the
 * exporter in order, retrying with backoff while the exporter fails.
 */
export function createPipeline(config: Config, deps: PipelineDeps) {
  const log = deps.logger.child('pipeline');
  const m = deps.metrics;
  const now = deps.now ?? Date.now;
  const assembler = new EpisodeAssembler({
    episodes: config.processors.episodes,
    credit: config.processors.credit,
    air: config.processors.air,
    capture: config.processors.capture,
  });
  const queue: ClosedEpisode[] = [];
  let pumping: Promise<void> | null = null;
  let timer: NodeJS.Timeout | null = null;
  let stopping = false;
  let backoffMs = 0;

  const apply = (event: Parameters<EpisodeAssembler['apply']>[0]): void => {
    const closed = assembler.apply(event);
    m.openEpisodes.set(assembler.openCount);
    if (closed.length === 0) return;
    for (const c of closed) {
      m.episodesClosed.inc({ status: c.episode.episode_status });
      for (const t of c.transitions) {
        for (const tc of t.tool_calls) {
          m.toolSpans.inc({ outcome: tc.status ?? 'unobserved' });
          if (tc.reward !== null) m.airRewards.observe(tc.reward);
        }
      }
    }
    queue.push(...closed);
    pumping ??= pump().finally(() => {
      pumping = null;
    });
  };

  async function pump(): Promise<void> {
    while (queue.length > 0) {
      const batch = queue.slice(0, 64);
      try {
        await deps.exporter.export(batch);
        queue.splice(0, batch.length);
        backoffMs = 0;
        m.transitionsExported.inc({ exporter: deps.exporter.name }, batch.reduce((n, c) => n + c.transitions.length, 0));
      } catch (err) {
        m.exportErrors.inc({ exporter: deps.exporter.name, kind: 'retryable' });
        backoffMs = Math.min(Math.max(backoffMs * 2, 100), 10_000);
        log.once('export_failed', 'error', 'export failed; retrying with backoff', { err, exporter: deps.exporter.name });
        if (stopping && backoffMs >= 10_000) throw err;
        await new Promise((r) => setTimeout(r, backoffMs).unref());
      }
    }
  }

  const sink: RecordSink & CaptureSink = {
    submit(record: PipelineRecord): Promise<void> {
      apply(record);
      return Promise.resolve();
    },
    callStarted(record: CallStartRecord): void {
      apply(record);
    },
    callEnded(record: CallRecord): void {
      if (record.choices.length > 0 && record.choices.every((c) => c.responseTokenIds === null)) m.missingTokenIds.inc({ api: record.api });
      const usage = record.usage as { prompt_tokens?: unknown; completion_tokens?: unknown; input_tokens?: unknown; output_tokens?: unknown } | null;
      const prompt = usage?.prompt_tokens ?? usage?.input_tokens;
      const completion = usage?.completion_tokens ?? usage?.output_tokens;
      if (typeof prompt === 'number') m.tokens.inc({ kind: 'prompt' }, prompt);
      if (typeof completion === 'number') m.tokens.inc({ kind: 'response' }, completion);
      apply(record);
    },
  };

  return {
    sink,
    assembler,
    async start(): Promise<void> {
      timer = setInterval(() => apply({ type: 'tick', at: now() }), config.processors.episodes.tick_interval_ms);
      timer.unref();
    },
    /** Closes what is still open (nothing would resume it) and flushes to the exporter. */
    shutdown: once(async () => {
      stopping = true;
      if (timer) clearInterval(timer);
      const rest = assembler.drain(now());
      for (const c of rest) m.episodesClosed.inc({ status: c.episode.episode_status });
      queue.push(...rest);
      m.openEpisodes.set(0);
      if (pumping) await pumping.catch(() => {});
      await pump().catch((err) => log.error('episodes could not be exported before shutdown', { err, episodes: queue.length }));
    }),
  };
}

export type Pipeline = ReturnType<typeof createPipeline>;
