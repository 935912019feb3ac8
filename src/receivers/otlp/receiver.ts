import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import { createGunzip, createInflate } from 'node:zlib';
import * as grpc from '@grpc/grpc-js';
import type { Span } from '../../model/span';
import { bearerAuth } from '../../security/auth';
import type { Logger } from '../../telemetry/logger';
import { splitAddress } from '../../config/address';
import { LISTENERS } from '../../config/listeners';
import { boundPort, closeServer, listen, ListenError } from '../../telemetry/listen';
import { decodeJson, decodeProtobuf, DecodeError, encodeExportResponse, encodeStatus, type Decoded } from './decode';
import { extend } from '../../model/extend';

export type SpanSinkResult =
  /** `rejected` spans can never apply (e.g. after their episode closed): a partial success saying why. */
  { status: 'accepted'; rejected?: number; message?: string } | { status: 'refused'; retryAfterMs: number; reason: string };

export interface OtlpReceiverDeps {
  /** Acknowledge only after this resolves 'accepted'. */
  sink: (spans: Span[]) => SpanSinkResult | Promise<SpanSinkResult>;
  logger: Logger;
  /** Metrics hook: spans per transport by outcome and reason. */
  onSpans?: (transport: 'grpc' | 'http', outcome: 'accepted' | 'refused' | 'rejected', reason: string, count: number) => void;
}

export interface OtlpReceiverOptions {
  /** `host:port`; undefined turns the transport off. */
  grpcAddr?: string;
  httpAddr?: string;
  /** Cap on a request, counted after decompression (OTLP 1.11 recommends 64 MiB). */
  maxRequestBytes: number;
  /** Optional bearer token; compared in constant time. */
  authToken?: string;
}

// gRPC status codes used here.
const INVALID_ARGUMENT = 3;
const RESOURCE_EXHAUSTED = 8;
const UNAUTHENTICATED = 16;
const UNAVAILABLE = 14;
const INTERNAL = 13;

class TooLarge extends Error {}

/**
 * The OTLP trace receiver: gRPC `TraceService/Export` and HTTP `POST /v1/traces` (protobuf and
 * JSON on one port, gzip). Responses follow the OTLP spec: empty success, partial success for
 * individually invalid spans, 400/INVALID_ARGUMENT, 413/RESOURCE_EXHAUSTED, 415, 405, and
 * 503/UNAVAILABLE with Retry-After / RetryInfo when the pipeline refuses.
 */
export function createOtlpReceiver(options: OtlpReceiverOptions, deps: OtlpReceiverDeps) {
  const log = deps.logger.child('otlp');
  const count = (t: 'grpc' | 'http', outcome: 'accepted' | 'refused' | 'rejected', reason: string, n: number) => {
    if (n > 0) deps.onSpans?.(t, outcome, reason, n);
  };
  const authorized = bearerAuth(options.authToken);

  /** Decoded spans into the pipeline; the answer for both transports. */
  async function ingest(
    transport: 'grpc' | 'http',
    decoded: Decoded,
  ): Promise<{ ok: true; rejected: number; message: string } | { ok: false; retryAfterMs: number; reason: string }> {
    count(transport, 'rejected', 'invalid_span', decoded.rejected);
    // Why spans were rejected, each reason with its count: the pipeline's (late) first, then the decoder's.
    const reasons: string[] = [];
    let late = 0;
    if (decoded.spans.length > 0) {
      let result: SpanSinkResult;
      try {
        result = await deps.sink(decoded.spans);
      } catch (err) {
        log.once('sink_error', 'error', 'the pipeline failed to take spans; answering retryable', { err });
        result = { status: 'refused', retryAfterMs: 1000, reason: 'internal' };
      }
      if (result.status === 'refused') {
        count(transport, 'refused', result.reason, decoded.spans.length);
        log.once(`refused:${result.reason}`, 'warn', 'spans refused: the pipeline is full; clients are told to retry', { reason: result.reason });
        return { ok: false, retryAfterMs: result.retryAfterMs, reason: result.reason };
      }
      late = result.rejected ?? 0;
      count(transport, 'accepted', 'ok', decoded.spans.length - late);
      count(transport, 'rejected', 'not_applicable', late);
      if (late > 0) reasons.push(`${late} span(s) rejected: ${result.message ?? ''}`);
    }
    if (decoded.rejected > 0) reasons.push(`${decoded.rejected} span(s) rejected: ${decoded.rejectReason}`);
    return { ok: true, rejected: decoded.rejected + late, message: reasons.join('; ') };
  }

  // ---- HTTP -------------------------------------------------------------------------------
  const httpServer = http.createServer((req, res) => void handleHttp(req, res));
  httpServer.on('clientError', (_err, socket) => socket.destroy());

  async function handleHttp(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    if (path !== '/v1/traces') return plain(req, res, 404, 'not found; OTLP traces are POSTed to /v1/traces\n');
    if (req.method !== 'POST') return plain(req, res, 405, 'method not allowed; use POST\n', { allow: 'POST' });
    const type = (req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
    const json = type === 'application/json';
    if (!json && type !== 'application/x-protobuf') {
      count('http', 'rejected', 'content_type', 1);
      return plain(req, res, 415, 'unsupported content type; supported: [application/json, application/x-protobuf]\n');
    }
    const fail = (status: number, code: number, message: string, retryAfterMs?: number): void => {
      const headers: Record<string, string> = { 'content-type': json ? 'application/json' : 'application/x-protobuf' };
      if (retryAfterMs !== undefined) headers['retry-after'] = String(Math.max(1, Math.ceil(retryAfterMs / 1000)));
      const body = json
        ? Buffer.from(
            JSON.stringify({
              code,
              message,
              details: retryAfterMs === undefined ? [] : [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: `${retryAfterMs / 1000}s` }],
            }),
          )
        : Buffer.from(encodeStatus(code, message, retryAfterMs));
      res.writeHead(status, extend(headers, { 'content-length': String(body.length) })).end(body);
    };
    if (!authorized(req.headers.authorization)) {
      req.resume();
      return fail(401, UNAUTHENTICATED, 'missing or wrong bearer token');
    }
    const encoding = (req.headers['content-encoding'] ?? 'identity').trim().toLowerCase();
    if (!['identity', 'gzip', 'deflate', ''].includes(encoding)) {
      req.resume();
      return fail(400, INVALID_ARGUMENT, `unsupported content-encoding '${encoding}'; supported: gzip, deflate, identity`);
    }
    let body: Buffer;
    try {
      body = await readBody(req, encoding, options.maxRequestBytes);
    } catch (err) {
      if (err instanceof TooLarge) {
        count('http', 'rejected', 'too_large', 1);
        res.shouldKeepAlive = false;
        return fail(413, RESOURCE_EXHAUSTED, `request larger than ${options.maxRequestBytes} bytes after decompression`);
      }
      return fail(400, INVALID_ARGUMENT, `cannot read body: ${(err as Error).message}`);
    }
    let decoded: Decoded;
    try {
      decoded = json ? decodeJson(body.toString('utf8')) : decodeProtobuf(body);
    } catch (err) {
      count('http', 'rejected', 'undecodable', 1);
      return fail(400, INVALID_ARGUMENT, err instanceof DecodeError ? err.message : 'undecodable body');
    }
    const r = await ingest('http', decoded);
    if (!r.ok) return fail(503, UNAVAILABLE, `pipeline refused the spans (${r.reason}); retry later`, r.retryAfterMs);
    const ok = json
      ? Buffer.from(JSON.stringify(r.rejected > 0 ? { partialSuccess: { rejectedSpans: String(r.rejected), errorMessage: r.message } } : {}))
      : Buffer.from(encodeExportResponse(r.rejected, r.message));
    res.writeHead(200, { 'content-type': json ? 'application/json' : 'application/x-protobuf', 'content-length': String(ok.length) }).end(ok);
  }

  // ---- gRPC -------------------------------------------------------------------------------
  const grpcServer = new grpc.Server({
    'grpc.max_receive_message_length': options.maxRequestBytes,
    'grpc.max_send_message_length': 4 * 1024 * 1024,
  });
  const raw = (b: Buffer) => b;
  grpcServer.addService(
    {
      Export: {
        path: '/opentelemetry.proto.collector.trace.v1.TraceService/Export',
        requestStream: false,
        responseStream: false,
        requestSerialize: raw,
        requestDeserialize: raw,
        responseSerialize: raw,
        responseDeserialize: raw,
      },
    },
    {
      Export: (call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
        void (async () => {
          const auth = call.metadata.get('authorization')[0];
          if (!authorized(typeof auth === 'string' ? auth : undefined)) return callback({ code: UNAUTHENTICATED, details: 'missing or wrong bearer token' });
          let decoded: Decoded;
          try {
            decoded = decodeProtobuf(call.request);
          } catch (err) {
            count('grpc', 'rejected', 'undecodable', 1);
            return callback({ code: INVALID_ARGUMENT, details: (err as Error).message });
          }
          const r = await ingest('grpc', decoded);
          if (!r.ok) {
            const md = new grpc.Metadata();
            md.set('grpc-status-details-bin', Buffer.from(encodeStatus(UNAVAILABLE, `pipeline refused the spans (${r.reason}); retry later`, r.retryAfterMs)));
            return callback({ code: UNAVAILABLE, details: `pipeline refused the spans (${r.reason}); retry later`, metadata: md });
          }
          callback(null, Buffer.from(encodeExportResponse(r.rejected, r.message)));
        })().catch((err) => callback({ code: INTERNAL, details: String(err) }));
      },
    },
  );

  let shutdownP: Promise<void> | undefined;
  let grpcPort = 0;
  let grpcStarted = false;
  return {
    async start(): Promise<void> {
      if (options.httpAddr) await listen(httpServer, options.httpAddr, LISTENERS.otlpHttp);
      const grpcAddr = options.grpcAddr;
      if (grpcAddr) {
        const [host, port] = splitAddress(grpcAddr);
        grpcPort = await new Promise<number>((resolve, reject) =>
          grpcServer.bindAsync(`${host.includes(':') ? `[${host}]` : host}:${port}`, grpc.ServerCredentials.createInsecure(), (err, p) =>
            err ? reject(new ListenError(grpcAddr, LISTENERS.otlpGrpc, err)) : resolve(p),
          ),
        );
        grpcStarted = true;
      }
      log.info('listening', { grpc: options.grpcAddr ? `port ${grpcPort}` : 'off', http: options.httpAddr ? `port ${this.httpPort()}` : 'off' });
    },
    httpPort: (): number => boundPort(httpServer),
    grpcPort: (): number => grpcPort,
    shutdown(): Promise<void> {
      shutdownP ??= (async () => {
        await closeServer(httpServer, 2000);
        if (grpcStarted) {
          await new Promise<void>((r) => {
            const t = setTimeout(() => {
              grpcServer.forceShutdown();
              r();
            }, 2000);
            t.unref();
            grpcServer.tryShutdown(() => {
              clearTimeout(t);
              r();
            });
          });
        }
      })();
      return shutdownP;
    },
  };
}

export type OtlpReceiver = ReturnType<typeof createOtlpReceiver>;

/**
 * grpc-js writes its own lines to stderr (`E No address added…` when a port is taken), which would
 * break the one-JSON-object-a-line logs: they go to `logger` at debug instead (what failed is
 * reported by the receiver's own error). grpc-js has one logger per process: the command sets it.
 */
export function routeGrpcLogs(logger: Logger): void {
  const line = (...args: unknown[]): void => logger.debug(`grpc: ${args.map(String).join(' ')}`);
  grpc.setLogger({ error: line, info: line, debug: line });
}

function plain(req: IncomingMessage, res: ServerResponse, status: number, text: string, headers: Record<string, string> = {}): void {
  req.resume();
  res.writeHead(status, { 'content-type': 'text/plain', 'content-length': String(Buffer.byteLength(text)), ...headers }).end(text);
}

/**
 * Reads the body, inflating gzip/deflate as a stream, and stops as soon as either the raw or the
 * inflated bytes pass the cap: a gzip bomb never allocates past it.
 */
function readBody(req: IncomingMessage, encoding: string, max: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let size = 0;
    let done = false;
    const finish = (err: Error | null, value?: Buffer) => {
      if (done) return;
      done = true;
      if (err) {
        req.resume();
        reject(err);
      } else resolve(value!);
    };
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > max) return finish(new TooLarge());
    const source: NodeJS.ReadableStream = encoding === 'gzip' ? req.pipe(createGunzip()) : encoding === 'deflate' ? req.pipe(createInflate()) : req;
    let raw = 0;
    if (source !== req) {
      req.on('data', (c: Buffer) => {
        raw += c.length;
        if (raw > max) {
          (source as NodeJS.ReadWriteStream & { destroy(): void }).destroy();
          finish(new TooLarge());
        }
      });
    }
    source.on('data', (c: Buffer) => {
      size += c.length;
      if (size > max) {
        if (source !== req) (source as NodeJS.ReadWriteStream & { destroy(): void }).destroy();
        finish(new TooLarge());
        return;
      }
      parts.push(c);
    });
    source.on('end', () => finish(null, Buffer.concat(parts)));
    source.on('error', (err: Error) => finish(err));
    req.on('error', (err) => finish(err));
  });
}
