import type { IncomingMessage, ServerResponse } from 'node:http';
import { bearerAuth } from '../security/auth';
import type { Metrics } from '../telemetry/metrics';
import { ControlMessageError, parseControlMessage, type Controller } from './controller';

const MAX_BODY = 16 * 1024;

/**
 * `POST /lightning/v1/control` on the telemetry port (setups without Kafka): the same messages as
 * the control topic, guarded by `service.api_token` when set. `GET` returns the current state.
 */
export function createControlRoute(controller: Controller, options: { apiToken?: string; metrics: Metrics }) {
  const authorized = bearerAuth(options.apiToken);
  return function route(req: IncomingMessage, res: ServerResponse): boolean {
    if ((req.url ?? '').split('?')[0] !== '/lightning/v1/control') return false;
    const reply = (status: number, body: unknown, headers: Record<string, string> = {}) => {
      const bytes = Buffer.from(JSON.stringify(body) + '\n');
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(bytes.length), ...headers }).end(bytes);
    };
    if (req.method === 'GET') {
      reply(200, controller.state());
      return true;
    }
    if (req.method !== 'POST') {
      req.resume();
      reply(405, { error: { message: `${req.method} is not allowed; use GET or POST`, type: 'method_not_allowed' } }, { allow: 'GET, POST' });
      return true;
    }
    // The telemetry port listens beyond loopback (probes, Prometheus): without a token, only local
    // processes may pause or re-version the sidecar.
    if (!options.apiToken && !isLoopback(req.socket.remoteAddress)) {
      req.resume();
      reply(403, { error: { message: 'control messages from other hosts need service.api_token (LIGHTNING_API_TOKEN)', type: 'permission_error' } });
      return true;
    }
    const apiKey = req.headers['x-api-key'];
    if (!authorized(req.headers.authorization, typeof apiKey === 'string' ? apiKey : undefined)) {
      req.resume();
      reply(
        401,
        { error: { message: 'missing or wrong API token (Authorization: Bearer <service.api_token>)', type: 'authentication_error' } },
        { 'www-authenticate': 'Bearer' },
      );
      return true;
    }
    const parts: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size <= MAX_BODY) parts.push(c);
    });
    req.on('error', () => {});
    req.on('end', () => {
      if (size > MAX_BODY) return reply(413, { error: { message: `control messages are at most ${MAX_BODY} bytes`, type: 'invalid_request_error' } });
      try {
        const msg = parseControlMessage(JSON.parse(Buffer.concat(parts).toString('utf8')));
        controller.apply(msg, 'http');
        options.metrics.controlMessages.inc({ source: 'http', outcome: 'applied' });
        reply(200, { applied: msg, state: controller.state() });
      } catch (err) {
        options.metrics.controlMessages.inc({ source: 'http', outcome: 'invalid' });
        const field = err instanceof ControlMessageError ? err.field : 'body';
        reply(400, {
          error: { message: err instanceof ControlMessageError ? err.message : 'body: must be JSON', type: 'invalid_request_error', param: field },
        });
      }
    });
    return true;
  };
}

function isLoopback(address: string | undefined): boolean {
  return address === '127.0.0.1' || address === '::1' || address === '::ffff:127.0.0.1' || (address?.startsWith('127.') ?? false);
}
