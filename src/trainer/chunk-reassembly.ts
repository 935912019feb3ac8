import { createHash } from 'node:crypto';
import type { Position } from './groups';

/** Kafka message headers as kafkajs hands them over. */
export type MessageHeaders = Record<string, Buffer | string | (Buffer | string)[] | undefined>;

/** The chunk headers of docs/kafka-records.md. */
export const CHUNK_HEADERS = {
  version: 'lightning-chunk',
  recordId: 'lightning-record-id',
  index: 'lightning-chunk-index',
  count: 'lightning-chunk-count',
  bytes: 'lightning-record-bytes',
  sha256: 'lightning-record-sha256',
} as const;

export function headerValue(headers: MessageHeaders | undefined, name: string): string | undefined {
  const v = headers?.[name];
  const one = Array.isArray(v) ? v[0] : v;
  return one === undefined ? undefined : one.toString();
}

/** A whole record: a message that was not chunked, or the chunks of one put back together. */
export interface WholeRecord {
  value: Buffer;
  headers: MessageHeaders;
  /** Where the record starts: its first chunk (what a commit must not pass while it is pending). */
  pos: Position;
  chunks: number;
}

export type ChunkOutcome =
  | { kind: 'record'; record: WholeRecord }
  | { kind: 'pending'; recordId: string; have: number; count: number }
  | { kind: 'duplicate'; recordId: string; index: number }
  | { kind: 'invalid'; recordId: string | null; reason: string };

export interface IncompleteRecord {
  recordId: string;
  topic: string;
  partition: number;
  have: number;
  count: number;
  waitedMs: number;
  /** `timeout`, or `evicted` when the bytes held reached `maxBytes`. */
  reason: 'timeout' | 'evicted';
}

interface Assembly {
  recordId: string;
  sha256: string;
  count: number;
  bytes: number;
  parts: (Buffer | undefined)[];
  have: number;
  held: number;
  headers: MessageHeaders;
  /** The lowest offset among its chunks, and the partition they are on. */
  first: Position;
  firstSeen: number;
}

export interface ChunkReassemblerOptions {
  /** A record still missing chunks this long after its first one is dropped as incomplete. */
  timeoutMs: number;
  /** Bytes of chunks held at most; beyond, the oldest records being assembled are dropped. */
  maxBytes: number;
}

/**
 * Reassembles chunked Kafka records (docs/kafka-records.md): chunks are collected under
 * (record id, SHA-256) per partition, in any interleaving with other records; an index already
 * held is a redelivery and ignored; a complete record must have the announced size and digest.
 * `lowestPending` names, per partition, the first chunk of every record still being assembled,
 * so offsets are never committed past it. Pure: time comes in as `now`.
 */
export class ChunkReassembler {
  private assemblies = new Map<string, Assembly>();
  private heldBytes = 0;
  private evicted: IncompleteRecord[] = [];

  constructor(private readonly options: ChunkReassemblerOptions) {}

  add(pos: Position, headers: MessageHeaders | undefined, value: Buffer | null, now: number): ChunkOutcome {
    const h = headers ?? {};
    const bytes = value ?? Buffer.alloc(0);
    const version = headerValue(h, CHUNK_HEADERS.version);
    if (version === undefined) return { kind: 'record', record: { value: bytes, headers: h, pos, chunks: 1 } };
    const recordId = headerValue(h, CHUNK_HEADERS.recordId) ?? null;
    if (version !== 'v1') return { kind: 'invalid', recordId, reason: `unsupported chunk format '${version}'` };
    const index = decimal(headerValue(h, CHUNK_HEADERS.index));
    const count = decimal(headerValue(h, CHUNK_HEADERS.count));
    const total = decimal(headerValue(h, CHUNK_HEADERS.bytes));
    const sha256 = headerValue(h, CHUNK_HEADERS.sha256);
    if (!recordId) return { kind: 'invalid', recordId, reason: `no ${CHUNK_HEADERS.recordId} header` };
    if (count === null || count < 2) return { kind: 'invalid', recordId, reason: `${CHUNK_HEADERS.count} must be a whole number ≥ 2` };
    if (index === null || index >= count) return { kind: 'invalid', recordId, reason: `${CHUNK_HEADERS.index} must be 0…${count - 1}` };
    if (total === null) return { kind: 'invalid', recordId, reason: `${CHUNK_HEADERS.bytes} must be a whole number` };
    if (!sha256 || !/^[0-9a-f]{64}$/.test(sha256)) return { kind: 'invalid', recordId, reason: `${CHUNK_HEADERS.sha256} must be 64 lower-case hex digits` };

    const key = `${pos.topic}\u0000${pos.partition}\u0000${recordId}\u0000${sha256}`;
    let a = this.assemblies.get(key);
    if (a && (a.count !== count || a.bytes !== total))
      return { kind: 'invalid', recordId, reason: 'chunk count or record size differs from earlier chunks of the same record' };
    if (!a) {
      a = { recordId, sha256, count, bytes: total, parts: new Array(count), have: 0, held: 0, headers: h, first: pos, firstSeen: now };
      this.assemblies.set(key, a);
    }
    if (a.parts[index] !== undefined) return { kind: 'duplicate', recordId, index };
    a.parts[index] = bytes;
    a.have++;
    a.held += bytes.length;
    this.heldBytes += bytes.length;
    if (pos.offset < a.first.offset) a.first = pos;
    if (index === 0) a.headers = h;
    if (a.have < a.count) {
      this.evictBeyondCap(key, now);
      return { kind: 'pending', recordId, have: a.have, count: a.count };
    }
    this.remove(key, a);
    const whole = Buffer.concat(a.parts as Buffer[]);
    if (whole.length !== a.bytes) return { kind: 'invalid', recordId, reason: `reassembled ${whole.length} bytes, ${CHUNK_HEADERS.bytes} says ${a.bytes}` };
    if (createHash('sha256').update(whole).digest('hex') !== a.sha256)
      return { kind: 'invalid', recordId, reason: 'reassembled bytes do not match their SHA-256' };
    return { kind: 'record', record: { value: whole, headers: withoutChunkHeaders(a.headers), pos: a.first, chunks: a.count } };
  }

  /** Drops records whose first chunk came `timeoutMs` or more ago. */
  tick(now: number): IncompleteRecord[] {
    const out: IncompleteRecord[] = [];
    for (const [key, a] of this.assemblies) {
      if (now - a.firstSeen < this.options.timeoutMs) continue;
      this.remove(key, a);
      out.push(this.describe(a, now, 'timeout'));
    }
    return out;
  }

  /** Records dropped because the byte cap was reached since the last call (reported once). */
  takeEvicted(): IncompleteRecord[] {
    const out = this.evicted;
    this.evicted = [];
    return out;
  }

  /** Per `topic\0partition`, the lowest offset of a chunk of a record still being assembled. */
  /** Forgets every record in chunks (a rebalance: they are read again from the committed offsets). */
  reset(): void {
    this.assemblies.clear();
    this.heldBytes = 0;
    this.evicted = [];
  }

  lowestPending(): Map<string, number> {
    const low = new Map<string, number>();
    for (const a of this.assemblies.values()) {
      const k = `${a.first.topic}\u0000${a.first.partition}`;
      low.set(k, Math.min(low.get(k) ?? Infinity, a.first.offset));
    }
    return low;
  }

  get pendingRecords(): number {
    return this.assemblies.size;
  }

  get pendingBytes(): number {
    return this.heldBytes;
  }

  private evictBeyondCap(keep: string, now: number): void {
    for (const [key, a] of this.assemblies) {
      if (this.heldBytes <= this.options.maxBytes) return;
      if (key === keep) continue;
      this.remove(key, a);
      this.evicted.push(this.describe(a, now, 'evicted'));
    }
  }

  private remove(key: string, a: Assembly): void {
    this.assemblies.delete(key);
    this.heldBytes -= a.held;
  }

  private describe(a: Assembly, now: number, reason: IncompleteRecord['reason']): IncompleteRecord {
    return { recordId: a.recordId, topic: a.first.topic, partition: a.first.partition, have: a.have, count: a.count, waitedMs: now - a.firstSeen, reason };
  }
}

function decimal(s: string | undefined): number | null {
  return s !== undefined && /^\d{1,15}$/.test(s) ? Number(s) : null;
}

function withoutChunkHeaders(headers: MessageHeaders): MessageHeaders {
  const out: MessageHeaders = {};
  const chunk = new Set<string>(Object.values(CHUNK_HEADERS));
  for (const [k, v] of Object.entries(headers)) if (!chunk.has(k)) out[k] = v;
  return out;
}
