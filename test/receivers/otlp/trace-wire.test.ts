import { decodeProtobuf, DecodeError } from '../../../src/receivers/otlp/decode';
import { MAX_DEPTH } from '../../../src/receivers/otlp/trace-wire';

/*
 * The wire decoder on bytes built by hand, for what an encoder from objects never writes: fields
 * out of order, a repeated field split around others, unknown fields of every wire type (groups
 * too), a singular field or a oneof written twice, and bytes that are not a request.
 */
function varint(n: bigint): number[] {
  const out: number[] = [];
  let v = BigInt.asUintN(64, n);
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v > 0n ? b | 0x80 : b);
  } while (v > 0n);
  return out;
}
const tag = (field: number, wire: number) => varint(BigInt((field << 3) | wire));
const ld = (field: number, body: number[] | Buffer | string) => {
  const bytes = typeof body === 'string' ? [...Buffer.from(body, 'utf8')] : [...body];
  return [...tag(field, 2), ...varint(BigInt(bytes.length)), ...bytes];
};
const vi = (field: number, n: bigint | number) => [...tag(field, 0), ...varint(BigInt(n))];
const fixed64 = (field: number, n: bigint) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(n);
  return [...tag(field, 1), ...b];
};
const fixed32 = (field: number, n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return [...tag(field, 5), ...b];
};
const double = (field: number, d: number) => {
  const b = Buffer.alloc(8);
  b.writeDoubleLE(d);
  return [...tag(field, 1), ...b];
};
const kv = (key: string, value: number[]) => ld(9, [...ld(1, key), ...ld(2, value)]);
const TRACE = Buffer.alloc(16, 0xab);
const SPAN = Buffer.alloc(8, 0xcd);
const request = (span: number[], resource: number[] = [], scope: number[] = []) =>
  Buffer.from(ld(1, [...ld(2, [...ld(2, span), ...ld(1, scope)]), ...ld(1, resource)]));

function refusal(bytes: Buffer): string {
  try {
    decodeProtobuf(bytes);
  } catch (err) {
    expect(err).toBeInstanceOf(DecodeError);
    return (err as Error).message;
  }
  throw new Error('decoded');
}

describe('the OTLP wire decoder', () => {
  it('reads fields in any order, a repeated field split around others, and a resource and scope written after the spans', () => {
    const span = [
      ...fixed64(8, 1700000000200000000n),
      ...kv('a', ld(1, 'x')),
      ...ld(5, 'tool.call'),
      ...ld(2, SPAN),
      ...kv('b', vi(3, -5)),
      ...ld(1, TRACE),
      ...fixed64(7, 1700000000100000000n),
      ...fixed32(16, 0x301),
      ...vi(6, 3),
      ...ld(15, [...vi(3, 2), ...ld(2, 'boom')]),
      ...ld(11, [...ld(2, 'ev'), ...fixed64(1, 5n), ...ld(3, [...ld(1, 'k'), ...ld(2, [...tag(2, 0), 1])])]),
      ...ld(13, [...ld(2, SPAN), ...ld(1, TRACE), ...ld(3, 'ts')]),
      ...kv('a', ld(1, 'y')),
    ];
    const scope = [...ld(2, '1.0'), ...ld(3, [...ld(1, 's'), ...ld(2, double(4, 0.5))]), ...ld(1, 'lib')];
    const resource = ld(1, [...ld(1, 'service.name'), ...ld(2, ld(1, 'agent'))]);
    const { spans, rejected } = decodeProtobuf(request(span, resource, scope));
    expect(rejected).toBe(0);
    expect(spans).toEqual([
      {
        traceId: 'ab'.repeat(16),
        spanId: 'cd'.repeat(8),
        parentSpanId: '',
        traceState: '',
        flags: 0x301,
        name: 'tool.call',
        kind: 3,
        startTimeUnixNano: '1700000000100000000',
        endTimeUnixNano: '1700000000200000000',
        // The key written twice keeps its first place and its last value, as a JSON object would.
        attributes: { a: 'y', b: -5 },
        events: [{ name: 'ev', timeUnixNano: '5', attributes: { k: true } }],
        links: [{ traceId: 'ab'.repeat(16), spanId: 'cd'.repeat(8), traceState: 'ts', attributes: {} }],
        status: { code: 2, message: 'boom' },
        resource: { 'service.name': 'agent' },
        scope: { name: 'lib', version: '1.0', attributes: { s: 0.5 } },
      },
    ]);
  });

  it('skips unknown fields of every wire type, groups nested in groups, and known fields on a wire type not theirs', () => {
    const unknown = [
      ...vi(99, 12345678901234n),
      ...fixed64(98, 7n),
      ...fixed32(97, 7),
      ...ld(96, 'ignored'),
      ...tag(95, 3),
      ...vi(1, 1),
      ...tag(94, 3),
      ...ld(2, 'x'),
      ...tag(94, 4),
      ...tag(95, 4),
    ];
    const span = [...unknown, ...ld(1, TRACE), ...ld(2, SPAN), ...vi(5, 7), ...fixed64(6, 1n), ...ld(5, 'named'), ...unknown];
    const bytes = Buffer.from([...unknown, ...ld(1, [...unknown, ...ld(2, [...unknown, ...ld(2, span)])])]);
    const { spans } = decodeProtobuf(bytes);
    expect(spans).toHaveLength(1);
    expect(spans[0]).toMatchObject({ name: 'named', kind: 0, traceId: 'ab'.repeat(16) });
  });

  it('takes the last of a singular field, of a message field (replaced, not merged) and of a oneof', () => {
    const span = [
      ...ld(1, TRACE),
      ...ld(2, SPAN),
      ...ld(5, 'first'),
      ...ld(5, 'last'),
      ...ld(15, [...vi(3, 2), ...ld(2, 'first')]),
      ...ld(15, vi(3, 1)),
      ...kv('v', [...ld(1, 'text'), ...vi(3, 42)]),
      ...kv('w', [...vi(3, 42), ...ld(1, 'text')]),
      ...kv('x', [...ld(1, 'text'), ...vi(8, 3)]),
    ];
    const [s] = decodeProtobuf(request(span)).spans;
    expect(s.name).toBe('last');
    expect(s.status).toEqual({ code: 1, message: '' });
    expect(s.attributes).toEqual({ v: 42, w: 'text', x: null });
  });

  it('reads strings of any length as UTF-8, ints across the int64 range and a KeyValue without a key as absent', () => {
    const long = 'grüße, 世界 '.repeat(5);
    const span = [
      ...ld(1, TRACE),
      ...ld(2, SPAN),
      ...ld(5, long),
      ...kv('min', vi(3, -(2n ** 63n))),
      ...kv('max', vi(3, 2n ** 63n - 1n)),
      ...kv('safe', vi(3, -(2n ** 53n - 1n))),
      ...kv('unsafe', vi(3, -(2n ** 53n))),
      ...kv('bytes', ld(7, Buffer.from([0, 1, 255]))),
      ...kv('list', ld(5, [...ld(1, ld(1, 'a')), ...ld(1, []), ...ld(1, ld(6, ld(1, [...ld(1, 'k'), ...ld(2, vi(2, 0))])))])),
      ...ld(9, ld(2, ld(1, 'no key'))),
    ];
    const [s] = decodeProtobuf(request(span)).spans;
    expect(s.name).toBe(long);
    expect(s.attributes).toEqual({
      min: '-9223372036854775808',
      max: '9223372036854775807',
      safe: -(2 ** 53 - 1),
      unsafe: '-9007199254740992',
      bytes: new Uint8Array([0, 1, 255]),
      list: ['a', null, { k: false }],
    });
  });

  it('counts spans without valid ids as rejected, with the first reason', () => {
    const bytes = Buffer.from(
      ld(1, ld(2, [...ld(2, [...ld(1, TRACE), ...ld(2, Buffer.alloc(8))]), ...ld(2, ld(2, SPAN)), ...ld(2, [...ld(1, TRACE), ...ld(2, SPAN)])])),
    );
    expect(decodeProtobuf(bytes)).toMatchObject({ rejected: 2, rejectReason: 'invalid span id (must be 8 non-zero bytes)' });
    expect(decodeProtobuf(bytes).spans).toHaveLength(1);
  });

  it('refuses bytes that are not a request, saying where', () => {
    const good = request([...ld(1, TRACE), ...ld(2, SPAN), ...ld(5, 'n')]);
    expect(refusal(good.subarray(0, good.length - 1))).toMatch(/^not an ExportTraceServiceRequest: a field of \d+ bytes with \d+ left at byte \d+$/);
    expect(refusal(Buffer.from([0x0a, 0x80]))).toMatch(/a varint cut short/);
    expect(refusal(Buffer.from([...tag(7, 4)]))).toMatch(/wire type 4/);
    expect(refusal(Buffer.from([...tag(7, 6)]))).toMatch(/wire type 6/);
    expect(refusal(Buffer.from([...tag(7, 3), ...tag(8, 4)]))).toMatch(/a group of field 7 ended as field 8/);
    expect(refusal(Buffer.from([...vi(9, 0), 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]))).toMatch(/longer than 10 bytes/);
    expect(refusal(request([...ld(1, TRACE), ...ld(2, SPAN), ...ld(5, Buffer.from([0x61, 0xff, 0x62]))]))).toMatch(/not UTF-8/);
    expect(refusal(request([...ld(1, TRACE), ...ld(2, SPAN), ...ld(5, Buffer.from('é'.repeat(20) + '\xff', 'latin1'))]))).toMatch(/not UTF-8/);
  });

  it(`reads attribute values nested up to ${MAX_DEPTH} deep and refuses deeper ones`, () => {
    const nested = (depth: number) => {
      let value = ld(1, 'leaf');
      for (let i = 0; i < depth; i++) value = ld(5, ld(1, value));
      return request([...ld(1, TRACE), ...ld(2, SPAN), ...kv('deep', value)]);
    };
    // nested(n): n arrays, the string the n + 1st AnyValue.
    let v: unknown = decodeProtobuf(nested(MAX_DEPTH - 1)).spans[0].attributes.deep;
    for (let i = 0; i < MAX_DEPTH - 1; i++) v = (v as unknown[])[0];
    expect(v).toBe('leaf');
    expect(refusal(nested(MAX_DEPTH))).toMatch(/attribute values nested too deeply/);
    expect(refusal(nested(2_000))).toMatch(/nested too deeply/);
  });
});
