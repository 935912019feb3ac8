import { logprobsModeGap, samplingMaskGap, tokenInGenerate } from '../receivers/llm-proxy/mask-support';
import type { FlavorState } from '../receivers/llm-proxy/flavor';
import { loadConfig } from '../config/load';
import { upstreamUrls } from '../config/schema';
import { routeGrpcLogs } from '../receivers/otlp/receiver';
import { createApp } from '../service/app';
import { HeapHeadroom } from '../service/heap';
import { ListenError } from '../telemetry/listen';
import { createLogger } from '../telemetry/logger';
import type { Command, CommandSpec } from './command';
import { boundAddress, startupLine } from './startup-line';
import { packageVersion } from './version';

const spec: CommandSpec = {
  name: 'run',
  summary: 'run the sidecar (the default command)',
  synopsis: '[--config FILE]',
  options: {
    config: {
      type: 'string',
      value: 'FILE',
      description: 'YAML config file (default: $LIGHTNING_CONFIG); LIGHTNING_* env vars override it, then defaults apply',
    },
  },
  notes: [
    'What a first run needs (environment; every setting: docs/configuration.md):',
    '  LIGHTNING_UPSTREAM_URL    the model server, e.g. http://vllm:8000/v1 (default http://127.0.0.1:8000/v1)',
    '  LIGHTNING_UPSTREAM_FLAVOR vllm, sglang or openai (default auto: found from the server)',
    '  LIGHTNING_DATA_DIR        journal and file exports (default ./data)',
    '  LIGHTNING_EXPORTER        file (default) or kafka, with LIGHTNING_KAFKA_BROKERS host:port,...',
    '  LIGHTNING_EXPORT_RECORDS  trajectories (default), transitions or both',
    'Agents set OPENAI_BASE_URL=http://127.0.0.1:4000/rollout/<rollout-id>/v1 (LIGHTNING_PROXY_ADDR moves the port).',
    'Stops on SIGTERM or SIGINT after draining (a second signal exits at once). Logs are JSON lines on stderr.',
  ],
};

export const runCommand: Command = {
  spec,
  async run({ values }, io) {
    const config = loadConfig({ file: (values.config as string | undefined) ?? (io.env.LIGHTNING_CONFIG || undefined), env: io.env });
    const logger = createLogger({ level: config.service.log_level, component: 'lightning-sidecar', write: (line) => io.err.write(line) });
    routeGrpcLogs(logger.child('grpc'));
    const heap = new HeapHeadroom(config.service.heap_headroom_mib * 1024 * 1024).start();
    let app: ReturnType<typeof createApp>;
    try {
      app = createApp(config, { logger, backlogOnDisk: (onDisk) => heap.pressure(onDisk) });
    } catch (err) {
      // E.g. a data_dir that is a file: one line that says what, not a stack trace.
      logger.error('start-up failed', { err, data_dir: config.service.data_dir });
      return 1;
    }
    try {
      await app.start();
    } catch (err) {
      // A port that cannot be bound: the line says which setting moves it (telemetry/listen.ts).
      logger.error(err instanceof ListenError ? `start-up failed: ${err.message}` : 'start-up failed', { err });
      await app.shutdown().catch(() => {});
      return 1;
    }
    const proxy = config.receivers.llm_proxy;
    const otlp = config.receivers.otlp.protocols;
    const upstream = app.proxy.upstream();
    const { msg, fields, warning } = startupLine(config, {
      version: packageVersion(),
      proxy: boundAddress(proxy.endpoint, app.proxy.port()),
      otlpGrpc: app.otlp && otlp.grpc.enabled ? boundAddress(otlp.grpc.endpoint, app.otlp.grpcPort()) : null,
      otlpHttp: app.otlp && otlp.http.enabled ? boundAddress(otlp.http.endpoint, app.otlp.httpPort()) : null,
      telemetry: boundAddress(config.service.telemetry.endpoint, app.telemetry.port()),
      upstream: { url: proxy.upstream_url, flavor: proxy.upstream_flavor, detected: describeUpstream(upstream), state: upstream },
      routing: { replicas: app.proxy.routing().replicas.length, urls: upstreamUrls(proxy.upstream_url).length },
    });
    if (warning) logger.warn(msg, fields);
    else logger.info(msg, fields);
    // Said now, not found at training time (also in /readyz while it holds). A server not identified
    // yet (still starting) is not called unable to give masks: /readyz says so once it is known.
    const pending = upstream.source === 'unknown';
    const maskGap =
      pending && config.processors.sampling.masks ? null : samplingMaskGap(config.processors.sampling, app.proxy.flavor(), tokenInGenerate(config));
    if (maskGap !== null) logger.warn(maskGap, { check: 'sampling_masks' });
    const modeGap = logprobsModeGap(config.processors.sampling, app.proxy.flavor());
    if (modeGap !== null) logger.warn(modeGap, { check: 'sampling_masks' });
    return new Promise<number>((resolve) => {
      let signals = 0;
      const onSignal = (signal: NodeJS.Signals): void => {
        signals++;
        if (signals > 1) {
          logger.warn('second signal: exiting at once', { signal });
          process.exit(130);
        }
        logger.info('signal received: draining', { signal });
        app.shutdown().then(
          () => resolve(0),
          (err) => {
            logger.error('shutdown failed', { err });
            resolve(1);
          },
        );
      };
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
    });
  },
};

/** What auto-detection found, for the start-up line (null when the flavor is configured). */
function describeUpstream(u: FlavorState): string | null {
  if (u.source === 'config') return null;
  if (u.source === 'unknown') return `not identified (${u.evidence}); no fields added for token ids`;
  return `${u.flavor}${u.serverVersion ? ` ${u.serverVersion}` : ''}`;
}
