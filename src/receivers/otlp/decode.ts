import path from 'node:path';
import protobuf from 'protobufjs';
import type { Attributes, AttributeValue, Span, SpanEvent, SpanLink } from '../../model/span';
import { decodeTraceRequest, idsProblem, WireError } from './trace-wire';

let root: protobuf.Root | null = null;

/** The OTLP trace subset and google.rpc types, from proto/ (written from the spec's field table). */
export function otlpRoot(): protobuf.Root {
  if (root) return root;
  const r = new protobuf.Root();
  const base = path.resolve(__dirname, '../../../proto');
  r.resolvePath = (_origin, target) => path.join(base, target);
  r.loadSync(['opentelemetry/proto/collector/trace/v1/trace_service.proto', 'google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
  root = r;
  return r;
}

const type = (name: string) => otlpRoot().lookupType(name);

export class DecodeError extends Error {
  readonly code = 'OTLP_UNDECODABLE';
}

export interface Decoded {
  spans: Span[];
  rejected: number;
  /** Why spans were rejected (first reason), for partial_success.error_message. */
  rejectReason: string | null;
}

/**
 * Decodes a protobuf ExportTraceServiceRequest straight from its bytes (`trace-wire.ts`). Throws
 * DecodeError for bytes that are not one.
 */
export function decodeProtobuf(bytes: Uint8Array): Decoded {
  try {
    return decodeTraceRequest(bytes);
  } catch (err) {
    if (err instanceof WireError) throw new DecodeError(`not an ExportTraceServiceRequest: ${err.message}`);
    if (err instanceof RangeError) throw new DecodeError('request nested too deeply');
    throw err;
  }
}

/** Decodes OTLP/JSON: lowerCamelCase keys, hex ids, integer enums, int64 as string or number; unknown fields ignored. */
export function decodeJson(text: string): Decoded {
  let obj: unknown;
  try {
    obj = JSON.parse(text);
  } catch (err) {
    throw new DecodeError(`body is not JSON: ${(err as Error).message}`);
  }
  if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) throw new DecodeError('body is not a JSON object');
  return guarded(obj as Record<string, unknown>, true);
}

type Obj = Record<string, unknown>;

function field(o: Obj, snake: string, json: boolean): unknown {
  return o[json ? camel(snake) : snake];
}

const camelCache = new Map<string, string>();
function camel(s: string): string {
  let c = camelCache.get(s);
  if (c === undefined) {
    c = s.replace(/_([a-z])/g, (_, x: string) => x.toUpperCase());
    camelCache.set(s, c);
  }
  return c;
}

/**
 * A repeated message field. An element that is not an object makes the whole request
 * undecodable (OTLP/HTTP answers 400), as a protobuf JSON parser would refuse it; dropping such
 * elements would acknowledge spans that were never read.
 */
function list(v: unknown, where: string): Obj[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new DecodeError(`${where} must be an array`);
  v.forEach((x, i) => {
    if (typeof x !== 'object' || x === null || Array.isArray(x)) throw new DecodeError(`${where}[${i}] must be an object`);
  });
  return v as Obj[];
}

/** A singular message field: absent or null reads as empty, anything but an object is undecodable. */
function message(v: unknown, where: string): Obj {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) throw new DecodeError(`${where} must be an object`);
  return v as Obj;
}

/**
 * Runs the normalization of OTLP/JSON, or of protobufjs' `toObject` copy of a decoded request
 * (`json` false: snake_case keys, bytes as bytes; the reference the wire decoder is tested
 * against). Nesting deep enough to exhaust the stack is an undecodable request too.
 */
export function guarded(req: Obj, json: boolean): Decoded {
  try {
    return normalize(req, json);
  } catch (err) {
    if (err instanceof RangeError) throw new DecodeError('request nested too deeply');
    throw err;
  }
}

function normalize(req: Obj, json: boolean): Decoded {
  const spans: Span[] = [];
  let rejected = 0;
  let rejectReason: string | null = null;
  for (const rs of list(field(req, 'resource_spans', json), 'resourceSpans')) {
    const resourceObj = message(field(rs, 'resource', json), 'resource');
    const resource = attributes(field(resourceObj, 'attributes', json), json);
    for (const ss of list(field(rs, 'scope_spans', json), 'scopeSpans')) {
      const scopeObj = message(field(ss, 'scope', json), 'scope');
      const scope = { name: strOf(scopeObj.name), version: strOf(scopeObj.version), attributes: attributes(field(scopeObj, 'attributes', json), json) };
      for (const s of list(field(ss, 'spans', json), 'spans')) {
        const traceId = id(field(s, 'trace_id', json), json);
        const spanId = id(field(s, 'span_id', json), json);
        const problem = idsProblem(traceId, spanId);
        if (problem) {
          rejected++;
          rejectReason ??= problem;
          continue;
        }
        const status = message(field(s, 'status', json), 'status');
        spans.push({
          traceId: traceId!,
          spanId: spanId!,
          parentSpanId: id(field(s, 'parent_span_id', json), json) ?? '',
          traceState: strOf(field(s, 'trace_state', json)),
          flags: intOf(s.flags) >>> 0,
          name: strOf(s.name),
          kind: intOf(s.kind),
          startTimeUnixNano: nanos(field(s, 'start_time_unix_nano', json)),
          endTimeUnixNano: nanos(field(s, 'end_time_unix_nano', json)),
          attributes: attributes(s.attributes, json),
          events: list(s.events, 'events').map((e): SpanEvent => ({
            name: strOf(e.name),
            timeUnixNano: nanos(field(e, 'time_unix_nano', json)),
            attributes: attributes(e.attributes, json),
          })),
          links: list(s.links, 'links').map((l): SpanLink => ({
            traceId: id(field(l, 'trace_id', json), json) ?? '',
            spanId: id(field(l, 'span_id', json), json) ?? '',
            traceState: strOf(field(l, 'trace_state', json)),
            attributes: attributes(l.attributes, json),
          })),
          status: { code: intOf(status.code), message: strOf(status.message) },
          resource,
          scope,
        });
      }
    }
  }
  return { spans, rejected, rejectReason };
}

function strOf(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

function intOf(v: unknown): number {
  const n = typeof v === 'number' ? v : typeof v === 'string' ? Number(v) : 0;
  return Number.isInteger(n) ? n : 0;
}

/** fixed64 nanoseconds as a decimal string (JSON may send a number or a string). */
function nanos(v: unknown): string {
  if (typeof v === 'string' && /^\d+$/.test(v)) return v.replace(/^0+(?=\d)/, '');
  if (typeof v === 'number' && Number.isFinite(v) && v >= 0) return BigInt(Math.trunc(v)).toString();
  return '0';
}

/** Ids: raw bytes in protobuf, case-insensitive hex in OTLP/JSON. Returned lower-case hex; null when malformed. */
function id(v: unknown, json: boolean): string | null {
  if (v === undefined || v === null || v === '') return null;
  if (json) return typeof v === 'string' && /^[0-9a-fA-F]*$/.test(v) && v.length % 2 === 0 ? v.toLowerCase() : null;
  if (v instanceof Uint8Array) return v.length === 0 ? null : Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('hex');
  return null;
}

function attributes(v: unknown, json: boolean): Attributes {
  const out: Attributes = {};
  for (const kv of list(v, 'attributes')) {
    const key = kv.key;
    if (typeof key !== 'string') continue;
    out[key] = anyValue(kv.value, json);
  }
  return out;
}

function anyValue(v: unknown, json: boolean): AttributeValue {
  if (v === undefined || v === null) return null;
  const o = message(v, 'AnyValue');
  const get = (k: string) => field(o, k, json);
  if (get('string_value') !== undefined) return strOf(get('string_value'));
  if (get('bool_value') !== undefined) return get('bool_value') === true;
  if (get('int_value') !== undefined) return int64(get('int_value'));
  if (get('double_value') !== undefined) {
    const d = get('double_value');
    return typeof d === 'number' ? d : typeof d === 'string' ? Number(d) : null;
  }
  if (get('array_value') !== undefined) return list(message(get('array_value'), 'arrayValue').values, 'arrayValue.values').map((x) => anyValue(x, json));
  if (get('kvlist_value') !== undefined) return attributes(message(get('kvlist_value'), 'kvlistValue').values, json);
  if (get('bytes_value') !== undefined) {
    const b = get('bytes_value');
    if (b instanceof Uint8Array) return new Uint8Array(b);
    return typeof b === 'string' ? new Uint8Array(Buffer.from(b, 'base64')) : null;
  }
  return null;
}

/** int64: a number when it is a safe integer, else its decimal string. */
function int64(v: unknown): number | string | null {
  const s = typeof v === 'number' ? (Number.isInteger(v) ? String(v) : null) : typeof v === 'string' && /^-?\d+$/.test(v) ? v : null;
  if (s === null) return null;
  const n = Number(s);
  return Number.isSafeInteger(n) ? n : BigInt(s).toString();
}

/** Encodes the responses this receiver sends, in protobuf. */
export function encodeExportResponse(rejected: number, message: string): Uint8Array {
  const t = type('opentelemetry.proto.collector.trace.v1.ExportTraceServiceResponse');
  if (rejected === 0 && message === '') return t.encode(t.create({})).finish();
  return t.encode(t.fromObject({ partial_success: { rejected_spans: rejected, error_message: message } })).finish();
}

export function encodeStatus(code: number, message: string, retryAfterMs?: number): Uint8Array {
  const t = type('google.rpc.Status');
  const details =
    retryAfterMs === undefined
      ? []
      : [
          {
            type_url: 'type.googleapis.com/google.rpc.RetryInfo',
            value: type('google.rpc.RetryInfo')
              .encode(
                type('google.rpc.RetryInfo').fromObject({ retry_delay: { seconds: Math.floor(retryAfterMs / 1000), nanos: (retryAfterMs % 1000) * 1e6 } }),
              )
              .finish(),
          },
        ];
  return t.encode(t.fromObject({ code, message, details })).finish();
}

export function decodeStatus(bytes: Uint8Array): { code: number; message: string; retryDelayMs: number | null } {
  const t = type('google.rpc.Status');
  const s = t.toObject(t.decode(bytes), { longs: Number, defaults: true }) as {
    code: number;
    message: string;
    details: { type_url: string; value: Uint8Array }[];
  };
  const retry = s.details.find((d) => d.type_url.endsWith('google.rpc.RetryInfo'));
  let retryDelayMs: number | null = null;
  if (retry) {
    const ri = type('google.rpc.RetryInfo');
    const r = ri.toObject(ri.decode(retry.value), { longs: Number, defaults: true }) as { retry_delay: { seconds: number; nanos: number } };
    retryDelayMs = r.retry_delay.seconds * 1000 + Math.round(r.retry_delay.nanos / 1e6);
  }
  return { code: s.code, message: s.message, retryDelayMs };
}
