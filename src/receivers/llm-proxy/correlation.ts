import type { IncomingHttpHeaders } from 'node:http';
import { randomUUID } from 'node:crypto';
import type { Correlation } from '../../model/records';

/** Ids (docs/frameworks.md) are 1–128 chars of [A-Za-z0-9._:-]. */
export const ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;

export class CorrelationError extends Error {
  readonly code = 'INVALID_ID';
  constructor(
    readonly field: string,
    value: string,
  ) {
    super(`${field} '${value.length > 140 ? `${value.slice(0, 140)}…` : value}' is invalid: ids are 1-128 characters of [A-Za-z0-9._:-]`);
  }
}

export interface RoutedPath {
  /** Path as the agent would have sent it without a correlation prefix, e.g. `/v1/chat/completions?x=1`. */
  path: string;
  rolloutId: string | null;
  attemptId: string | null;
}

const ROLLOUT_PREFIX = /^\/rollout\/([^/?]+)(?:\/attempt\/([^/?]+))?(?=\/v1(?:[/?]|$))/;
const AGL_V1_PREFIX = /^\/proxy\/rollout\/([^/?]+)\/attempt\/([^/?]+)\/mode\/[^/?]+\/openai(?=\/v1(?:[/?]|$))/;

/** Strips a correlation prefix (ours or agent-lightning v1's) from a request path. */
export function routePath(rawPath: string): RoutedPath {
  const m = AGL_V1_PREFIX.exec(rawPath) ?? ROLLOUT_PREFIX.exec(rawPath);
  if (!m) return { path: rawPath, rolloutId: null, attemptId: null };
  return {
    path: rawPath.slice(m[0].length),
    rolloutId: decodeSegment(m[1]),
    attemptId: m[2] !== undefined ? decodeSegment(m[2]) : '0',
  };
}

function decodeSegment(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

export interface TraceContext {
  traceId: string;
  spanId: string;
}

/** W3C Trace Context `traceparent` (version 00 layout; unknown versions parsed by the same prefix). */
export function parseTraceparent(value: string | undefined): TraceContext | null {
  if (!value) return null;
  const m = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}/.exec(value.trim());
  if (!m || m[1] === 'ff' || /^0+$/.test(m[2]) || /^0+$/.test(m[3])) return null;
  return { traceId: m[2], spanId: m[3] };
}

/** W3C Baggage members (`k=v;props,k2=v2`), percent-decoded. Only the keys asked for are returned. */
export function parseBaggage(value: string | undefined, wanted: readonly string[]): Map<string, string> {
  const out = new Map<string, string>();
  if (!value) return out;
  for (const member of value.split(',')) {
    const eq = member.indexOf('=');
    if (eq < 0) continue;
    const key = member.slice(0, eq).trim();
    if (!wanted.includes(key)) continue;
    const raw = member
      .slice(eq + 1)
      .split(';')[0]
      .trim();
    out.set(key, decodeSegment(raw));
  }
  return out;
}

function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v[0] : v;
}

const BAGGAGE_KEYS = [
  'lightning.rollout_id',
  'lightning.attempt_id',
  'lightning.group_id',
  'lightning.agent_name',
  'lightning.parent_rollout_id',
  'lightning.parent_attempt_id',
] as const;

/**
 * Resolves the rollout of a proxied call, field by field, in this precedence (docs/frameworks.md):
 * path prefix, then `x-*` headers, then baggage, then the trace id, then a fresh id.
 * Throws CorrelationError for an id that is present but malformed.
 */
export function resolveCorrelation(routed: RoutedPath, headers: IncomingHttpHeaders, trace: TraceContext | null): Correlation {
  const baggage = parseBaggage(header(headers, 'baggage'), BAGGAGE_KEYS);
  let source: Correlation['source'] = 'self';
  let rolloutId: string | undefined;
  if (routed.rolloutId !== null) {
    rolloutId = check('rollout id', routed.rolloutId);
    source = 'path';
  } else if (header(headers, 'x-rollout-id') !== undefined) {
    rolloutId = check('x-rollout-id', header(headers, 'x-rollout-id')!);
    source = 'header';
  } else if (baggage.has('lightning.rollout_id')) {
    rolloutId = check('baggage lightning.rollout_id', baggage.get('lightning.rollout_id')!);
    source = 'baggage';
  } else if (trace) {
    rolloutId = trace.traceId;
    source = 'traceparent';
  } else {
    rolloutId = `call-${randomUUID()}`;
  }
  const attemptId =
    routed.attemptId !== null
      ? check('attempt id', routed.attemptId)
      : (optional('x-attempt-id', header(headers, 'x-attempt-id')) ?? optional('baggage lightning.attempt_id', baggage.get('lightning.attempt_id')) ?? '0');
  const groupId =
    optional('x-group-id', header(headers, 'x-group-id')) ??
    optional('x-task-id', header(headers, 'x-task-id')) ??
    optional('baggage lightning.group_id', baggage.get('lightning.group_id')) ??
    null;
  const agentName =
    optional('x-agent-name', header(headers, 'x-agent-name')) ?? optional('baggage lightning.agent_name', baggage.get('lightning.agent_name')) ?? null;
  const correlation: Correlation = { rolloutId, attemptId, groupId, agentName, source };
  // A subagent's rollout names its parent: its trajectories link to the parent's call.
  const parent =
    optional('x-parent-rollout-id', header(headers, 'x-parent-rollout-id')) ??
    optional('baggage lightning.parent_rollout_id', baggage.get('lightning.parent_rollout_id'));
  if (parent !== undefined && parent !== rolloutId) {
    correlation.parentRolloutId = parent;
    correlation.parentAttemptId =
      optional('x-parent-attempt-id', header(headers, 'x-parent-attempt-id')) ??
      optional('baggage lightning.parent_attempt_id', baggage.get('lightning.parent_attempt_id')) ??
      '0';
  }
  return correlation;
}

function check(field: string, value: string): string {
  if (!ID_PATTERN.test(value)) throw new CorrelationError(field, value);
  return value;
}

function optional(field: string, value: string | undefined): string | undefined {
  return value === undefined ? undefined : check(field, value);
}
