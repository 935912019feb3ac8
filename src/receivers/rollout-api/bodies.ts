import { ID_PATTERN } from '../llm-proxy/correlation';

export class BodyError extends Error {
  readonly code = 'BAD_BODY';
  constructor(
    readonly field: string,
    problem: string,
    readonly status = 400,
  ) {
    super(`${field}: ${problem}`);
  }
}

function object(body: unknown, field = 'body'): Record<string, unknown> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new BodyError(field, 'must be a JSON object');
  return body as Record<string, unknown>;
}

function attemptId(b: Record<string, unknown>): string {
  const v = b.attempt_id;
  if (v === undefined || v === null) return '0';
  const s = typeof v === 'number' && Number.isInteger(v) ? String(v) : v;
  if (typeof s !== 'string' || !ID_PATTERN.test(s)) throw new BodyError('attempt_id', 'must be 1-128 characters of [A-Za-z0-9._:-]');
  return s;
}

/** Keys agents use for a reward's value by mistake. */
const VALUE_ALIASES = ['reward', 'score'];

/**
 * The reward's value, `holder.value`. The error says the shape the body must have (`shape`), and
 * which key to rename when the value came under another name (`{"reward": 1}`).
 */
function rewardValue(holder: Record<string, unknown>, field: string, shape: string): number {
  const v = holder.value;
  if (typeof v === 'number' && Number.isFinite(v)) return v;
  const alias = v === undefined ? VALUE_ALIASES.find((k) => k in holder) : undefined;
  if (alias !== undefined) throw new BodyError(field, `is missing: use "value" instead of "${alias}"; the body must be ${shape}`);
  throw new BodyError(field, `${v === undefined ? 'is missing' : 'must be a finite number'}; the body must be ${shape}`);
}

/** `{"value": 1.0, "attempt_id": "0", "final": true, "name": "primary"}` */
export function parseRewardBody(body: unknown): { attemptId: string; value: number; final: boolean; name: string } {
  const b = object(body);
  const final = b.final ?? true;
  if (typeof final !== 'boolean') throw new BodyError('final', 'must be a boolean');
  const name = b.name ?? 'primary';
  if (typeof name !== 'string' || name.length === 0 || name.length > 128) throw new BodyError('name', 'must be a string of 1-128 characters');
  return { attemptId: attemptId(b), value: rewardValue(b, 'value', '{"value": <number>} (optionally "final", "name", "attempt_id")'), final, name };
}

/** `{"attempt_id": "0"}` (or empty). */
export function parseEndBody(body: unknown): { attemptId: string } {
  return { attemptId: attemptId(object(body)) };
}

/**
 * agent-lightning v1 events route: `{"event_type": "reward", "data": {"value": 1.0}}`. An
 * agent-lightning reward event is the rollout's reward, so it is final.
 */
export function parseEventsBody(body: unknown): { value: number; final: boolean; name: string } {
  const b = object(body);
  if (b.event_type !== 'reward') {
    throw new BodyError('event_type', `${JSON.stringify(b.event_type)} is not supported; the sidecar takes "reward" events`);
  }
  const data = object(b.data, 'data');
  const name = typeof data.source === 'string' && data.source.length > 0 && data.source.length <= 128 ? data.source : 'primary';
  return { value: rewardValue(data, 'data.value', '{"event_type": "reward", "data": {"value": <number>}}'), final: true, name };
}
