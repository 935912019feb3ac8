import type { PipelineRecord, ToolSpanFacts } from '../model/records';

/** What span classification found in a reward span. */
export interface RewardFacts {
  rewards: { name: string; value: number }[];
  final: boolean;
  provisional: boolean;
}

/** What the sidecar keeps of an interesting span: enough to attribute, join and judge it. */
export interface SpanObservation {
  type: 'span';
  traceId: string;
  spanId: string;
  startedAt: number;
  endedAt: number;
  /** From the span's own or its resource's attributes; null = find it by trace id. */
  rollout: { rolloutId: string; attemptId: string } | null;
  what: { kind: 'tool'; tool: ToolSpanFacts } | { kind: 'reward'; reward: RewardFacts } | { kind: 'agent'; agent: { name: string } };
  attributes: Record<string, string | number | boolean>;
  at: number;
}

/** Turns an attributed observation into the records the assembler takes. */
export function spanRecords(o: SpanObservation, rollout: { rolloutId: string; attemptId: string }): PipelineRecord[] {
  if (o.what.kind === 'agent') {
    return [
      {
        type: 'agent_span',
        rolloutId: rollout.rolloutId,
        attemptId: rollout.attemptId,
        traceId: o.traceId,
        spanId: o.spanId,
        agentName: o.what.agent.name,
        startedAt: o.startedAt,
        endedAt: o.endedAt,
        at: o.at,
      },
    ];
  }
  if (o.what.kind === 'tool') {
    const t = o.what.tool;
    return [
      {
        type: 'tool_span',
        rolloutId: rollout.rolloutId,
        attemptId: rollout.attemptId,
        traceId: o.traceId,
        spanId: o.spanId,
        convention: t.convention,
        toolName: t.toolName,
        toolCallId: t.toolCallId,
        arguments: t.arguments ?? null,
        result: t.result,
        outcome: t.outcome,
        errorType: t.errorType,
        attributes: o.attributes,
        startedAt: o.startedAt,
        endedAt: o.endedAt,
        at: o.at,
      },
    ];
  }
  const [primary, ...others] = o.what.reward.rewards;
  return [
    ...others.map((r) => ({ type: 'reward' as const, ...rollout, value: r.value, name: r.name, final: false, at: o.at, source: 'span' as const })),
    {
      type: 'reward',
      ...rollout,
      value: primary.value,
      name: primary.name,
      final: o.what.reward.final,
      provisional: o.what.reward.provisional,
      at: o.at,
      source: 'span',
    },
  ];
}

interface Parked {
  observation: SpanObservation;
  offset: number;
  expiresAt: number;
}

/**
 * Finds the rollout of spans that do not name one: the rollout of a proxied call that carried
 * the same trace id. Spans of a trace no call has shown yet are parked, bounded in count and
 * time. Deterministic given the same calls, spans and times.
 */
export class TraceRouter {
  private readonly traces = new Map<string, { rolloutId: string; attemptId: string }>();
  private readonly parked = new Map<string, Parked[]>();
  private parkedCount = 0;

  constructor(private readonly options: { waitMs: number; maxParked: number; maxTraces?: number }) {}

  get pending(): number {
    return this.parkedCount;
  }

  minParkedOffset(): number {
    let min = Infinity;
    for (const list of this.parked.values()) for (const p of list) min = Math.min(min, p.offset);
    return min;
  }

  /** The rollout a span belongs to, when it names one or its trace is known; no side effects. */
  rolloutOf(o: SpanObservation): { rolloutId: string; attemptId: string } | null {
    return o.rollout ?? this.traces.get(o.traceId) ?? null;
  }

  /** Returns the rollout, 'parked', or 'dropped' when the parking lot is full. */
  route(o: SpanObservation, offset: number): { rolloutId: string; attemptId: string } | 'parked' | 'dropped' {
    const known = o.rollout ?? this.traces.get(o.traceId);
    if (known) return known;
    if (this.parkedCount >= this.options.maxParked) return 'dropped';
    const list = this.parked.get(o.traceId) ?? [];
    list.push({ observation: o, offset, expiresAt: o.at + this.options.waitMs });
    this.parked.set(o.traceId, list);
    this.parkedCount++;
    return 'parked';
  }

  /** A call carried `traceId`: remembers its rollout and releases the spans parked for it. */
  noteTrace(traceId: string, rollout: { rolloutId: string; attemptId: string }): { observation: SpanObservation; offset: number }[] {
    this.traces.delete(traceId);
    this.traces.set(traceId, rollout);
    if (this.traces.size > (this.options.maxTraces ?? 100_000)) this.traces.delete(this.traces.keys().next().value as string);
    const released = this.parked.get(traceId) ?? [];
    this.parked.delete(traceId);
    this.parkedCount -= released.length;
    return released;
  }

  /** Drops what waited past its time; returns the dropped observations. */
  expire(at: number): SpanObservation[] {
    const dropped: SpanObservation[] = [];
    for (const [traceId, list] of this.parked) {
      const keep = list.filter((p) => p.expiresAt > at);
      if (keep.length === list.length) continue;
      for (const p of list) if (p.expiresAt <= at) dropped.push(p.observation);
      this.parkedCount -= list.length - keep.length;
      if (keep.length === 0) this.parked.delete(traceId);
      else this.parked.set(traceId, keep);
    }
    return dropped;
  }
}
