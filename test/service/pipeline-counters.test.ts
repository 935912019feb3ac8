import { createMetrics } from '../../src/telemetry/metrics';
import { silentLogger } from '../../src/telemetry/logger';
import { createPipeline } from '../../src/service/pipeline';
import { loadConfig } from '../../src/config/load';
import { memoryExporter } from '../support/memory-exporter';
import { beginCall, chatAnswer, endCall, tempDirs, until } from '../support/pipeline-calls';

/**
 * Counters count what happened in this process: a restart that replays the journal (and exports
 * again what was not acknowledged) does not count those episodes as closed a second time.
 */
describe('pipeline counters across a restart', () => {
  const { dir, remove } = tempDirs('lightning-counters-');
  afterAll(remove);

  function start(dataDir: string, refuse: boolean) {
    const metrics = createMetrics();
    const config = loadConfig({
      env: {},
      overrides: {
        service: { data_dir: dataDir, drain_on_shutdown: true, journal: { fsync: 'never' } },
        processors: { episodes: { idle_timeout_ms: 3_600_000, tool_span_wait_ms: 0 } },
      },
    });
    let exported = 0;
    const pipeline = createPipeline(config, {
      logger: silentLogger,
      metrics,
      exporter: memoryExporter((batch) => {
        exported += batch.length;
        if (refuse) throw new Error('the exporter is away');
      }),
    });
    return { pipeline, metrics, exported: () => exported };
  }

  const closed = async (metrics: ReturnType<typeof createMetrics>) =>
    (await metrics.registry.getSingleMetric('lightning_sidecar_episodes_closed_total')!.get()).values.map((v) => [v.labels.status, v.value]);

  it('counts an episode closed once: not again when a restart replays and re-exports it; one still open at shutdown is shutdown', async () => {
    const d = dir();
    const first = start(d, true);
    await first.pipeline.start();
    for (const r of ['done', 'open']) {
      const c = beginCall(first.pipeline, r, 0, 'q');
      c.response(chatAnswer('a'));
      endCall(first.pipeline, c);
    }
    await first.pipeline.submit({ type: 'end', rolloutId: 'done', attemptId: '0', at: Date.now() });
    await until(() => first.exported() > 0);
    await first.pipeline.shutdown();
    expect(await closed(first.metrics)).toEqual([
      ['completed', 1],
      ['shutdown', 1],
    ]);

    const second = start(d, false);
    await second.pipeline.start();
    await until(() => second.exported() >= 2);
    expect(second.exported()).toBe(2);
    expect(await closed(second.metrics)).toEqual([]);
    await second.pipeline.shutdown();
  });
});
