import { envVarOf } from './load';

/**
 * The sidecar's listening sockets and the settings that move or turn off each, so that a port
 * that cannot be bound is reported with what fixes it (src/telemetry/listen.ts).
 */
export interface ListenerSetting {
  /** What listens there, for a person: `the OTLP/HTTP receiver`. */
  what: string;
  /** The config key of its `host:port`. */
  key: string;
  /** The env var that sets that key, when there is one. */
  env: string | null;
  /** How to turn it off, when it can be. */
  off: string | null;
  /** Who else commonly holds its default port, when someone does. */
  usual: string | null;
}

function listener(what: string, key: string, off: string | null = null, usual: string | null = null): ListenerSetting {
  return { what, key, env: envVarOf(key), off, usual };
}

const COLLECTOR = 'an OpenTelemetry Collector or agent on this node?';

export const LISTENERS = {
  proxy: listener('the LLM proxy (and the rollout API)', 'receivers.llm_proxy.endpoint'),
  otlpGrpc: listener('the OTLP/gRPC receiver', 'receivers.otlp.protocols.grpc.endpoint', 'receivers.otlp.protocols.grpc.enabled: false', COLLECTOR),
  otlpHttp: listener('the OTLP/HTTP receiver', 'receivers.otlp.protocols.http.endpoint', 'receivers.otlp.protocols.http.enabled: false', COLLECTOR),
  telemetry: listener('the telemetry server (/metrics, /healthz, /readyz)', 'service.telemetry.endpoint'),
} satisfies Record<string, ListenerSetting>;
