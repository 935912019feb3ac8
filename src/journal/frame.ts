import { crc32 } from '../formats/crc32';

/**
 * On-disk framing of one journal record:
 *   u32 BE payload length | u32 BE CRC-32 of (offset bytes + payload) | u64 BE offset | payload
 * The offset is inside the checksum, so a frame copied to the wrong place is detected too.
 */
export const HEADER_BYTES = 16;
export const MAX_FRAME_PAYLOAD = 256 * 1024 * 1024;

export type DecodeResult =
  | { kind: 'frame'; offset: number; payload: Buffer; next: number }
  /** Not enough bytes for a whole frame: a torn write at the end. */
  | { kind: 'torn' }
  /** Bytes that are not a valid frame. */
  | { kind: 'corrupt'; reason: string };

export function decodeFrame(buf: Buffer, at: number): DecodeResult {
  if (buf.length - at < HEADER_BYTES) return { kind: 'torn' };
  const length = buf.readUInt32BE(at);
  if (length > MAX_FRAME_PAYLOAD) return { kind: 'corrupt', reason: `frame length ${length} is implausible` };
  if (buf.length - at < HEADER_BYTES + length) return { kind: 'torn' };
  const expected = buf.readUInt32BE(at + 4);
  const body = buf.subarray(at + 8, at + HEADER_BYTES + length);
  if (crc32(body) !== expected) return { kind: 'corrupt', reason: 'checksum mismatch' };
  return {
    kind: 'frame',
    offset: Number(buf.readBigUInt64BE(at + 8)),
    payload: buf.subarray(at + HEADER_BYTES, at + HEADER_BYTES + length),
    next: at + HEADER_BYTES + length,
  };
}

/** The 16-byte header of a frame whose payload is `parts` (CRC computed over them in place). */
export function frameHeader(offset: number, parts: readonly Buffer[], payloadBytes: number): Buffer {
  const header = Buffer.allocUnsafe(HEADER_BYTES);
  header.writeUInt32BE(payloadBytes, 0);
  writeU64(header, offset, 8);
  let crc = crc32(header.subarray(8));
  for (const p of parts) crc = crc32(p, crc);
  header.writeUInt32BE(crc, 4);
  return header;
}

/**
 * Body frames carry raw bytes of a proxied call:
 *   u8 0x00 (records are JSON and start with `{`) | u8 kind | u64 BE call id | bytes
 * Kinds: 1 request and 2 response as exchanged with the model server; 3 and 4 the request and
 * response as the agent sent and received them, when they differ (translated calls); 5 and 6 a
 * part of a request or response that repeats bytes already in the journal (an agent resends its
 * history): instead of the bytes, where they are, as extents (see `encodeExtents`).
 */
import type { BodyKind } from '../model/records';

export type { BodyKind };
const KIND_CODE: Record<BodyKind, number> = { request: 1, response: 2, agent_request: 3, agent_response: 4 };
const REF_CODE: Partial<Record<BodyKind, number>> = { request: 5, response: 6 };
const KIND_OF: BodyKind[] = ['request', 'request', 'response', 'agent_request', 'agent_response', 'request', 'response'];
export const BODY_HEADER_BYTES = 10;

export function bodyHeader(callId: number, kind: BodyKind, ref = false): Buffer {
  const code = ref ? REF_CODE[kind] : KIND_CODE[kind];
  if (code === undefined) throw new Error(`journal: no reference frames for ${kind} bodies`);
  const h = Buffer.allocUnsafe(BODY_HEADER_BYTES);
  h[0] = 0;
  h[1] = code;
  writeU64(h, callId, 2);
  return h;
}

/** Whether a body frame's payload holds extents rather than bytes. */
export function isRefPayload(payload: Buffer): boolean {
  return payload[1] === 5 || payload[1] === 6;
}

/**
 * Extents are flat triples: (offset of a body frame that holds bytes, start within its bytes,
 * length). Encoded as 16 bytes each: u32 BE high and low halves of the offset, u32 start, u32 length.
 */
export const EXTENT_BYTES = 16;

export function encodeExtents(extents: readonly number[]): Buffer {
  const out = Buffer.allocUnsafe((extents.length / 3) * EXTENT_BYTES);
  for (let i = 0, at = 0; i < extents.length; i += 3, at += EXTENT_BYTES) {
    out.writeUInt32BE(Math.floor(extents[i] / 0x1_0000_0000), at);
    out.writeUInt32BE(extents[i] % 0x1_0000_0000, at + 4);
    out.writeUInt32BE(extents[i + 1], at + 8);
    out.writeUInt32BE(extents[i + 2], at + 12);
  }
  return out;
}

export function decodeExtents(bytes: Buffer): number[] {
  if (bytes.length % EXTENT_BYTES !== 0) throw new Error(`journal: a reference frame of ${bytes.length} bytes is not whole extents`);
  const out: number[] = [];
  for (let at = 0; at < bytes.length; at += EXTENT_BYTES)
    out.push(bytes.readUInt32BE(at) * 0x1_0000_0000 + bytes.readUInt32BE(at + 4), bytes.readUInt32BE(at + 8), bytes.readUInt32BE(at + 12));
  return out;
}

export function isBodyPayload(payload: Buffer): boolean {
  return payload.length >= BODY_HEADER_BYTES && payload[0] === 0;
}

/** The call id and kind of a body frame's payload. */
export function readBodyHeader(payload: Buffer): { callId: number; kind: BodyKind } {
  return { callId: Number(payload.readBigUInt64BE(2)), kind: KIND_OF[payload[1]] ?? 'response' };
}

/** A safe integer as u64 BE (two u32 writes; no BigInt on the hot path). */
function writeU64(buf: Buffer, n: number, at: number): void {
  buf.writeUInt32BE(Math.floor(n / 0x1_0000_0000), at);
  buf.writeUInt32BE(n % 0x1_0000_0000, at + 4);
}
