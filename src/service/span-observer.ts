import { classifySpan, spanAttribution } from '../processors/spans';
import type { Attributes, Span } from '../model/span';
import type { SpanObservation } from '../pipeline/span-router';

const MAX_ATTRIBUTES = 64;
const MAX_ATTRIBUTE_CHARS = 256;

/**
 * Keeps the tool and reward spans of a batch, cheaply dropping everything else. Pure: the same
 * spans give the same observations.
 */
export function observeSpans(spans: readonly Span[], at: number, maxPayloadChars: number): { observations: SpanObservation[]; other: number } {
  const observations: SpanObservation[] = [];
  let other = 0;
  for (const span of spans) {
    const c = classifySpan(span, { maxPayloadChars });
    if (c.kind === 'other' || (c.kind === 'reward' && c.reward.rewards.length === 0)) {
      other++;
      continue;
    }
    const attr = spanAttribution(span);
    observations.push({
      type: 'span',
      traceId: span.traceId,
      spanId: span.spanId,
      startedAt: nanosToMs(span.startTimeUnixNano),
      endedAt: nanosToMs(span.endTimeUnixNano),
      rollout: attr.rolloutId ? { rolloutId: attr.rolloutId, attemptId: attr.attemptId ?? '0' } : null,
      what: c,
      attributes: scalarAttributes(span.attributes),
      at,
    });
  }
  return { observations, other };
}

function nanosToMs(nanos: string): number {
  try {
    return Number(BigInt(nanos) / 1_000_000n);
  } catch {
    return 0;
  }
}

function scalarAttributes(attributes: Attributes): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  let n = 0;
  for (const [k, v] of Object.entries(attributes)) {
    if (n >= MAX_ATTRIBUTES) break;
    if (typeof v === 'number' || typeof v === 'boolean') out[k] = v;
    else if (typeof v === 'string') out[k] = v.length > MAX_ATTRIBUTE_CHARS ? v.slice(0, MAX_ATTRIBUTE_CHARS) : v;
    else continue;
    n++;
  }
  return out;
}
