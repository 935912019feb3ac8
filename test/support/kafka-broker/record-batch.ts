import { gunzipSync } from 'node:zlib';
import { Reader } from './codec';
import { crc32c } from './crc32c';

/** The header fields of a v2 record batch the broker needs. */
export interface BatchHeader {
  /** Bytes of this batch within the record set. */
  length: number;
  magic: number;
  crcOk: boolean;
  attributes: number;
  lastOffsetDelta: number;
  firstTimestamp: bigint;
  producerId: bigint;
  producerEpoch: number;
  baseSequence: number;
  count: number;
}

export interface StoredRecord {
  offset: number;
  timestamp: number;
  key: Buffer | null;
  value: Buffer | null;
  headers: Record<string, string>;
}

const HEADER_BYTES = 61;

/** Splits a record set into batches (a produce request may carry several). */
export function splitBatches(set: Buffer): { header: BatchHeader; bytes: Buffer }[] {
  const out: { header: BatchHeader; bytes: Buffer }[] = [];
  let at = 0;
  while (at + 12 <= set.length) {
    const batchLength = set.readInt32BE(at + 8);
    const end = at + 12 + batchLength;
    if (batchLength < HEADER_BYTES - 12 || end > set.length) break;
    const bytes = set.subarray(at, end);
    out.push({ header: readHeader(bytes), bytes });
    at = end;
  }
  return out;
}

export function readHeader(b: Buffer): BatchHeader {
  return {
    length: b.length,
    magic: b.readInt8(16),
    crcOk: b.readUInt32BE(17) === crc32c(b.subarray(21)),
    attributes: b.readInt16BE(21),
    lastOffsetDelta: b.readInt32BE(23),
    firstTimestamp: b.readBigInt64BE(27),
    producerId: b.readBigInt64BE(43),
    producerEpoch: b.readInt16BE(51),
    baseSequence: b.readInt32BE(53),
    count: b.readInt32BE(57),
  };
}

/** A copy of the batch with its base offset set (the offset is outside the CRC). */
export function withBaseOffset(b: Buffer, baseOffset: number): Buffer {
  const copy = Buffer.from(b);
  copy.writeBigInt64BE(BigInt(baseOffset), 0);
  return copy;
}

/** Decodes the records of a stored batch (gzip or uncompressed). */
export function decodeRecords(b: Buffer): StoredRecord[] {
  const h = readHeader(b);
  const baseOffset = Number(b.readBigInt64BE(0));
  const codec = h.attributes & 0x07;
  let body = b.subarray(HEADER_BYTES);
  if (codec === 1) body = gunzipSync(body);
  else if (codec !== 0) throw new Error(`test broker: compression codec ${codec} is not supported`);
  const r = new Reader(body);
  const out: StoredRecord[] = [];
  for (let i = 0; i < h.count; i++) {
    r.varint(); // record length
    r.int8(); // attributes
    const timestampDelta = r.varlong();
    const offsetDelta = r.varint();
    const key = r.varBytes();
    const value = r.varBytes();
    const headers: Record<string, string> = {};
    const n = r.varint();
    for (let j = 0; j < n; j++) {
      const k = r.varBytes()!.toString('utf8');
      headers[k] = r.varBytes()?.toString('utf8') ?? '';
    }
    out.push({ offset: baseOffset + offsetDelta, timestamp: Number(h.firstTimestamp + timestampDelta), key, value, headers });
  }
  return out;
}
