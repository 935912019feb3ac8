/**
 * The receiver-independent form of one OTLP span, as both OTLP decoders (protobuf and JSON)
 * produce it and as the span processors (tool spans, reward spans, attribution) consume it.
 *
 * Ids are lower-case hex (trace 32 chars, span 16 chars). Times are nanoseconds since the epoch
 * as decimal strings (int64 does not fit a JS number). Attribute values keep their OTLP kind:
 * int64 becomes a number when it is a safe integer, otherwise its decimal string; bytes stay bytes.
 */
export type AttributeValue = string | number | boolean | Uint8Array | null | AttributeValue[] | { [key: string]: AttributeValue };

export type Attributes = Record<string, AttributeValue>;

/** OTLP Span.SpanKind numbering. */
export const SpanKind = {
  UNSPECIFIED: 0,
  INTERNAL: 1,
  SERVER: 2,
  CLIENT: 3,
  PRODUCER: 4,
  CONSUMER: 5,
} as const;

/** OTLP Status.StatusCode numbering. */
export const StatusCode = {
  UNSET: 0,
  OK: 1,
  ERROR: 2,
} as const;

export interface SpanEvent {
  name: string;
  timeUnixNano: string;
  attributes: Attributes;
}

export interface SpanLink {
  traceId: string;
  spanId: string;
  traceState: string;
  attributes: Attributes;
}

export interface Span {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  traceState: string;
  /** W3C trace flags in bits 0-7, HAS_IS_REMOTE 0x100, IS_REMOTE 0x200. */
  flags: number;
  name: string;
  kind: number;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: Attributes;
  events: SpanEvent[];
  links: SpanLink[];
  status: { code: number; message: string };
  resource: Attributes;
  scope: { name: string; version: string; attributes: Attributes };
}
