import http from 'node:http';
import * as grpc from '@grpc/grpc-js';
import type { Span } from '../../../src/model/span';
import { decodeJson, DecodeError, decodeStatus, otlpRoot } from '../../../src/receivers/otlp/decode';
import { createOtlpReceiver, type OtlpReceiver } from '../../../src/receivers/otlp/receiver';
import { silentLogger } from '../../../src/telemetry/logger';

const TRACE = '5B8EFFF798038103D269B633813FC60C';
const span = (extra: Record<string, unknown> = {}) => ({ traceId: TRACE, spanId: 'EEE19B7EC3C1B174', name: 's', ...extra });
const doc = (spans: unknown, scope: Record<string, unknown> = {}, rs: Record<string, unknown> = {}) => ({
  resourceSpans: [{ ...rs, scopeSpans: [{ ...scope, spans }] }],
});

describe('OTLP/JSON that is not a well-formed request is undecodable', () => {
  it.each<[string, unknown]>([
    ['resourceSpans holding arrays', { resourceSpans: [[[1]]] }],
    ['resourceSpans holding a number', { resourceSpans: [1] }],
    ['scopeSpans holding a string', { resourceSpans: [{ scopeSpans: ['x'] }] }],
    ['spans holding null', doc([span(), null])],
    ['spans holding an array', doc([[span()]])],
    ['events holding a number', doc([span({ events: [3] })])],
    ['links holding a string', doc([span({ links: ['l'] })])],
    ['attributes holding a number', doc([span({ attributes: [7] })])],
    ['attributes that are not an array', doc([span({ attributes: { a: 1 } })])],
    ['an attribute value that is not an object', doc([span({ attributes: [{ key: 'k', value: 'v' }] })])],
    ['an arrayValue holding a number', doc([span({ attributes: [{ key: 'k', value: { arrayValue: { values: [1] } } }] })])],
    ['a resource that is a string', doc([span()], {}, { resource: 'r' })],
    ['a scope that is an array', doc([span()], { scope: [] })],
    ['a status that is a number', doc([span({ status: 2 })])],
  ])('%s', (_name, body) => {
    expect(() => decodeJson(JSON.stringify(body))).toThrow(DecodeError);
  });

  it('well-formed requests still decode, null and absent fields reading as empty', () => {
    const d = decodeJson(
      JSON.stringify(
        doc(
          [span({ attributes: [{ key: 'k', value: { arrayValue: { values: [{ intValue: '1' }] } } }], status: null, events: null })],
          { scope: null },
          { resource: null },
        ),
      ),
    );
    expect(d.spans).toHaveLength(1);
    expect(d.spans[0].attributes).toEqual({ k: [1] });
  });

  it('nesting deep enough to exhaust the stack is a DecodeError, not a crash', () => {
    const depth = 200_000;
    const value = '{"arrayValue":{"values":['.repeat(depth) + '{"stringValue":"leaf"}' + ']}}'.repeat(depth);
    const text = JSON.stringify(doc([span({ attributes: [{ key: 'deep', value: 'VALUE' }] })])).replace('"VALUE"', value);
    let outcome = 'decoded';
    try {
      decodeJson(text);
    } catch (err) {
      expect(err).toBeInstanceOf(DecodeError);
      outcome = 'refused';
    }
    expect(outcome).toBe('refused');
  });
});

describe('the OTLP receiver answers undecodable requests with 400 / INVALID_ARGUMENT and delivers nothing', () => {
  let receiver: OtlpReceiver;
  const received: Span[][] = [];
  beforeAll(async () => {
    receiver = createOtlpReceiver(
      { grpcAddr: '127.0.0.1:0', httpAddr: '127.0.0.1:0', maxRequestBytes: 1024 * 1024 },
      { logger: silentLogger, sink: (spans) => (received.push(spans), { status: 'accepted' }) },
    );
    await receiver.start();
  });
  afterAll(() => receiver.shutdown());

  function post(body: string | Buffer, contentType: string): Promise<{ status: number; body: Buffer }> {
    return new Promise((resolve, reject) => {
      const req = http.request(
        { host: '127.0.0.1', port: receiver.httpPort(), path: '/v1/traces', method: 'POST', headers: { 'content-type': contentType } },
        (res) => {
          const parts: Buffer[] = [];
          res.on('data', (c: Buffer) => parts.push(c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(parts) }));
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  }

  it('HTTP/JSON: {"resourceSpans": [[[1]]]} and a span list with a non-object are 400 with a Status', async () => {
    const a = await post('{"resourceSpans": [[[1]]]}', 'application/json');
    expect(a.status).toBe(400);
    expect(JSON.parse(a.body.toString())).toEqual({ code: 3, message: 'resourceSpans[0] must be an object', details: [] });
    const b = await post(JSON.stringify(doc([span(), 5])), 'application/json');
    expect(b.status).toBe(400);
    expect(received).toHaveLength(0);
  });

  it('HTTP/protobuf: a resource_spans entry whose bytes do not decode is 400 with a google.rpc.Status', async () => {
    // resource_spans (field 1) claiming 4 bytes that hold a scope_spans (field 2) claiming 10.
    const res = await post(Buffer.from([0x0a, 0x04, 0x12, 0x0a, 0x0a, 0x00]), 'application/x-protobuf');
    expect(res.status).toBe(400);
    expect(decodeStatus(res.body)).toMatchObject({ code: 3, message: expect.stringContaining('not an ExportTraceServiceRequest') });
    expect(received).toHaveLength(0);
  });

  it('gRPC: the same bytes are INVALID_ARGUMENT', async () => {
    const Client = grpc.makeGenericClientConstructor({}, 'TraceService');
    const client = new Client(`127.0.0.1:${receiver.grpcPort()}`, grpc.credentials.createInsecure());
    const err = await new Promise<grpc.ServiceError | null>((resolve) =>
      client.makeUnaryRequest(
        '/opentelemetry.proto.collector.trace.v1.TraceService/Export',
        (b: Buffer) => b,
        (b: Buffer) => b,
        Buffer.from([0x0a, 0x04, 0x12, 0x0a, 0x0a, 0x00]),
        (e) => resolve(e),
      ),
    );
    client.close();
    expect(err?.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(received).toHaveLength(0);
    expect(otlpRoot()).toBeDefined();
  });
});
