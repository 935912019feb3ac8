import fc from 'fast-check';
import { decodeProtobuf, guarded, otlpRoot } from '../../../src/receivers/otlp/decode';

/*
 * decodeProtobuf reads the request's bytes itself (trace-wire.ts). protobufjs' own decoding, read
 * through its `toObject` copy (longs as decimal strings, no defaults), is kept here as the
 * reference: both must normalize any request to the same spans (unset fields, every AnyValue kind
 * and nesting, int64s of any sign and size, fixed64 times up to 2^64 - 1, empty and missing ids).
 */
const Req = otlpRoot().lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');

function reference(bytes: Uint8Array) {
  return guarded(Req.toObject(Req.decode(bytes), { longs: String, enums: Number, defaults: false, arrays: true }), false);
}

const u64 = fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }).map(String);
const anyValue: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constant({}),
    fc.record({ string_value: fc.string() }),
    fc.record({ bool_value: fc.boolean() }),
    fc.record({ int_value: fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }).map(String) }),
    fc.record({ int_value: fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 }) }),
    fc.record({ double_value: fc.double({ noNaN: true }) }),
    fc.record({ bytes_value: fc.uint8Array({ maxLength: 8 }).map((b) => Buffer.from(b)) }),
    fc.record({ array_value: fc.record({ values: fc.array(tie('value'), { maxLength: 3 }) }) }),
    fc.record({ kvlist_value: fc.record({ values: fc.array(fc.record({ key: fc.string({ maxLength: 4 }), value: tie('value') }), { maxLength: 3 }) }) }),
  ),
})).value;
const attributes = fc.array(fc.record({ key: fc.string({ maxLength: 6 }), value: anyValue }, { requiredKeys: ['key'] }), { maxLength: 4 });
const id = (n: number) => fc.oneof(fc.uint8Array({ minLength: n, maxLength: n }), fc.uint8Array({ maxLength: 3 })).map((b) => Buffer.from(b));
const span = fc.record(
  {
    trace_id: id(16),
    span_id: id(8),
    parent_span_id: id(8),
    trace_state: fc.string({ maxLength: 5 }),
    flags: fc.nat(),
    name: fc.string({ maxLength: 8 }),
    kind: fc.integer({ min: 0, max: 5 }),
    start_time_unix_nano: u64,
    end_time_unix_nano: u64,
    attributes,
    events: fc.array(fc.record({ name: fc.string({ maxLength: 4 }), time_unix_nano: u64, attributes }, { requiredKeys: [] }), { maxLength: 2 }),
    links: fc.array(fc.record({ trace_id: id(16), span_id: id(8), trace_state: fc.string({ maxLength: 3 }), attributes }, { requiredKeys: [] }), {
      maxLength: 2,
    }),
    status: fc.record({ code: fc.integer({ min: 0, max: 2 }), message: fc.string({ maxLength: 5 }) }, { requiredKeys: [] }),
  },
  { requiredKeys: [] },
);
const request = fc.record({
  resource_spans: fc.array(
    fc.record(
      {
        resource: fc.record({ attributes }, { requiredKeys: [] }),
        scope_spans: fc.array(
          fc.record(
            {
              scope: fc.record({ name: fc.string({ maxLength: 4 }), version: fc.string({ maxLength: 3 }), attributes }, { requiredKeys: [] }),
              spans: fc.array(span, { maxLength: 3 }),
            },
            { requiredKeys: [] },
          ),
          { maxLength: 2 },
        ),
      },
      { requiredKeys: [] },
    ),
    { maxLength: 2 },
  ),
});

describe('decodeProtobuf reads a request as protobufjs decodes it', () => {
  it('the same spans, rejections and reasons for any request', () => {
    fc.assert(
      fc.property(request, (r) => {
        const bytes = Req.encode(Req.fromObject(r)).finish();
        expect(decodeProtobuf(bytes)).toEqual(reference(bytes));
      }),
      { seed: 20261129, numRuns: 500 },
    );
  });

  it('times at the edges of fixed64, and int64s at the edges of their range and of safe integers', () => {
    const edges = ['0', '1', '9007199254740991', '9007199254740992', '9007199254740993', '18446744073709551615', '1700000000123456789'];
    const ints = ['-9223372036854775808', '-9007199254740993', '-9007199254740991', '-1', '0', '9007199254740991', '9007199254740993', '9223372036854775807'];
    const spans = edges.map((t, i) => ({
      trace_id: Buffer.alloc(16, i + 1),
      span_id: Buffer.alloc(8, i + 1),
      start_time_unix_nano: t,
      end_time_unix_nano: t,
      attributes: ints.map((v, k) => ({ key: `i${k}`, value: { int_value: v } })),
    }));
    const bytes = Req.encode(Req.fromObject({ resource_spans: [{ scope_spans: [{ spans }] }] })).finish();
    const decoded = decodeProtobuf(bytes);
    expect(decoded).toEqual(reference(bytes));
    expect(decoded.spans.map((s) => s.startTimeUnixNano)).toEqual(edges);
    expect(Object.values(decoded.spans[0].attributes)).toEqual([
      '-9223372036854775808',
      '-9007199254740993',
      -9007199254740991,
      -1,
      0,
      9007199254740991,
      '9007199254740993',
      '9223372036854775807',
    ]);
  });
});
