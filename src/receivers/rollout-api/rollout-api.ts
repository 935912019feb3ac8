import type { IncomingMessage, ServerResponse } from 'node:http';
import { RefusedError, RejectedError, type RecordSink } from '../../model/component';
import type { EndRecord, RewardRecord } from '../../model/records';
import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { bearerAuth } from '../../security/auth';
import { ID_PATTERN } from '../llm-proxy/correlation';
import { parseEndBody, parseEventsBody, parseRewardBody, BodyError } from './bodies';

export interface RolloutApiDeps {
  sink: RecordSink;
  logger: Logger;
  metrics: Metrics;
  now?: () => number;
}

const REWARD = /^\/lightning\/v1\/rollouts\/([^/?]+)\/(reward|end)(?:\?.*)?$/;
const AGL_EVENTS = /^\/api\/rollouts\/([^/?]+)\/attempt\/([^/?]+)\/events(?:\?.*)?$/;

/**
 * Reward and end reports (docs/frameworks.md), served on the proxy port next to the proxied routes.
 * 202 once the pipeline accepted the record; 400 naming the field for a bad body; 409 for a
 * rollout attempt whose episode already closed, 404 for one the sidecar has no episode of; 503 +
 * Retry-After when the pipeline refuses.
 */
export function createRolloutApi(options: { maxBodyBytes: number; apiToken?: string }, deps: RolloutApiDeps) {
  const now = deps.now ?? Date.now;
  const authorized = bearerAuth(options.apiToken);
  const log = deps.logger.child('rollout_api');

  return function handle(req: IncomingMessage, res: ServerResponse): boolean {
    const url = req.url ?? '/';
    if (!url.startsWith('/lightning/v1/') && !url.startsWith('/api/rollouts/')) return false;
    const ours = REWARD.exec(url);
    const agl = ours ? null : AGL_EVENTS.exec(url);
    const route = ours ? ours[2] : agl ? 'events' : 'unknown';
    if (!ours && !agl) {
      reply(res, 404, { error: { message: `no route ${req.method} ${url.split('?')[0]}`, type: 'not_found' } });
      deps.metrics.rolloutApi.inc({ route, outcome: '404' });
      req.resume();
      return true;
    }
    const apiKey = req.headers['x-api-key'];
    if (!authorized(req.headers.authorization, typeof apiKey === 'string' ? apiKey : undefined)) {
      reply(
        res,
        401,
        { error: { message: 'missing or wrong API token (Authorization: Bearer <service.api_token>)', type: 'authentication_error' } },
        { 'www-authenticate': 'Bearer' },
      );
      deps.metrics.rolloutApi.inc({ route, outcome: '401' });
      req.resume();
      return true;
    }
    if (req.method !== 'POST') {
      reply(res, 405, { error: { message: `${req.method} is not allowed; use POST`, type: 'method_not_allowed' } }, { allow: 'POST' });
      deps.metrics.rolloutApi.inc({ route, outcome: '405' });
      req.resume();
      return true;
    }
    readBody(req, options.maxBodyBytes)
      .then(async (body) => {
        const rolloutId = decode(ours ? ours[1] : agl![1]);
        if (!ID_PATTERN.test(rolloutId)) throw new BodyError('rollout_id', 'must be 1-128 characters of [A-Za-z0-9._:-]');
        const at = now();
        let record: RewardRecord | EndRecord;
        if (ours?.[2] === 'reward') record = { type: 'reward', rolloutId, ...parseRewardBody(body), at, source: 'rollout_api' };
        else if (ours) record = { type: 'end', rolloutId, ...parseEndBody(body), at };
        else {
          const attemptId = decode(agl![2]);
          if (!ID_PATTERN.test(attemptId)) throw new BodyError('attempt_id', 'must be 1-128 characters of [A-Za-z0-9._:-]');
          const reward = parseEventsBody(body);
          record = { type: 'reward', rolloutId, attemptId, ...reward, at, source: 'agentlightning_events' };
        }
        await deps.sink.submit(record);
        deps.metrics.rolloutApi.inc({ route, outcome: '202' });
        reply(res, 202, { accepted: true, rollout_id: rolloutId, attempt_id: record.attemptId });
      })
      .catch((err: unknown) => {
        if (err instanceof BodyError) {
          deps.metrics.rolloutApi.inc({ route, outcome: err.status === 413 ? '413' : '400' });
          reply(res, err.status, { error: { message: err.message, type: 'invalid_request_error', param: err.field } });
        } else if (err instanceof RejectedError) {
          // Never a success that goes nowhere: a reward that cannot reach an episode says why.
          deps.metrics.rolloutApi.inc({ route, outcome: String(err.status) });
          reply(res, err.status, { error: { message: err.message, type: err.status === 409 ? 'conflict' : 'not_found', code: err.code } });
        } else if (err instanceof RefusedError) {
          deps.metrics.rolloutApi.inc({ route, outcome: '503' });
          reply(
            res,
            503,
            { error: { message: err.message, type: 'unavailable', code: err.code } },
            { 'retry-after': String(Math.ceil(err.retryAfterMs / 1000)) },
          );
        } else {
          deps.metrics.rolloutApi.inc({ route, outcome: '500' });
          log.once('internal', 'error', 'rollout api failed', { err });
          reply(res, 500, { error: { message: 'internal error', type: 'api_error' } });
        }
      });
    return true;
  };
}

function decode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

function reply(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent) return;
  const bytes = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(bytes.length), ...headers });
  res.end(bytes);
}

function readBody(req: IncomingMessage, max: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let size = 0;
    let failed = false;
    req.on('data', (c: Buffer) => {
      if (failed) return;
      size += c.length;
      if (size > max) {
        failed = true;
        reject(new BodyError('body', `is larger than ${max} bytes (receivers.rollout_api.max_body_bytes)`, 413));
        return;
      }
      parts.push(c);
    });
    req.on('end', () => {
      if (failed) return;
      const text = Buffer.concat(parts).toString('utf8');
      if (text.trim() === '') return resolve({});
      try {
        resolve(JSON.parse(text));
      } catch {
        reject(new BodyError('body', 'is not valid JSON'));
      }
    });
    req.on('error', (err) => {
      if (!failed) reject(err);
    });
  });
}
