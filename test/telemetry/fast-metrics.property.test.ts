import fc from 'fast-check';
import { Counter, Histogram, Registry } from 'prom-client';
import { FastCounter, FastHistogram } from '../../src/telemetry/fast-metrics';

/*
 * The fast counter and histogram against prom-client's own, fed the same updates: the same
 * /metrics text after any sequence of them (label sets new and seen, values on a bucket's bound,
 * between and above them, zero, whole and fractional increments), with resets and removals of
 * series in between, which must not leave a kept series being updated out of sight.
 */
const BUCKETS = [0.001, 0.01, 0.1, 1];

function pair() {
  const plain = new Registry();
  const fast = new Registry();
  const make = (registry: Registry, F: boolean) => ({
    calls: F
      ? new FastCounter({ name: 'calls_total', help: 'h', labelNames: ['api', 'status'] as const, registers: [registry] })
      : new Counter({ name: 'calls_total', help: 'h', labelNames: ['api', 'status'] as const, registers: [registry] }),
    plainCount: F
      ? new FastCounter({ name: 'plain_total', help: 'h', registers: [registry] })
      : new Counter({ name: 'plain_total', help: 'h', registers: [registry] }),
    time: F
      ? new FastHistogram({ name: 'time_seconds', help: 'h', labelNames: ['api'] as const, buckets: BUCKETS, registers: [registry] })
      : new Histogram({ name: 'time_seconds', help: 'h', labelNames: ['api'] as const, buckets: BUCKETS, registers: [registry] }),
    size: F
      ? new FastHistogram({ name: 'size', help: 'h', buckets: [1, 10, 100], registers: [registry] })
      : new Histogram({ name: 'size', help: 'h', buckets: [1, 10, 100], registers: [registry] }),
  });
  return { plain: { registry: plain, m: make(plain, false) }, fast: { registry: fast, m: make(fast, true) } };
}

const api = fc.constantFrom('chat', 'responses', 'other');
const status = fc.constantFrom('2xx', '5xx');
const seconds = fc.oneof(fc.constantFrom(0, ...BUCKETS), fc.double({ min: 0, max: 5, noNaN: true }));
const op = fc.oneof(
  fc.record({
    kind: fc.constant('inc' as const),
    api,
    status,
    by: fc.option(fc.oneof(fc.nat(5), fc.double({ min: 0, max: 3, noNaN: true })), { nil: undefined }),
  }),
  fc.record({ kind: fc.constant('incPlain' as const), by: fc.option(fc.nat(3), { nil: undefined }) }),
  fc.record({ kind: fc.constant('time' as const), api, v: seconds }),
  fc.record({ kind: fc.constant('size' as const), v: fc.oneof(fc.constantFrom(1, 10, 100, 1000), fc.double({ min: 0, max: 200, noNaN: true })) }),
  fc.record({ kind: fc.constant('reset' as const) }),
  fc.record({ kind: fc.constant('remove' as const), api, status }),
);
type Op = typeof op extends fc.Arbitrary<infer O> ? O : never;

function apply(m: ReturnType<typeof pair>['plain']['m'], o: Op): void {
  switch (o.kind) {
    case 'inc':
      if (o.by === undefined) m.calls.inc({ api: o.api, status: o.status });
      else m.calls.inc({ api: o.api, status: o.status }, o.by);
      return;
    case 'incPlain':
      m.plainCount.inc(o.by);
      return;
    case 'time':
      m.time.observe({ api: o.api }, o.v);
      return;
    case 'size':
      m.size.observe(o.v);
      return;
    case 'reset':
      m.calls.reset();
      m.time.reset();
      return;
    case 'remove':
      m.calls.remove({ api: o.api, status: o.status });
      m.time.remove({ api: o.api });
      return;
  }
}

describe('FastCounter and FastHistogram', () => {
  it('give the /metrics text prom-client gives, after any updates, resets and removals', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { maxLength: 60 }), async (ops) => {
        const { plain, fast } = pair();
        for (const o of ops) {
          apply(plain.m, o);
          apply(fast.m, o);
        }
        expect(await fast.registry.metrics()).toBe(await plain.registry.metrics());
      }),
      { seed: 20261129, numRuns: 300 },
    );
  });

  it('refuse what prom-client refuses: a value that is not a number, a counter going down', () => {
    const { fast } = pair();
    fast.m.time.observe({ api: 'chat' }, 0.5);
    expect(() => fast.m.time.observe({ api: 'chat' }, NaN)).toThrow(/not a valid number/);
    fast.m.calls.inc({ api: 'chat', status: '2xx' });
    expect(() => fast.m.calls.inc({ api: 'chat', status: '2xx' }, -1)).toThrow(/decrease/);
  });
});
