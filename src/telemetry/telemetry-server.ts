import http from 'node:http';
import type { Logger } from './logger';
import type { Metrics } from './metrics';
import { boundPort, closeServer, listen } from './listen';
import { LISTENERS } from '../config/listeners';

export interface ReadinessCheck {
  name: string;
  /** null when ready; otherwise why not. Must not call the model server. */
  check(): string | null;
  /** Reported in the body but does not make the sidecar unready (e.g. Kafka: the journal buffers). */
  informational?: boolean;
}

/** `/metrics` (Prometheus text), `/healthz` (the process serves), `/readyz` (every check passes). */
export function createTelemetryServer(
  endpoint: string,
  deps: {
    metrics: Metrics;
    logger: Logger;
    checks: ReadinessCheck[];
    onScrape?: () => void;
    routes?: (req: http.IncomingMessage, res: http.ServerResponse) => boolean;
  },
) {
  const log = deps.logger.child('telemetry');
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (deps.routes?.(req, res)) return;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
      return;
    }
    if (path === '/metrics') {
      deps.onScrape?.();
      deps.metrics.registry
        .metrics()
        .then((text) => res.writeHead(200, { 'content-type': deps.metrics.registry.contentType }).end(text))
        .catch((err) => {
          log.once('metrics', 'error', 'metrics collection failed', { err });
          res.writeHead(500).end();
        });
    } else if (path === '/healthz') {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"ok"}\n');
    } else if (path === '/readyz') {
      const failing: Record<string, string> = {};
      const degraded: Record<string, string> = {};
      for (const c of deps.checks) {
        const why = c.check();
        if (why !== null) (c.informational ? degraded : failing)[c.name] = why;
      }
      const ready = Object.keys(failing).length === 0;
      res
        .writeHead(ready ? 200 : 503, { 'content-type': 'application/json' })
        .end(JSON.stringify({ status: ready ? 'ready' : 'not_ready', failing, degraded }) + '\n');
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
    }
  });
  let closing: Promise<void> | undefined;
  return {
    async start(): Promise<void> {
      const host = await listen(server, endpoint, LISTENERS.telemetry);
      log.info('listening', { address: `${host}:${this.port()}` });
    },
    port: (): number => boundPort(server),
    shutdown(): Promise<void> {
      closing ??= closeServer(server, 0);
      return closing;
    },
  };
}
