import http from 'node:http';
import { gzipSync } from 'node:zlib';
import { SpanStatusCode } from '@opentelemetry/api';
import { OTLPTraceExporter as GrpcExporter } from '@opentelemetry/exporter-trace-otlp-grpc';
import { OTLPTraceExporter as HttpJsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor, type SpanExporter } from '@opentelemetry/sdk-trace-base';
import * as grpc from '@grpc/grpc-js';
import type { Span } from '../../../src/model/span';
import { decodeStatus, otlpRoot } from '../../../src/receivers/otlp/decode';
import { createOtlpReceiver, type OtlpReceiver, type SpanSinkResult } from '../../../src/receivers/otlp/receiver';
import { silentLogger } from '../../../src/telemetry/logger';

let received: Span[][] = [];
let answer: SpanSinkResult = { status: 'accepted' };
const counts: string[] = [];
let receiver: OtlpReceiver;

beforeAll(async () => {
  receiver = createOtlpReceiver(
    { grpcAddr: '127.0.0.1:0', httpAddr: '127.0.0.1:0', maxRequestBytes: 256 * 1024 },
    {
      logger: silentLogger,
      sink: (spans) => {
        if (answer.status === 'accepted') received.push(spans);
        return answer;
      },
      onSpans: (t, o, r, n) => counts.push(`${t}:${o}:${r}:${n}`),
    },
  );
  await receiver.start();
});
afterAll(() => receiver.shutdown());
beforeEach(() => {
  received = [];
  answer = { status: 'accepted' };
  counts.length = 0;
});

async function sendWith(exporter: SpanExporter): Promise<void> {
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'agent', 'lightning.rollout_id': 'res-1' }),
    spanProcessors: [new SimpleSpanProcessor(exporter)],
  });
  const tracer = provider.getTracer('test-scope', '1.2.3');
  const span = tracer.startSpan('execute_tool search', {
    attributes: {
      'gen_ai.operation.name': 'execute_tool',
      'gen_ai.tool.name': 'search',
      'gen_ai.tool.call.id': 'call_9',
      big: 2 ** 40,
      ratio: 0.5,
      ok: true,
      tags: ['a', 'b'],
    },
  });
  span.recordException(new Error('boom'));
  span.setStatus({ code: SpanStatusCode.ERROR, message: 'boom' });
  span.end();
  await provider.forceFlush();
  await provider.shutdown();
}

describe('OTLP receiver with the real OpenTelemetry exporters', () => {
  const url = () => `http://127.0.0.1:${receiver.httpPort()}/v1/traces`;
  it.each([
    ['grpc', () => new GrpcExporter({ url: `http://127.0.0.1:${receiver.grpcPort()}` })],
    ['grpc gzip', () => new GrpcExporter({ url: `http://127.0.0.1:${receiver.grpcPort()}`, compression: 'gzip' as never })],
    ['http/protobuf', () => new ProtoExporter({ url: url() })],
    ['http/protobuf gzip', () => new ProtoExporter({ url: url(), compression: 'gzip' as never })],
    ['http/json', () => new HttpJsonExporter({ url: url() })],
    ['http/json gzip', () => new HttpJsonExporter({ url: url(), compression: 'gzip' as never })],
  ])('decodes spans sent by %s', async (_name, make) => {
    await sendWith(make());
    expect(received).toHaveLength(1);
    const [s] = received[0];
    expect(s).toMatchObject({
      name: 'execute_tool search',
      kind: 1,
      status: { code: 2, message: 'boom' },
      attributes: { 'gen_ai.tool.name': 'search', 'gen_ai.tool.call.id': 'call_9', big: 2 ** 40, ratio: 0.5, ok: true, tags: ['a', 'b'] },
      resource: { 'service.name': 'agent', 'lightning.rollout_id': 'res-1' },
      scope: { name: 'test-scope', version: '1.2.3' },
    });
    expect(s.traceId).toMatch(/^[0-9a-f]{32}$/);
    expect(s.spanId).toMatch(/^[0-9a-f]{16}$/);
    expect(s.events[0]).toMatchObject({ name: 'exception', attributes: { 'exception.message': 'boom' } });
    expect(BigInt(s.endTimeUnixNano)).toBeGreaterThanOrEqual(BigInt(s.startTimeUnixNano));
  });
});

function post(
  path: string,
  body: Buffer | string,
  headers: Record<string, string>,
  method = 'POST',
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: receiver.httpPort(), path, method, headers }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(parts) }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const jsonSpan = (traceId: string, spanId: string) => ({ traceId, spanId, name: 's', kind: 1, startTimeUnixNano: '1', endTimeUnixNano: 2 });
const jsonBody = (...spans: object[]) => JSON.stringify({ resourceSpans: [{ scopeSpans: [{ spans }] }] });
const T = '5B8EFFF798038103D269B633813FC60C';

describe('OTLP/HTTP responses (spec-exact)', () => {
  it('answers an empty success in the request content type', async () => {
    const json = await post('/v1/traces', jsonBody(jsonSpan(T, 'EEE19B7EC3C1B174')), { 'content-type': 'application/json' });
    expect([json.status, json.headers['content-type'], json.body.toString()]).toEqual([200, 'application/json', '{}']);
    expect(received[0][0].traceId).toBe(T.toLowerCase());
    const req = otlpRoot().lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
    const pb = await post('/v1/traces', Buffer.from(req.encode(req.create({})).finish()), { 'content-type': 'application/x-protobuf' });
    expect([pb.status, pb.headers['content-type'], pb.body.length]).toEqual([200, 'application/x-protobuf', 0]);
  });

  it('answers partial success with rejected_spans for individually invalid spans, keeping the valid ones', async () => {
    const res = await post('/v1/traces', jsonBody(jsonSpan(T, 'EEE19B7EC3C1B174'), jsonSpan('abcd', 'EEE19B7EC3C1B175'), jsonSpan(T, '0000000000000000')), {
      'content-type': 'application/json',
    });
    expect(res.status).toBe(200);
    const body = JSON.parse(res.body.toString());
    expect(body.partialSuccess.rejectedSpans).toBe('2');
    expect(body.partialSuccess.errorMessage).toContain('invalid trace id');
    expect(received[0]).toHaveLength(1);
    expect(counts).toEqual(expect.arrayContaining(['http:rejected:invalid_span:2', 'http:accepted:ok:1']));
  });

  it('answers 400 with a google.rpc.Status for undecodable bodies', async () => {
    const pb = await post('/v1/traces', Buffer.from([0x0a, 0xff, 0xff, 0xff]), { 'content-type': 'application/x-protobuf' });
    expect(pb.status).toBe(400);
    expect(decodeStatus(pb.body).code).toBe(3);
    const js = await post('/v1/traces', '{"resourceSpans": [', { 'content-type': 'application/json' });
    expect(js.status).toBe(400);
    expect(JSON.parse(js.body.toString())).toMatchObject({ code: 3, message: expect.stringContaining('not JSON') });
  });

  it('answers 413 above the cap counted after decompression, and a gzip bomb never inflates past it', async () => {
    const bomb = gzipSync(Buffer.alloc(64 * 1024 * 1024, 0x20));
    expect(bomb.length).toBeLessThan(256 * 1024);
    const before = process.memoryUsage().rss;
    const res = await post('/v1/traces', bomb, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
    expect(res.status).toBe(413);
    expect(process.memoryUsage().rss - before).toBeLessThan(48 * 1024 * 1024);
    const plain = await post('/v1/traces', Buffer.alloc(300 * 1024, 0x20), { 'content-type': 'application/json' });
    expect(plain.status).toBe(413);
  });

  it('answers 415 for other content types, 405 for other methods, 404 for other paths', async () => {
    expect((await post('/v1/traces', 'x', { 'content-type': 'text/plain' })).status).toBe(415);
    const get = await post('/v1/traces', '', {}, 'GET');
    expect([get.status, get.headers.allow]).toEqual([405, 'POST']);
    expect((await post('/v1/metrics', '{}', { 'content-type': 'application/json' })).status).toBe(404);
  });

  it('answers 503 with Retry-After when the pipeline refuses', async () => {
    answer = { status: 'refused', retryAfterMs: 2000, reason: 'JOURNAL_FULL' };
    const res = await post('/v1/traces', jsonBody(jsonSpan(T, 'EEE19B7EC3C1B174')), { 'content-type': 'application/json' });
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toBe('2');
    expect(JSON.parse(res.body.toString())).toMatchObject({ code: 14 });
    expect(counts).toContain('http:refused:JOURNAL_FULL:1');
  });
});

describe('OTLP/gRPC statuses', () => {
  const call = (body: Buffer): Promise<{ err: grpc.ServiceError | null; res?: Buffer }> => {
    const client = new grpc.Client(`127.0.0.1:${receiver.grpcPort()}`, grpc.credentials.createInsecure());
    return new Promise((resolve) => {
      client.makeUnaryRequest(
        '/opentelemetry.proto.collector.trace.v1.TraceService/Export',
        (b: Buffer) => b,
        (b: Buffer) => b,
        body,
        (err, res) => {
          client.close();
          resolve({ err, res });
        },
      );
    });
  };

  it('answers UNAVAILABLE with RetryInfo when the pipeline refuses', async () => {
    answer = { status: 'refused', retryAfterMs: 1500, reason: 'JOURNAL_FULL' };
    const req = otlpRoot().lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
    const body = Buffer.from(
      req
        .encode(req.fromObject({ resource_spans: [{ scope_spans: [{ spans: [{ trace_id: Buffer.alloc(16, 1), span_id: Buffer.alloc(8, 2), name: 'x' }] }] }] }))
        .finish(),
    );
    const { err } = await call(body);
    expect(err?.code).toBe(grpc.status.UNAVAILABLE);
    const details = err!.metadata.get('grpc-status-details-bin')[0] as Buffer;
    expect(decodeStatus(details)).toMatchObject({ code: 14, retryDelayMs: 1500 });
  });

  it('answers INVALID_ARGUMENT for undecodable messages and RESOURCE_EXHAUSTED above the cap', async () => {
    expect((await call(Buffer.from([0x0a, 0xff, 0xff]))).err?.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await call(Buffer.alloc(300 * 1024, 0))).err?.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
  });
});
