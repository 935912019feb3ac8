import path from 'node:path';
import type { Config } from '../config/schema';
import { createFileExporter } from '../exporters/file/file-exporter';
import type { Exporter } from '../exporters/exporter';
import { createLlmProxy } from '../receivers/llm-proxy/proxy';
import { createRolloutApi } from '../receivers/rollout-api/rollout-api';
import type { Logger } from '../telemetry/logger';
import { createMetrics, type Metrics } from '../telemetry/metrics';
import { createTelemetryServer } from '../telemetry/telemetry-server';
import { once } from './component';
import { createPipeline } from './pipeline';
import { SequenceCounter } from './sequence';

export interface AppDeps {
  logger: Logger;
  metrics?: Metrics;
  now?: () => number;
  /** Replaces the exporter chosen by config (tests). */
  exporter?: Exporter;
}

/**
 * Builds the whole sidecar from config. Start order: exporter → pipeline → receivers → telemetry;
 * shutdown in reverse, each stage draining into one still alive (DESIGN §3).
 */
export function createApp(config: Config, deps: AppDeps) {
  const log = deps.logger;
  const metrics = deps.metrics ?? createMetrics({ defaultMetrics: true });
  const dataDir = path.resolve(config.service.data_dir);
  const exporter =
    deps.exporter ??
    (config.service.exporter === 'file'
      ? createFileExporter({ dir: path.resolve(config.exporters.file.dir ?? dataDir), maxFileBytes: config.exporters.file.max_file_bytes })
      : unsupportedExporter(config.service.exporter));
  const sequences = new SequenceCounter();
  const pipeline = createPipeline(config, { logger: log, metrics, exporter, sequences, now: deps.now });
  const rolloutApi = config.receivers.rollout_api.enabled
    ? createRolloutApi({ maxBodyBytes: config.receivers.rollout_api.max_body_bytes }, { sink: pipeline, logger: log, metrics, now: deps.now })
    : undefined;
  const proxy = createLlmProxy(config.receivers.llm_proxy, {
    logger: log,
    metrics,
    sequences,
    capture: pipeline.capture,
    localRoutes: rolloutApi,
    now: deps.now,
  });
  let proxyUp = false;
  const telemetry = createTelemetryServer(config.service.telemetry.endpoint, {
    metrics,
    logger: log,
    checks: [
      { name: 'llm_proxy', check: () => (proxyUp ? null : 'not listening') },
      { name: 'journal', check: () => pipeline.journal.writable() },
    ],
  });

  return {
    config,
    metrics,
    proxy,
    pipeline,
    telemetry,
    exporter,
    async start(): Promise<void> {
      await exporter.start();
      await pipeline.start();
      await proxy.start();
      proxyUp = true;
      await telemetry.start();
      log.info('lightning-sidecar started', { data_dir: dataDir, exporter: exporter.name });
    },
    shutdown: once(async () => {
      log.info('shutting down', { in_flight: proxy.inFlight() });
      proxyUp = false;
      await proxy.shutdown(config.service.shutdown_timeout_ms);
      await pipeline.shutdown();
      await exporter.shutdown();
      await telemetry.shutdown();
      log.info('stopped');
    }),
  };
}

export type App = ReturnType<typeof createApp>;

function unsupportedExporter(name: string): never {
  throw new Error(`service.exporter: '${name}' is not available in this build`);
}
