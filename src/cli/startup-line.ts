import path from 'node:path';
import type { Config } from '../config/schema';

/** What `run` reports once everything listens: the addresses actually bound and where data goes. */
export interface StartupFacts {
  version: string;
  /** Actual `host:port` of each listener (a configured port 0 is resolved); null when off. */
  proxy: string;
  otlpGrpc: string | null;
  otlpHttp: string | null;
  telemetry: string;
  upstream: {
    url: string;
    /** The configured `upstream_flavor`. */
    flavor: string;
    /** What probing the upstream found (server kind, token-id support), when something probed it; null otherwise. */
    detected: string | null;
  };
}

/**
 * The one start-up line a person reads at a glance, with the same facts as fields:
 * `ready: proxy 127.0.0.1:4000 → http://vllm:8000/v1 (vllm, configured); exporter kafka …; data ./data; …`
 */
export function startupLine(config: Config, facts: StartupFacts): { msg: string; fields: Record<string, unknown> } {
  const dataDir = path.resolve(config.service.data_dir);
  const k = config.exporters.kafka;
  const exporter =
    config.service.exporter === 'kafka'
      ? { kind: 'kafka', brokers: k.brokers, topic: k.topic, episodes_topic: k.episodes_topic, encoding: k.encoding }
      : { kind: 'file', dir: path.resolve(config.exporters.file.dir ?? dataDir) };
  const exporterText =
    exporter.kind === 'kafka' ? `kafka ${k.brokers.join(',')} topics ${k.topic}, ${k.episodes_topic} (${k.encoding})` : `files under ${exporter.dir}`;
  const upstreamText = `${facts.upstream.url} (${facts.upstream.flavor}, ${facts.upstream.detected === null ? 'configured' : `detected: ${facts.upstream.detected}`})`;
  const otlp =
    [facts.otlpGrpc ? `grpc ${facts.otlpGrpc}` : null, facts.otlpHttp ? `http ${facts.otlpHttp}` : null].filter((x) => x !== null).join(', ') || 'off';
  const msg =
    `lightning-sidecar ${facts.version} ready: proxy ${facts.proxy} → ${upstreamText}; ` +
    `exporter ${exporterText}; data ${dataDir}; otlp ${otlp}; metrics http://${facts.telemetry}/metrics`;
  return {
    msg,
    fields: {
      version: facts.version,
      proxy: facts.proxy,
      upstream: facts.upstream.url,
      upstream_flavor: facts.upstream.flavor,
      upstream_detected: facts.upstream.detected,
      exporter,
      data_dir: dataDir,
      otlp_grpc: facts.otlpGrpc,
      otlp_http: facts.otlpHttp,
      telemetry: facts.telemetry,
    },
  };
}

/** `host:port` of a configured endpoint with the port actually bound. */
export function boundAddress(endpoint: string, port: number): string {
  return `${endpoint.slice(0, endpoint.lastIndexOf(':'))}:${port}`;
}
