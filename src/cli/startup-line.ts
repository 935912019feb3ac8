import path from 'node:path';
import type { Config } from '../config/schema';
import type { FlavorState } from '../receivers/llm-proxy/flavor';

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
    /** What is known of the model server now (`proxy.upstream()`); absent: nothing to warn about. */
    state?: FlavorState;
  };
  /** The model-server replicas routing spreads calls over (host names resolved) and the URLs configured. */
  routing?: { replicas: number; urls: number };
}

/**
 * The one start-up line a person reads at a glance, with the same facts as fields:
 * `ready: proxy 127.0.0.1:4000 → http://vllm:8000/v1 (vllm, configured); routing sticky (1 replica); token-in off; exporter …`.
 * `warning` is set (and the line ends with it) when calls will be recorded without token ids.
 */
export function startupLine(config: Config, facts: StartupFacts): { msg: string; fields: Record<string, unknown>; warning: string | null } {
  const dataDir = path.resolve(config.service.data_dir);
  const { exporter, text: exporterText } = describeExporter(config, dataDir);
  const upstreamText = `${facts.upstream.url} (${facts.upstream.flavor}, ${facts.upstream.detected === null ? 'configured' : `detected: ${facts.upstream.detected}`})`;
  const otlp =
    [facts.otlpGrpc ? `grpc ${facts.otlpGrpc}` : null, facts.otlpHttp ? `http ${facts.otlpHttp}` : null].filter((x) => x !== null).join(', ') || 'off';
  const proxy = config.receivers.llm_proxy;
  const routing = { policy: proxy.routing.policy, replicas: facts.routing?.replicas ?? 1, urls: facts.routing?.urls ?? 1 };
  const t = proxy.token_in;
  const tokenIn = t.enabled ? `token-in on (tool-call parser ${t.tool_call_parser}, reasoning parser ${t.reasoning_parser})` : 'token-in off';
  const warning = facts.upstream.state ? noTokenIdsWarning(facts.upstream.state) : null;
  const msg =
    `lightning-sidecar ${facts.version} ready: proxy ${facts.proxy} → ${upstreamText}; ${routingText(routing)}; ${tokenIn}; ` +
    `exporter ${exporterText}; data ${dataDir}; otlp ${otlp}; metrics http://${facts.telemetry}/metrics` +
    (warning ? `; WARNING: ${warning}` : '');
  return {
    msg,
    warning,
    fields: {
      version: facts.version,
      proxy: facts.proxy,
      upstream: facts.upstream.url,
      upstream_flavor: facts.upstream.flavor,
      upstream_detected: facts.upstream.detected,
      routing,
      token_in: t.enabled ? { enabled: true, tool_call_parser: t.tool_call_parser, reasoning_parser: t.reasoning_parser } : { enabled: false },
      records: config.exporters.records,
      exporter,
      data_dir: dataDir,
      otlp_grpc: facts.otlpGrpc,
      otlp_http: facts.otlpHttp,
      telemetry: facts.telemetry,
      ...(warning ? { warning } : {}),
    },
  };
}

function routingText(r: { policy: string; replicas: number; urls: number }): string {
  const replicas = `${r.replicas} replica${r.replicas === 1 ? '' : 's'}`;
  return `routing ${r.policy} (${r.urls === 1 ? replicas : `${replicas} from ${r.urls} URLs`})`;
}

/** The exporter and the records it writes, as a field and as text: `files under /data (trajectories, episodes)`. */
function describeExporter(config: Config, dataDir: string): { exporter: Record<string, unknown>; text: string } {
  const records = config.exporters.records;
  const kinds = [...(records === 'transitions' ? [] : ['trajectories']), ...(records === 'trajectories' ? [] : ['transitions']), 'episodes'];
  if (config.service.exporter !== 'kafka') {
    const dir = path.resolve(config.exporters.file.dir ?? dataDir);
    return { exporter: { kind: 'file', dir, records: kinds }, text: `files under ${dir} (${kinds.join(', ')})` };
  }
  const k = config.exporters.kafka;
  const topics: Record<string, string> = { trajectories: k.trajectories_topic, transitions: k.topic, episodes: k.episodes_topic };
  return {
    exporter: {
      kind: 'kafka',
      brokers: k.brokers,
      topic: k.topic,
      trajectories_topic: k.trajectories_topic,
      episodes_topic: k.episodes_topic,
      encoding: k.encoding,
      records: kinds,
    },
    text: `kafka ${k.brokers.join(',')} (${k.encoding}): ${kinds.map((kind) => `${kind} → ${topics[kind]}`).join(', ')}`,
  };
}

/**
 * Why calls will be recorded without token ids, and what to change: the model server is not
 * identified as vLLM or SGLang (not yet, or it answered as another server), unless `openai` was
 * configured on purpose. Null when token ids are asked for.
 */
export function noTokenIdsWarning(s: FlavorState): string | null {
  if (s.source === 'config' || s.flavor !== 'openai') return null;
  const force = 'set LIGHTNING_UPSTREAM_FLAVOR=vllm (or sglang; receivers.llm_proxy.upstream_flavor)';
  const url = 'LIGHTNING_UPSTREAM_URL (receivers.llm_proxy.upstream_url)';
  const head = 'calls will be recorded without token ids, so no trajectories will be written';
  if (s.source === 'detected')
    return (
      `the model server answered as a server other than vLLM or SGLang (${s.evidence}): ${head}; ` +
      `check ${url}, or if it is vLLM or SGLang, ${force}; LIGHTNING_UPSTREAM_FLAVOR=openai says this is intended`
    );
  return (
    `the model server was not identified as vLLM or SGLang (${s.evidence}): ${head}; ` +
    `if it is vLLM or SGLang, ${force}, otherwise check ${url}. ` +
    "It is probed again every minute (and, while no URL answers, before a call); a later identification is logged as 'model server identified as …'"
  );
}

export { boundAddress } from '../config/address';
