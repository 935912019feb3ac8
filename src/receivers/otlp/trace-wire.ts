import { isUtf8 } from 'node:buffer';
import type { Attributes, AttributeValue, Span, SpanEvent, SpanLink } from '../../model/span';

/**
 * A protobuf ExportTraceServiceRequest read straight off the wire into normalized spans: one pass
 * over the bytes, no message objects in between (docs/architecture.md says why).
 *
 * It reads as protobuf's rules say: fields in any order, repeated fields appended wherever they
 * occur, the last occurrence of a singular field wins (for a message too: it replaces, as
 * protobufjs does, rather than merging), and so does the last member of a oneof set. Unknown
 * fields, and known fields on a wire type their type does not use, are skipped. Strings must be
 * valid UTF-8. Whatever cannot be read (cut short, a bad wire type or varint, nesting past
 * `MAX_DEPTH`) throws a `WireError`.
 */
export class WireError extends Error {}

/** How many AnyValues deep (arrays and key-value lists in one another) a value may be: an attribute's own value is 1. */
export const MAX_DEPTH = 64;

const VARINT = 0;
const I64 = 1;
const LEN = 2;
const SGROUP = 3;
const EGROUP = 4;
const I32 = 5;

export interface WireDecoded {
  spans: Span[];
  rejected: number;
  rejectReason: string | null;
}

/** The reader: the request's bytes and where it is; `lo`/`hi` hold the last 64-bit varint or fixed64 read. */
class Reader {
  pos = 0;
  lo = 0;
  hi = 0;
  constructor(readonly b: Buffer) {}

  fail(what: string): never {
    throw new WireError(`${what} at byte ${this.pos}`);
  }

  /** A varint's low 32 bits (as an unsigned number); longer varints are read to their end. */
  u32(end: number): number {
    const b = this.b;
    let p = this.pos;
    let v = 0;
    let shift = 0;
    for (let i = 0; i < 10; i++) {
      if (p >= end) this.fail('a varint cut short');
      const c = b[p++];
      if (shift < 32) v += (c & 0x7f) * 2 ** shift;
      shift += 7;
      if (c < 0x80) {
        this.pos = p;
        return v % 0x100000000;
      }
    }
    return this.fail('a varint longer than 10 bytes');
  }

  /** A varint as two 32-bit halves in `lo` and `hi` (unsigned). */
  u64(end: number): void {
    const b = this.b;
    let p = this.pos;
    let lo = 0;
    let hi = 0;
    for (let i = 0; i < 10; i++) {
      if (p >= end) this.fail('a varint cut short');
      const c = b[p++] & 0x7f;
      const last = b[p - 1] < 0x80;
      if (i < 4) lo += c * 2 ** (7 * i);
      else if (i === 4) {
        lo += (c & 0x0f) * 2 ** 28;
        hi += c >>> 4;
      } else hi += c * 2 ** (7 * i - 32);
      if (last) {
        this.pos = p;
        this.lo = lo >>> 0;
        this.hi = (hi % 0x100000000) >>> 0;
        return;
      }
    }
    this.fail('a varint longer than 10 bytes');
  }

  /** A fixed64 as two 32-bit halves in `lo` and `hi`. */
  f64(end: number): void {
    if (this.pos + 8 > end) this.fail('a fixed64 cut short');
    this.lo = this.b.readUInt32LE(this.pos);
    this.hi = this.b.readUInt32LE(this.pos + 4);
    this.pos += 8;
  }

  f32(end: number): number {
    if (this.pos + 4 > end) this.fail('a fixed32 cut short');
    const v = this.b.readUInt32LE(this.pos);
    this.pos += 4;
    return v;
  }

  double(end: number): number {
    if (this.pos + 8 > end) this.fail('a double cut short');
    const v = this.b.readDoubleLE(this.pos);
    this.pos += 8;
    return v;
  }

  /** A length-delimited field's end; `pos` is at its first byte. */
  len(end: number): number {
    const n = this.u32(end);
    const to = this.pos + n;
    if (to > end) this.fail(`a field of ${n} bytes with ${end - this.pos} left`);
    return to;
  }

  str(end: number): string {
    const to = this.len(end);
    const from = this.pos;
    this.pos = to;
    return text(this.b, from, to, this);
  }

  /** Skips a field of this wire type (a group to its end). */
  skip(wire: number, field: number, end: number, depth = 0): void {
    switch (wire) {
      case VARINT:
        this.u32(end);
        return;
      case I64:
        if (this.pos + 8 > end) this.fail('a fixed64 cut short');
        this.pos += 8;
        return;
      case LEN:
        this.pos = this.len(end);
        return;
      case I32:
        if (this.pos + 4 > end) this.fail('a fixed32 cut short');
        this.pos += 4;
        return;
      case SGROUP: {
        if (depth >= MAX_DEPTH) this.fail('groups nested too deeply');
        for (;;) {
          const tag = this.u32(end);
          if ((tag & 7) === EGROUP) {
            if (tag >>> 3 !== field) this.fail(`a group of field ${field} ended as field ${tag >>> 3}`);
            return;
          }
          this.skip(tag & 7, tag >>> 3, end, depth + 1);
        }
      }
      default:
        this.fail(`wire type ${wire}`);
    }
  }
}

/** Bytes as a string, refused when they are not UTF-8 (a protobuf string must be). */
function text(b: Buffer, from: number, to: number, r: Reader): string {
  if (to - from <= 24) {
    let ascii = true;
    for (let i = from; i < to; i++)
      if (b[i] >= 0x80) {
        ascii = false;
        break;
      }
    if (ascii) return b.toString('latin1', from, to);
  }
  if (!isUtf8(b.subarray(from, to))) r.fail('a string that is not UTF-8');
  return b.toString('utf8', from, to);
}

/** A fixed64 of nanoseconds (in `lo`/`hi`) as a decimal string. */
function nanosOf(r: Reader): string {
  if (r.hi < 0x200000) return String(r.hi * 0x100000000 + r.lo);
  return ((BigInt(r.hi) << 32n) | BigInt(r.lo)).toString();
}

const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** An int64 (in `lo`/`hi`): a number when it is a safe integer, else its decimal string. */
function int64Of(r: Reader): number | string {
  const hi = r.hi | 0;
  if (hi >= -0x200000 && hi < 0x200000) {
    const n = hi * 0x100000000 + r.lo;
    if (Number.isSafeInteger(n)) return n;
  }
  const big = BigInt.asIntN(64, (BigInt(r.hi) << 32n) | BigInt(r.lo));
  return big >= MIN_SAFE && big <= MAX_SAFE ? Number(big) : big.toString();
}

/** Bytes of an id as lower-case hex; null when empty. */
function idOf(r: Reader, end: number): string | null {
  const to = r.len(end);
  const from = r.pos;
  r.pos = to;
  return to === from ? null : r.b.toString('hex', from, to);
}

function allZero(hex: string): boolean {
  for (let i = 0; i < hex.length; i++) if (hex.charCodeAt(i) !== 48) return false;
  return true;
}

/** Why a span's ids (lower-case hex, null when absent) cannot be taken, or null when they can (both OTLP decoders). */
export function idsProblem(traceId: string | null, spanId: string | null): string | null {
  if (traceId === null || traceId.length !== 32 || allZero(traceId)) return 'invalid trace id (must be 16 non-zero bytes)';
  if (spanId === null || spanId.length !== 16 || allZero(spanId)) return 'invalid span id (must be 8 non-zero bytes)';
  return null;
}

/** One KeyValue into `out` (a KeyValue without its key field is left out). */
function keyValue(r: Reader, end: number, out: Attributes, depth: number): void {
  let key: string | undefined;
  let value: AttributeValue = null;
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    if (f === 1 && w === LEN) key = r.str(end);
    else if (f === 2 && w === LEN) {
      const to = r.len(end);
      value = anyValue(r, to, depth + 1);
    } else r.skip(w, f, end);
  }
  if (key !== undefined) out[key] = value;
}

/** An attributes field's KeyValue (length-delimited, `pos` at its length) into `out`. */
function attribute(r: Reader, end: number, out: Attributes, depth: number): void {
  const to = r.len(end);
  keyValue(r, to, out, depth);
}

function anyValue(r: Reader, end: number, depth: number): AttributeValue {
  if (depth > MAX_DEPTH) r.fail('attribute values nested too deeply');
  let value: AttributeValue = null;
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    if (f === 1 && w === LEN) value = r.str(end);
    else if (f === 2 && w === VARINT) value = r.u32(end) !== 0;
    else if (f === 3 && w === VARINT) {
      r.u64(end);
      value = int64Of(r);
    } else if (f === 4 && w === I64) value = r.double(end);
    else if (f === 5 && w === LEN) {
      const to = r.len(end);
      const values: AttributeValue[] = [];
      while (r.pos < to) {
        const t = r.u32(to);
        if (t === ((1 << 3) | LEN)) {
          const vto = r.len(to);
          values.push(anyValue(r, vto, depth + 1));
        } else r.skip(t & 7, t >>> 3, to);
      }
      value = values;
    } else if (f === 6 && w === LEN) {
      const to = r.len(end);
      const values: Attributes = {};
      while (r.pos < to) {
        const t = r.u32(to);
        if (t === ((1 << 3) | LEN)) attribute(r, to, values, depth);
        else r.skip(t & 7, t >>> 3, to);
      }
      value = values;
    } else if (f === 7 && w === LEN) {
      const to = r.len(end);
      value = new Uint8Array(r.b.subarray(r.pos, to));
      r.pos = to;
    } else if (f === 8 && w === VARINT) {
      // string_value_strindex (profiles only): a member of the oneof this receiver does not read.
      r.u32(end);
      value = null;
    } else r.skip(w, f, end);
  }
  return value;
}

/** A span's event: time_unix_nano 1, name 2, attributes 3 (appended wherever they come). */
function eventOf(r: Reader, end: number): SpanEvent {
  let name = '';
  let time = '0';
  const attributes: Attributes = {};
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    if (f === 1 && w === I64) {
      r.f64(end);
      time = nanosOf(r);
    } else if (f === 2 && w === LEN) name = r.str(end);
    else if (f === 3 && w === LEN) attribute(r, end, attributes, 0);
    else r.skip(w, f, end);
  }
  return { name, timeUnixNano: time, attributes };
}

/** A span's link: trace_id 1, span_id 2, trace_state 3, attributes 4. */
function linkOf(r: Reader, end: number): SpanLink {
  let traceId: string | null = null;
  let spanId: string | null = null;
  let traceState = '';
  const attributes: Attributes = {};
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    if (f === 1 && w === LEN) traceId = idOf(r, end);
    else if (f === 2 && w === LEN) spanId = idOf(r, end);
    else if (f === 3 && w === LEN) traceState = r.str(end);
    else if (f === 4 && w === LEN) attribute(r, end, attributes, 0);
    else r.skip(w, f, end);
  }
  return { traceId: traceId ?? '', spanId: spanId ?? '', traceState, attributes };
}

function statusOf(r: Reader, end: number): { code: number; message: string } {
  let code = 0;
  let message = '';
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    if (f === 2 && w === LEN) message = r.str(end);
    else if (f === 3 && w === VARINT) code = r.u32(end) | 0;
    else r.skip(w, f, end);
  }
  return { code, message };
}

/** Where a span, read, goes: the request's spans, or its rejections. */
interface Sink {
  spans: Span[];
  rejected: number;
  rejectReason: string | null;
}

/** Each Span field's wire type, by field number (the dropped counts, 10, 12 and 14, are not read). */
const SPAN_WIRE: (number | undefined)[] = [];
for (const f of [1, 2, 3, 4, 5, 9, 11, 13, 15]) SPAN_WIRE[f] = LEN;
SPAN_WIRE[6] = VARINT;
SPAN_WIRE[7] = SPAN_WIRE[8] = I64;
SPAN_WIRE[16] = I32;

function span(r: Reader, end: number, resource: Attributes, scope: Span['scope'], sink: Sink): void {
  let traceId: string | null = null;
  let spanId: string | null = null;
  let parentSpanId: string | null = null;
  let traceState = '';
  let flags = 0;
  let name = '';
  let kind = 0;
  let start = '0';
  let endTime = '0';
  const attributes: Attributes = {};
  const events: SpanEvent[] = [];
  const links: SpanLink[] = [];
  let status = { code: 0, message: '' };
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    // A field on a wire type not its own is skipped, as an unknown one is.
    if (SPAN_WIRE[f] !== w) {
      r.skip(w, f, end);
      continue;
    }
    switch (f) {
      case 1:
        traceId = idOf(r, end);
        break;
      case 2:
        spanId = idOf(r, end);
        break;
      case 3:
        traceState = r.str(end);
        break;
      case 4:
        parentSpanId = idOf(r, end);
        break;
      case 5:
        name = r.str(end);
        break;
      case 6:
        kind = r.u32(end) | 0;
        break;
      case 7:
        r.f64(end);
        start = nanosOf(r);
        break;
      case 8:
        r.f64(end);
        endTime = nanosOf(r);
        break;
      case 9:
        attribute(r, end, attributes, 0);
        break;
      case 11:
        events.push(eventOf(r, r.len(end)));
        break;
      case 13:
        links.push(linkOf(r, r.len(end)));
        break;
      case 15:
        status = statusOf(r, r.len(end));
        break;
      case 16:
        flags = r.f32(end);
        break;
    }
  }
  const problem = idsProblem(traceId, spanId);
  if (problem !== null) {
    sink.rejected++;
    sink.rejectReason ??= problem;
    return;
  }
  sink.spans.push({
    traceId: traceId!,
    spanId: spanId!,
    parentSpanId: parentSpanId ?? '',
    traceState,
    flags,
    name,
    kind,
    startTimeUnixNano: start,
    endTimeUnixNano: endTime,
    attributes,
    events,
    links,
    status,
    resource,
    scope,
  });
}

/**
 * Where a message's length-delimited fields are: the last occurrence of `single` (a singular
 * message field; -1 for none) and every occurrence of `repeated`.
 */
function ranges(r: Reader, end: number, repeated: number, single = -1): { last: [number, number] | null; all: [number, number][] } {
  const all: [number, number][] = [];
  let last: [number, number] | null = null;
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    if (w === LEN && (f === single || f === repeated)) {
      const to = r.len(end);
      if (f === single) last = [r.pos, to];
      else all.push([r.pos, to]);
      r.pos = to;
    } else r.skip(w, f, end);
  }
  return { last, all };
}

/** An InstrumentationScope: name 1, version 2, attributes 3; absent, an empty one. */
function scopeOf(r: Reader, range: [number, number] | null): Span['scope'] {
  const scope = { name: '', version: '', attributes: {} as Attributes };
  if (range === null) return scope;
  r.pos = range[0];
  const end = range[1];
  while (r.pos < end) {
    const tag = r.u32(end);
    const f = tag >>> 3;
    const w = tag & 7;
    if (f === 1 && w === LEN) scope.name = r.str(end);
    else if (f === 2 && w === LEN) scope.version = r.str(end);
    else if (f === 3 && w === LEN) attribute(r, end, scope.attributes, 0);
    else r.skip(w, f, end);
  }
  return scope;
}

/** A Resource's attributes (field 1); absent, none. */
function resourceOf(r: Reader, range: [number, number] | null): Attributes {
  const out: Attributes = {};
  if (range === null) return out;
  r.pos = range[0];
  const end = range[1];
  while (r.pos < end) {
    const tag = r.u32(end);
    if (tag === ((1 << 3) | LEN)) attribute(r, end, out, 0);
    else r.skip(tag & 7, tag >>> 3, end);
  }
  return out;
}

/**
 * The spans of an ExportTraceServiceRequest, normalized (see `Span`); spans without a valid
 * trace or span id are counted as rejected, with the first reason.
 */
export function decodeTraceRequest(bytes: Uint8Array): WireDecoded {
  const b = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const r = new Reader(b);
  const sink: Sink = { spans: [], rejected: 0, rejectReason: null };
  // ExportTraceServiceRequest: resource_spans = 1.
  for (const [from, to] of ranges(r, b.length, 1).all) {
    // ResourceSpans: resource = 1 (read first: its spans share it, wherever it comes), scope_spans = 2.
    r.pos = from;
    const rs = ranges(r, to, 2, 1);
    const resource = resourceOf(r, rs.last);
    for (const [sFrom, sTo] of rs.all) {
      // ScopeSpans: scope = 1, spans = 2.
      r.pos = sFrom;
      const ss = ranges(r, sTo, 2, 1);
      const scope = scopeOf(r, ss.last);
      for (const [from2, to2] of ss.all) {
        r.pos = from2;
        span(r, to2, resource, scope, sink);
      }
    }
  }
  return sink;
}
