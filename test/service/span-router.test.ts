import { spanRecords, TraceRouter, type SpanObservation } from '../../src/pipeline/span-router';

const obs = (traceId: string, at: number, rollout: SpanObservation['rollout'] = null): SpanObservation => ({
  type: 'span',
  traceId,
  spanId: `${traceId.slice(0, 8)}${String(at).padStart(8, '0')}`,
  startedAt: at,
  endedAt: at + 1,
  rollout,
  what: { kind: 'tool', tool: { convention: 'gen_ai', toolName: 't', toolCallId: null, result: null, outcome: 'ok', errorType: null } },
  attributes: {},
  at,
});

describe('attributing spans by trace id', () => {
  it('uses the rollout the span names; else the rollout of a call of the same trace', () => {
    const r = new TraceRouter({ waitMs: 1000, maxParked: 10 });
    expect(r.route(obs('t1', 0, { rolloutId: 'named', attemptId: '1' }), 5)).toEqual({ rolloutId: 'named', attemptId: '1' });
    r.noteTrace('t2', { rolloutId: 'from-call', attemptId: '0' });
    expect(r.route(obs('t2', 0), 6)).toEqual({ rolloutId: 'from-call', attemptId: '0' });
  });

  it('parks spans of an unknown trace and releases them when a call of that trace shows up', () => {
    const r = new TraceRouter({ waitMs: 1000, maxParked: 10 });
    expect(r.route(obs('t3', 10), 7)).toBe('parked');
    expect(r.route(obs('t3', 20), 8)).toBe('parked');
    expect(r.pending).toBe(2);
    expect(r.minParkedOffset()).toBe(7);
    const released = r.noteTrace('t3', { rolloutId: 'late-call', attemptId: '0' });
    expect(released.map((p) => p.offset)).toEqual([7, 8]);
    expect(r.pending).toBe(0);
    expect(spanRecords(released[0].observation, { rolloutId: 'late-call', attemptId: '0' })[0]).toMatchObject({ type: 'tool_span', rolloutId: 'late-call' });
  });

  it('drops parked spans after the wait, and refuses to park past the bound', () => {
    const r = new TraceRouter({ waitMs: 100, maxParked: 2 });
    r.route(obs('a', 0), 1);
    r.route(obs('b', 50), 2);
    expect(r.route(obs('c', 60), 3)).toBe('dropped');
    expect(r.expire(100).map((o) => o.traceId)).toEqual(['a']);
    expect(r.pending).toBe(1);
    expect(r.expire(150).map((o) => o.traceId)).toEqual(['b']);
    expect(r.minParkedOffset()).toBe(Infinity);
  });
});
