import { samplingMaskGap, tokenInGenerate } from '../receivers/llm-proxy/mask-support';
import type { FlavorState } from '../receivers/llm-proxy/flavor';
import path from 'node:path';
import type { Config } from '../config/schema';
import { createControlRoute } from '../control/control-route';
import { Controller } from '../control/controller';
import { createKafkaControl } from '../control/kafka-control';
import { createFileExporter } from '../exporters/file/file-exporter';
import type { Exporter } from '../exporters/exporter';
import { createKafkaExporter } from '../exporters/kafka/kafka-exporter';
import { createKafkaClient, createKafkajsProducer, kafkaClientOptions } from '../exporters/kafka/kafkajs-producer';
import type { Producer } from '../exporters/kafka/producer';
import type { Kafka } from 'kafkajs';
import { createLlmProxy, type LlmProxy } from '../receivers/llm-proxy/proxy';
import { compileRedaction } from '../processors/capture/redact';
import { createOtlpReceiver, type SpanSinkResult } from '../receivers/otlp/receiver';
import type { Span } from '../model/span';
import { observeSpans } from './span-observer';
import { createRolloutApi } from '../receivers/rollout-api/rollout-api';
import type { Logger } from '../telemetry/logger';
import { createMetrics, type Metrics } from '../telemetry/metrics';
import { createTelemetryServer } from '../telemetry/telemetry-server';
import { once, RefusedError, RejectedError } from '../model/component';
import { createPipeline } from './pipeline';
import { collectGarbage } from './heap';
import { SequenceCounter } from '../model/sequence';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { OpenEpisodeView } from '../processors/episodes/assembler';
import { createViewerRoutes } from '../viewer/routes';
import { Viewer } from '../viewer/viewer';

export interface AppDeps {
  logger: Logger;
  metrics?: Metrics;
  now?: () => number;
  /** Replaces the exporter chosen by config (tests). */
  exporter?: Exporter;
  /** Replaces the kafkajs producer under the Kafka exporter (tests). */
  producer?: Producer;
  /** Replaces the kafkajs client of the control consumer (tests). */
  kafka?: Kafka;
  /** Told when closed episodes begin or stop waiting on disk for the exporter (`HeapHeadroom.pressure`). */
  backlogOnDisk?: (onDisk: boolean) => void;
  /** Resolves upstream host names to addresses (tests replace DNS). */
  resolve?: (hostname: string) => Promise<string[]>;
}

/**
 * Builds the whole sidecar from config. Start order: exporter → pipeline → receivers → telemetry;
 * shutdown in reverse, each stage draining into one still alive (docs/architecture.md).
 */
export function createApp(config: Config, deps: AppDeps) {
  const log = deps.logger;
  const metrics = deps.metrics ?? createMetrics({ defaultMetrics: true });
  const dataDir = path.resolve(config.service.data_dir);
  const kafka =
    !deps.exporter && config.service.exporter === 'kafka'
      ? createKafkaExporter(config.exporters.kafka, {
          records: config.exporters.records,
          producer: deps.producer ?? createKafkajsProducer(kafkaClientOptions(config.exporters.kafka), log),
          logger: log,
          metrics,
          deadLetterDir: path.join(dataDir, 'dead-letter'),
          imagesDir: path.join(dataDir, 'images'),
        })
      : null;
  // The Kafka connection gauge exists only with the Kafka exporter (a 0 elsewhere would read as
  // "disconnected" on dashboards and alerts).
  if (!kafka) metrics.registry.removeSingleMetric('lightning_sidecar_kafka_connected');
  const exporter =
    deps.exporter ??
    kafka ??
    createFileExporter({
      dir: path.resolve(config.exporters.file.dir ?? dataDir),
      maxFileBytes: config.exporters.file.max_file_bytes,
      promptIds: config.exporters.file.prompt_ids,
      records: config.exporters.records,
    });
  const sequences = new SequenceCounter();
  // The viewer reads closed episodes as they are exported; the pipeline is built after it.
  let assembler: { openView(): OpenEpisodeView[] } | null = null;
  const viewer = config.service.ui.enabled
    ? new Viewer(
        { maxBytes: config.service.ui.max_bytes, idleMs: config.service.ui.idle_ms, tokenizerDir: config.receivers.llm_proxy.token_in.tokenizer_dir ?? null },
        { metrics, logger: log.child('viewer'), open: () => assembler?.openView() ?? [], now: deps.now },
      )
    : null;
  const pipeline = createPipeline(config, {
    logger: log,
    metrics,
    exporter: viewer ? viewer.tap(exporter) : exporter,
    sequences,
    now: deps.now,
    collect: collectGarbage,
    backlogOnDisk: deps.backlogOnDisk,
    idsExpected: config.receivers.llm_proxy.upstream_flavor !== 'openai',
  });
  assembler = pipeline.assembler;
  const rolloutApi = config.receivers.rollout_api.enabled
    ? createRolloutApi(
        { maxBodyBytes: config.receivers.rollout_api.max_body_bytes, apiToken: config.service.api_token },
        { sink: pipeline, logger: log, metrics, now: deps.now },
      )
    : undefined;
  const control = config.service.control;
  const controller = new Controller(
    { maxHeldCalls: control.max_held_calls, maxHoldMs: control.max_hold_ms, staticVersion: config.processors.policy.version ?? null },
    { logger: log.child('control'), metrics, now: deps.now },
  );
  // A new version is journaled: episodes' policy_version_lag replays exactly.
  controller.onPolicy = (version) => void pipeline.submit({ type: 'policy', version, at: (deps.now ?? Date.now)() }).catch(() => {});
  const kafkaControl =
    config.service.exporter === 'kafka' && control.kafka && !deps.exporter
      ? createKafkaControl(deps.kafka ?? createKafkaClient(kafkaClientOptions(config.exporters.kafka), log), control.topic, controller, {
          logger: log,
          metrics,
        })
      : null;
  const proxy = createLlmProxy(config.receivers.llm_proxy, {
    logger: log,
    metrics,
    gate: () => controller.gate(),
    policyVersion: () => controller.policyVersion(),
    policyHeader: config.processors.policy.response_header,
    sequences,
    capture: pipeline.capture,
    redact: compileRedaction(config.processors.capture.redact_request_fields),
    localRoutes: rolloutApi,
    now: deps.now,
    resolve: deps.resolve,
    sglangRouting: config.processors.routed_experts.sglang !== undefined,
    pins: config.processors.sampling.pin,
    samplingMasks: config.processors.sampling.masks,
    imageTokenId: config.processors.images.image_token_id,
  });
  const otlpConfig = config.receivers.otlp;
  const otlp =
    otlpConfig.protocols.grpc.enabled || otlpConfig.protocols.http.enabled
      ? createOtlpReceiver(
          {
            grpcAddr: otlpConfig.protocols.grpc.enabled ? otlpConfig.protocols.grpc.endpoint : undefined,
            httpAddr: otlpConfig.protocols.http.enabled ? otlpConfig.protocols.http.endpoint : undefined,
            maxRequestBytes: otlpConfig.max_request_bytes,
            authToken: config.service.api_token,
          },
          {
            logger: log,
            sink: (spans) => acceptSpans(spans),
            onSpans: (transport, outcome, reason, count) => metrics.otlpSpans.inc({ transport, outcome, reason }, count),
          },
        )
      : null;

  /** Tool and reward spans are journaled (acknowledged once durable); the rest is dropped here. */
  async function acceptSpans(spans: Span[]): Promise<SpanSinkResult> {
    const { observations, other } = observeSpans(spans, (deps.now ?? Date.now)(), config.processors.spans.max_payload_chars);
    if (other > 0) metrics.spansClassified.inc({ kind: 'other', result: 'dropped' }, other);
    const outcomes = await Promise.allSettled(observations.map((o) => pipeline.submit(o)));
    const rejected: RejectedError[] = [];
    for (const [i, r] of outcomes.entries()) {
      if (r.status === 'fulfilled') metrics.spansClassified.inc({ kind: observations[i].what.kind, result: 'recorded' });
      else if (r.reason instanceof RefusedError) return { status: 'refused', retryAfterMs: r.reason.retryAfterMs, reason: r.reason.code };
      else if (r.reason instanceof RejectedError) {
        metrics.spansClassified.inc({ kind: observations[i].what.kind, result: 'rejected' });
        rejected.push(r.reason);
      } else throw r.reason;
    }
    if (rejected.length === 0) return { status: 'accepted' };
    // A span that can never apply (late, or a reward for no known rollout) is rejected in the
    // response's partial success, which OTLP clients log and do not retry.
    const more = rejected.length > 1 ? ` (and ${rejected.length - 1} more)` : '';
    return { status: 'accepted', rejected: rejected.length, message: `${rejected[0].message}${more}` };
  }

  let proxyUp = false;
  const telemetry = createTelemetryServer(config.service.telemetry.endpoint, {
    metrics,
    logger: log,
    checks: [
      { name: 'llm_proxy', check: () => (proxyUp ? null : 'not listening') },
      { name: 'journal', check: () => pipeline.journal.writable() },
      { name: 'export_backlog', check: () => pipeline.backlogFull() },
      { name: 'upstream', informational: true, check: () => upstreamCheck(proxy.upstream()) },
      { name: 'upstream_replicas', informational: true, check: () => replicasCheck(proxy.routing()) },
      { name: 'sampling_masks', informational: true, check: () => samplingMaskGap(config.processors.sampling, proxy.flavor(), tokenInGenerate(config)) },
      ...(kafka ? [{ name: 'kafka', informational: true, check: () => (kafka.connected ? null : 'not connected; transitions wait in the journal') }] : []),
    ],
    routes: withViewer(
      createControlRoute(controller, { apiToken: config.service.api_token, metrics }),
      viewer ? createViewerRoutes(viewer, config.service.api_token) : null,
    ),
    onScrape: () => {
      if (kafka) metrics.kafkaConnected.set(kafka.connected ? 1 : 0);
    },
  });

  return {
    config,
    metrics,
    proxy,
    otlp,
    pipeline,
    telemetry,
    exporter,
    controller,
    kafkaControl,
    viewer,
    async start(): Promise<void> {
      await exporter.start();
      await pipeline.start();
      await otlp?.start();
      await proxy.start();
      proxyUp = true;
      await telemetry.start();
      kafkaControl?.start();
      // The start-up line a person reads is the `run` command's (cli/startup-line.ts).
      log.debug('started', { data_dir: dataDir, exporter: exporter.name });
    },
    shutdown: once(async () => {
      log.info('shutting down', { in_flight: proxy.inFlight() });
      proxyUp = false;
      controller.close();
      await kafkaControl?.shutdown();
      await proxy.shutdown(config.service.shutdown_timeout_ms);
      await otlp?.shutdown();
      await pipeline.shutdown();
      await exporter.shutdown();
      await telemetry.shutdown();
      log.info('stopped');
    }),
  };
}

export type App = ReturnType<typeof createApp>;

/** /readyz detail about the replicas: null when every one is up. */
function replicasCheck(r: ReturnType<LlmProxy['routing']>): string | null {
  const down = r.replicas.filter((x) => !x.up).map((x) => (x.unresolved ? `${x.id} (its name does not resolve)` : `${x.id} (probed)`));
  return down.length === 0 ? null : `${down.length} of ${r.replicas.length} replicas down: ${down.join(', ')}`;
}

/** /readyz detail about the model server: null when fields for token ids are being added. */
function upstreamCheck(u: FlavorState): string | null {
  if (u.rejected) return `the model server refused an added field (${u.rejected}); no token ids are requested`;
  if (u.flavor === 'openai')
    return u.source === 'unknown'
      ? `not identified (${u.evidence}); no token ids are requested`
      : `${u.source === 'config' ? 'configured' : 'detected'} as openai; no token ids are requested`;
  return null;
}

type Routes = (req: IncomingMessage, res: ServerResponse) => boolean;

/** The control route, then the viewer's. */
function withViewer(control: Routes, viewer: Routes | null): Routes {
  return viewer === null ? control : (req, res) => control(req, res) || viewer(req, res);
}
