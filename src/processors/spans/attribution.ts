import type { AttributeValue, Span } from '../../model/span';

export interface RolloutAttribution {
  rolloutId: string | null;
  attemptId: string | null;
  groupId: string | null;
  agentName: string | null;
  source: 'span' | 'resource' | null;
}

const ID = /^[A-Za-z0-9._:-]{1,128}$/;

function id(v: AttributeValue | undefined): string | null {
  const s = typeof v === 'number' && Number.isInteger(v) ? String(v) : v;
  return typeof s === 'string' && ID.test(s) ? s : null;
}

function pick(attrs: Record<string, AttributeValue>, names: readonly string[]): string | null {
  for (const n of names) {
    const v = id(attrs[n]);
    if (v !== null) return v;
  }
  return null;
}

const ROLLOUT = ['lightning.rollout_id', 'agentlightning.rollout_id'];
const ATTEMPT = ['lightning.attempt_id', 'agentlightning.attempt_id'];
const GROUP = ['lightning.group_id', 'agentlightning.group_id'];

/** Correlation from a span (docs/frameworks.md): its attributes, then its resource's; ids validated like everywhere else. */
export function spanAttribution(span: Span): RolloutAttribution {
  for (const [attrs, source] of [
    [span.attributes, 'span'],
    [span.resource, 'resource'],
  ] as const) {
    const rolloutId = pick(attrs, ROLLOUT);
    if (rolloutId !== null) {
      return {
        rolloutId,
        attemptId: pick(attrs, ATTEMPT),
        groupId: pick(attrs, GROUP),
        agentName: typeof attrs['gen_ai.agent.name'] === 'string' ? attrs['gen_ai.agent.name'].slice(0, 128) : null,
        source,
      };
    }
  }
  return { rolloutId: null, attemptId: null, groupId: null, agentName: null, source: null };
}
