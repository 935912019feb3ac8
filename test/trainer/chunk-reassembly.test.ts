import { createHash, randomBytes } from 'node:crypto';
import { ChunkReassembler, type ChunkOutcome, type MessageHeaders } from '../../src/trainer/chunk-reassembly';

interface Msg {
  headers: MessageHeaders;
  value: Buffer;
}

/** Splits a value as docs/kafka-records.md says a producer does: equal chunks, the last one shorter. */
function chunk(recordId: string, value: Buffer, size: number, extra: MessageHeaders = {}): Msg[] {
  const count = Math.ceil(value.length / size);
  const sha = createHash('sha256').update(value).digest('hex');
  return Array.from({ length: count }, (_, i) => ({
    value: value.subarray(i * size, Math.min((i + 1) * size, value.length)),
    headers: {
      'content-type': Buffer.from('application/json'),
      ...extra,
      'lightning-chunk': Buffer.from('v1'),
      'lightning-record-id': Buffer.from(recordId),
      'lightning-chunk-index': Buffer.from(String(i)),
      'lightning-chunk-count': Buffer.from(String(count)),
      'lightning-record-bytes': Buffer.from(String(value.length)),
      'lightning-record-sha256': Buffer.from(sha),
    },
  }));
}

const TOPIC = 'lightning.transitions';

function feed(r: ChunkReassembler, msgs: Msg[], start = 0, now = 0, partition = 0): ChunkOutcome[] {
  return msgs.map((m, i) => r.add({ topic: TOPIC, partition, offset: start + i }, m.headers, m.value, now));
}

const records = (outs: ChunkOutcome[]) => outs.flatMap((o) => (o.kind === 'record' ? [o.record] : []));

describe('ChunkReassembler', () => {
  const options = { timeoutMs: 1000, maxBytes: 1 << 20 };

  it('passes a message without chunk headers through as a whole record at its own offset', () => {
    const r = new ChunkReassembler(options);
    const out = r.add({ topic: TOPIC, partition: 2, offset: 41 }, { 'content-type': 'application/json' }, Buffer.from('{"a":1}'), 0);
    expect(out).toEqual({
      kind: 'record',
      record: { value: Buffer.from('{"a":1}'), headers: { 'content-type': 'application/json' }, pos: { topic: TOPIC, partition: 2, offset: 41 }, chunks: 1 },
    });
    expect(r.pendingRecords).toBe(0);
  });

  it('reassembles a record from chunks interleaved with other records, and keeps the first chunk as its position', () => {
    const r = new ChunkReassembler(options);
    const a = randomBytes(2500);
    const b = randomBytes(1800);
    const ca = chunk('r-1/0/0', a, 1000, { 'rollout-id': 'r-1' });
    const cb = chunk('r-2/0/0', b, 1000);
    const whole = { headers: { 'content-type': Buffer.from('application/json') }, value: Buffer.from('{}') };
    const order = [ca[0], cb[0], whole, ca[1], cb[1], ca[2]];
    const out = feed(r, order, 100);
    expect(out.map((o) => o.kind)).toEqual(['pending', 'pending', 'record', 'pending', 'record', 'record']);
    const [w, rb, ra] = records(out);
    expect(w.pos.offset).toBe(102);
    expect(rb.value.equals(b)).toBe(true);
    expect(rb.pos.offset).toBe(101);
    expect(ra.value.equals(a)).toBe(true);
    expect(ra.pos.offset).toBe(100);
    expect(ra.chunks).toBe(3);
    // The reassembled record carries the record's own headers, not the chunk bookkeeping.
    expect(Object.keys(ra.headers).sort()).toEqual(['content-type', 'rollout-id']);
  });

  it('reassembles chunks that arrive out of index order', () => {
    const r = new ChunkReassembler(options);
    const v = randomBytes(3001);
    const c = chunk('x', v, 1000);
    const out = feed(r, [c[3], c[1], c[0], c[2]]);
    expect(records(out)[0].value.equals(v)).toBe(true);
  });

  it('ignores a chunk whose index it already holds (redelivery) and completes from a resent copy after a producer restart', () => {
    const r = new ChunkReassembler(options);
    const v = randomBytes(2500);
    const c = chunk('r-3/0/1', v, 1000);
    // The producer died after two chunks, then sent the whole record again.
    const out = feed(r, [c[0], c[1], c[0], c[1], c[2]], 10);
    expect(out.map((o) => o.kind)).toEqual(['pending', 'pending', 'duplicate', 'duplicate', 'record']);
    const [rec] = records(out);
    expect(rec.value.equals(v)).toBe(true);
    expect(rec.pos.offset).toBe(10);
  });

  it('refuses a record whose bytes do not match the announced SHA-256, or whose size differs', () => {
    const r = new ChunkReassembler(options);
    const v = randomBytes(2000);
    const c = chunk('bad', v, 1000);
    c[1] = { ...c[1], value: randomBytes(1000) };
    const out = feed(r, c);
    expect(out[1]).toEqual({ kind: 'invalid', recordId: 'bad', reason: 'reassembled bytes do not match their SHA-256' });

    const short = chunk('short', v, 1000);
    short[1] = { ...short[1], value: short[1].value.subarray(0, 999) };
    expect(feed(r, short)[1]).toMatchObject({ kind: 'invalid', reason: 'reassembled 1999 bytes, lightning-record-bytes says 2000' });
    expect(r.pendingRecords).toBe(0);
  });

  it('refuses chunks with missing or malformed headers, naming the header', () => {
    const r = new ChunkReassembler(options);
    const [c0] = chunk('h', randomBytes(2000), 1000);
    const without = (name: string) => Object.fromEntries(Object.entries(c0.headers).filter(([k]) => k !== name));
    const at = { topic: TOPIC, partition: 0, offset: 0 };
    expect(r.add(at, without('lightning-record-id'), c0.value, 0)).toMatchObject({ kind: 'invalid', reason: 'no lightning-record-id header' });
    expect(r.add(at, { ...c0.headers, 'lightning-chunk-count': Buffer.from('1') }, c0.value, 0)).toMatchObject({
      kind: 'invalid',
      reason: expect.stringContaining('lightning-chunk-count'),
    });
    expect(r.add(at, { ...c0.headers, 'lightning-chunk-index': Buffer.from('2') }, c0.value, 0)).toMatchObject({
      kind: 'invalid',
      reason: expect.stringContaining('lightning-chunk-index'),
    });
    expect(r.add(at, { ...c0.headers, 'lightning-record-sha256': Buffer.from('ABC') }, c0.value, 0)).toMatchObject({
      kind: 'invalid',
      reason: expect.stringContaining('sha256'),
    });
    expect(r.add(at, { ...c0.headers, 'lightning-chunk': Buffer.from('v2') }, c0.value, 0)).toMatchObject({
      kind: 'invalid',
      reason: "unsupported chunk format 'v2'",
    });
    expect(r.pendingRecords).toBe(0);
  });

  it('keeps two copies with the same id but different bytes apart (collected by id and digest)', () => {
    const r = new ChunkReassembler(options);
    const v1 = randomBytes(2000);
    const v2 = randomBytes(2000);
    const a = chunk('same', v1, 1000);
    const b = chunk('same', v2, 1000);
    const out = feed(r, [a[0], b[0], b[1], a[1]]);
    expect(records(out).map((x) => x.value)).toEqual([v2, v1]);
  });

  it('reports a record still missing chunks after the timeout as incomplete, drops it, and reassembles it anew when it is sent again', () => {
    const r = new ChunkReassembler(options);
    const v = randomBytes(3000);
    const c = chunk('late', v, 1000);
    feed(r, [c[0], c[1]], 5, 0);
    expect(r.tick(999)).toEqual([]);
    expect(r.tick(1000)).toEqual([{ recordId: 'late', topic: TOPIC, partition: 0, have: 2, count: 3, waitedMs: 1000, reason: 'timeout' }]);
    expect(r.pendingRecords).toBe(0);
    expect(r.pendingBytes).toBe(0);
    const again = feed(r, c, 20, 2000);
    expect(records(again)[0].value.equals(v)).toBe(true);
  });

  it('names, per partition, the first chunk of every record still being assembled as the lowest offset to keep', () => {
    const r = new ChunkReassembler(options);
    const a = chunk('a', randomBytes(2000), 1000);
    const b = chunk('b', randomBytes(2000), 1000);
    r.add({ topic: TOPIC, partition: 0, offset: 7 }, a[0].headers, a[0].value, 0);
    r.add({ topic: TOPIC, partition: 1, offset: 3 }, b[0].headers, b[0].value, 0);
    expect(r.lowestPending()).toEqual(
      new Map([
        [`${TOPIC}\u00000`, 7],
        [`${TOPIC}\u00001`, 3],
      ]),
    );
    r.add({ topic: TOPIC, partition: 0, offset: 9 }, a[1].headers, a[1].value, 0);
    expect(r.lowestPending()).toEqual(new Map([[`${TOPIC}\u00001`, 3]]));
  });

  it('bounds the bytes it holds: beyond maxBytes the oldest records being assembled are dropped and reported once', () => {
    const r = new ChunkReassembler({ timeoutMs: 1000, maxBytes: 2500 });
    const a = chunk('old', randomBytes(3000), 1000);
    const b = chunk('new', randomBytes(3000), 1000);
    feed(r, [a[0], a[1]], 0, 0);
    expect(r.pendingBytes).toBe(2000);
    feed(r, [b[0]], 2, 50);
    expect(r.pendingBytes).toBe(1000);
    expect(r.takeEvicted()).toEqual([{ recordId: 'old', topic: TOPIC, partition: 0, have: 2, count: 3, waitedMs: 50, reason: 'evicted' }]);
    expect(r.takeEvicted()).toEqual([]);
    expect(r.lowestPending()).toEqual(new Map([[`${TOPIC}\u00000`, 2]]));
  });
});
