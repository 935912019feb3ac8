import { crc32 } from 'node:zlib';

/**
 * On-disk framing of one journal record:
 *   u32 BE payload length | u32 BE CRC-32 of (offset bytes + payload) | u64 BE offset | payload
 * The offset is inside the checksum, so a frame copied to the wrong place is detected too.
 */
export const HEADER_BYTES = 16;
export const MAX_FRAME_PAYLOAD = 256 * 1024 * 1024;

export function encodeFrame(offset: number, payload: Buffer): Buffer {
  const frame = Buffer.allocUnsafe(HEADER_BYTES + payload.length);
  frame.writeUInt32BE(payload.length, 0);
  frame.writeBigUInt64BE(BigInt(offset), 8);
  payload.copy(frame, HEADER_BYTES);
  frame.writeUInt32BE(crc32(frame.subarray(8)), 4);
  return frame;
}

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
  return { kind: 'frame', offset: Number(buf.readBigUInt64BE(at + 8)), payload: buf.subarray(at + HEADER_BYTES, at + HEADER_BYTES + length), next: at + HEADER_BYTES + length };
}
