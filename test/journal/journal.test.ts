import { appendFileSync, mkdtempSync, readdirSync, readFileSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Journal, type JournalOptions } from '../../src/journal/journal';
import { RefusedError } from '../../src/model/component';
import { silentLogger } from '../../src/telemetry/logger';

const tmp = () => mkdtempSync(path.join(os.tmpdir(), 'lightning-journal-'));
const opts = (dir: string, extra: Partial<JournalOptions> = {}): JournalOptions => ({
  dir,
  fsync: 'never',
  maxBytes: 1 << 20,
  segmentBytes: 1024,
  highWatermark: 1,
  ...extra,
});

async function reopen(dir: string, extra: Partial<JournalOptions> = {}) {
  const seen: [number, string][] = [];
  const j = new Journal(opts(dir, extra), silentLogger);
  const report = await j.open((offset, payload) => seen.push([offset, payload.toString()]));
  return { j, seen, report };
}

describe('journal', () => {
  it('replays every acknowledged record in offset order after a restart, across segments', async () => {
    const dir = tmp();
    const { j } = await reopen(dir);
    const acks: number[] = [];
    for (let i = 0; i < 100; i++) acks.push(await j.append(Buffer.from(`record-${i}-${'x'.repeat(40)}`)).durable);
    expect(acks).toEqual(Array.from({ length: 100 }, (_, i) => i));
    expect(j.segmentCount).toBeGreaterThan(3);
    await j.close();
    const { j: j2, seen, report } = await reopen(dir);
    expect(seen.map(([o]) => o)).toEqual(acks);
    expect(seen[42][1]).toBe(`record-42-${'x'.repeat(40)}`);
    expect(report).toMatchObject({ records: 100, tornTails: 0, corruptTails: 0 });
    expect(j2.append(Buffer.from('next')).offset).toBe(100);
    await j2.close();
  });

  it('replays a segment larger than its read window, with frames across window edges and one larger than a window', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { maxBytes: 256 << 20, segmentBytes: 128 << 20 });
    // ~20 MiB of frames of uneven sizes (so window edges fall inside frames), one of 9 MiB among them.
    const sizes: number[] = [];
    for (let i = 0; i < 400; i++) sizes.push(i === 150 ? 9 << 20 : 20_000 + ((i * 7919) % 60_000));
    for (const [i, n] of sizes.entries()) j.append(Buffer.alloc(n, String.fromCharCode(97 + (i % 26))));
    await j.append(Buffer.from('last')).durable;
    await j.close();
    expect(j.segmentCount).toBe(1);
    const { j: j2, seen, report } = await reopen(dir, { maxBytes: 256 << 20, segmentBytes: 128 << 20 });
    expect(report).toMatchObject({ records: 401, tornTails: 0, corruptTails: 0, corruptSegments: 0 });
    expect(seen.map(([, p]) => p.length)).toEqual([...sizes, 4]);
    expect(seen.every(([o, p], i) => o === i && (i === 400 ? p === 'last' : p === String.fromCharCode(97 + (i % 26)).repeat(sizes[i])))).toBe(true);
    await j2.close();
  });

  it('tells the replay after each segment it has read', async () => {
    const dir = tmp();
    const { j } = await reopen(dir);
    for (let i = 0; i < 100; i++) await j.append(Buffer.from(`record-${i}-${'x'.repeat(40)}`)).durable;
    const segments = j.segmentCount;
    await j.close();
    expect(segments).toBeGreaterThan(3);
    const events: string[] = [];
    const j2 = new Journal(opts(dir), silentLogger);
    await j2.open(
      (offset) => events.push(`r${offset}`),
      () => events.push('segment'),
    );
    expect(events.filter((e) => e === 'segment')).toHaveLength(segments);
    expect(events.at(-1)).toBe('segment');
    expect(events.indexOf('segment')).toBeGreaterThan(0);
    await j2.close();
  });

  it('assigns offsets synchronously, in call order, and group-commits one tick of appends', async () => {
    const { j } = await reopen(tmp(), { fsync: 'always' });
    const a = j.append(Buffer.from('a'));
    const b = j.append(Buffer.from('b'));
    expect([a.offset, b.offset]).toEqual([0, 1]);
    expect(await Promise.all([a.durable, b.durable])).toEqual([0, 1]);
    await j.close();
  });

  it('truncates a torn tail, sets its bytes aside, and keeps every whole record', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 1 << 20 });
    for (let i = 0; i < 5; i++) await j.append(Buffer.from(`r${i}`)).durable;
    await j.close();
    const seg = path.join(
      dir,
      readdirSync(dir).find((f) => f.endsWith('.seg'))!,
    );
    const whole = statSync(seg).size;
    truncateSync(seg, whole - 3); // the last frame lost its end: a write torn by a crash
    const { j: j2, seen, report } = await reopen(dir, { segmentBytes: 1 << 20 });
    expect(seen.map(([, p]) => p)).toEqual(['r0', 'r1', 'r2', 'r3']);
    expect(report.tornTails).toBe(1);
    expect(report.quarantined).toHaveLength(1);
    expect(statSync(seg).size).toBeLessThan(whole - 3);
    // New appends continue after the last whole record and survive the next restart.
    await j2.append(Buffer.from('r4-again')).durable;
    await j2.close();
    const { seen: seen3 } = await reopen(dir, { segmentBytes: 1 << 20 });
    expect(seen3.map(([, p]) => p)).toEqual(['r0', 'r1', 'r2', 'r3', 'r4-again']);
  });

  it('detects a corrupt record by its checksum and never crash-loops on it', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 1 << 20 });
    for (let i = 0; i < 3; i++) await j.append(Buffer.from(`payload-${i}`)).durable;
    await j.close();
    const seg = path.join(
      dir,
      readdirSync(dir).find((f) => f.endsWith('.seg'))!,
    );
    const bytes = readFileSync(seg);
    bytes[bytes.length - 2] ^= 0xff; // flip a bit inside the last payload
    writeFileSync(seg, bytes);
    appendFileSync(seg, Buffer.from('garbage after'));
    for (let round = 0; round < 2; round++) {
      const { j: again, seen, report } = await reopen(dir, { segmentBytes: 1 << 20 });
      expect(seen.map(([, p]) => p)).toEqual(['payload-0', 'payload-1']);
      expect(report.corruptTails).toBe(round === 0 ? 1 : 0);
      await again.close();
    }
  });

  it('sets aside the rest of a corrupt segment in the middle and reads the segments after it', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 64 });
    for (let i = 0; i < 12; i++) await j.append(Buffer.from(`p${i}-${'y'.repeat(30)}`)).durable;
    await j.close();
    const segs = readdirSync(dir)
      .filter((f) => f.endsWith('.seg'))
      .sort();
    expect(segs.length).toBeGreaterThan(3);
    const mid = path.join(dir, segs[1]);
    const b = readFileSync(mid);
    b[20] ^= 0x01;
    writeFileSync(mid, b);
    const { j: again, seen, report } = await reopen(dir, { segmentBytes: 64 });
    expect(report.corruptSegments).toBe(1);
    expect(seen.length).toBeLessThan(12);
    expect(seen[seen.length - 1][1]).toMatch(/^p11-/);
    await again.close();
  });

  it('refuses appends above the high watermark with a retryable error, and takes them again after release', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { maxBytes: 2000, highWatermark: 0.5, segmentBytes: 200 });
    const offsets: number[] = [];
    let refused: unknown = null;
    try {
      for (let i = 0; i < 100; i++) offsets.push(await j.append(Buffer.from('z'.repeat(50))).durable);
    } catch (err) {
      refused = err;
    }
    expect(refused).toBeInstanceOf(RefusedError);
    expect(refused).toMatchObject({ code: 'JOURNAL_FULL', retryAfterMs: 1000 });
    expect(j.full).toBe(true);
    expect(j.writable()).toContain('high watermark');
    const removed = await j.release(offsets[offsets.length - 1]);
    expect(removed).toBeGreaterThan(0);
    expect(j.full).toBe(false);
    await j.append(Buffer.from('fits again')).durable;
    await j.close();
  });

  it('never deletes the active segment, so offsets stay monotonic across restarts', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 64 });
    for (let i = 0; i < 10; i++) await j.append(Buffer.from(`q${i}-${'w'.repeat(40)}`)).durable;
    await j.release(Number.MAX_SAFE_INTEGER);
    expect(j.segmentCount).toBe(1);
    await j.close();
    const { j: j2 } = await reopen(dir, { segmentBytes: 64 });
    expect(j2.append(Buffer.from('after')).offset).toBe(10);
    await j2.close();
  });
});

describe('journal body frames', () => {
  it('reads bodies back by frame offset, before and after a restart, and forgets released segments', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 4096 });
    const start = j.append(Buffer.from('{"type":"call_start"}')).offset;
    const parts = [Buffer.from('{"messages":'), Buffer.from('[1,2,3]'), Buffer.alloc(5000, 0x20), Buffer.from('}')];
    const frames = parts.map((p) => j.appendBody(start, 'request', p));
    // Bytes are in the kernel once flushNow returns: readable at once.
    j.flushNow();
    expect(j.readBodies(frames).toString()).toBe(Buffer.concat(parts).toString());
    expect(j.readBodies([frames[1]], Buffer.alloc(64)).toString()).toBe('[1,2,3]');
    for (let i = 0; i < 5; i++) j.append(Buffer.from(`{"filler":${i}}`));
    await j.append(Buffer.from('{"last":true}')).durable;
    await j.close();

    const seen: number[] = [];
    const j2 = new Journal(opts(dir, { segmentBytes: 4096 }), silentLogger);
    await j2.open((offset) => seen.push(offset));
    // Body frames are replayed too (the pipeline recovers calls cut by a kill from them).
    expect(seen.slice(0, 5)).toEqual([start, ...frames]);
    expect(j2.readBodies(frames.slice(0, 2)).toString()).toBe('{"messages":[1,2,3]');
    await j2.release(j2.next);
    expect(() => j2.readBodies(frames)).toThrow(/not in the journal/);
    await j2.close();
  });

  it('reads a body of many frames between other frames (a streamed answer among others) as the same bytes, near or far apart', async () => {
    const dir = tmp();
    // Nothing kept in memory: every read goes to the file.
    const { j } = await reopen(dir, { segmentBytes: 1 << 20, maxBytes: 8 << 20, cacheBytes: 0 });
    const a = j.append(Buffer.from('{"type":"call_start","n":1}')).offset;
    const b = j.append(Buffer.from('{"type":"call_start","n":2}')).offset;
    const mine: number[] = [];
    const expected: Buffer[] = [];
    for (let i = 0; i < 60; i++) {
      // One frame bigger than those kept in memory: read from the file at the range's position.
      const chunk = i === 30 ? Buffer.alloc(100_000, 'z') : Buffer.from(`data: {"i":${i}}\n\n`);
      expected.push(chunk);
      mine.push(j.appendBody(a, 'response', chunk));
      // Another call's frames in between: small ones, and now and then one bigger than a run's gap.
      j.appendBody(b, 'response', Buffer.alloc(i % 20 === 19 ? 40_000 : 100, 0x61 + (i % 26)));
      if (i % 7 === 0) j.flushNow();
    }
    j.flushNow();
    expect(j.readBodies(mine).toString()).toBe(Buffer.concat(expected).toString());
    expect(j.readBodies(mine, Buffer.alloc(4096)).toString()).toBe(Buffer.concat(expected).toString());
    expect(j.readBodies([mine[3], mine[40]]).toString()).toBe(expected[3].toString() + expected[40].toString());
    // Ranges: in one frame, across small frames, into, across and out of the big one, to the end.
    const whole = Buffer.concat(expected);
    const big = expected.slice(0, 30).reduce((n, c) => n + c.length, 0);
    for (const [a, b] of [
      [3, 9],
      [5, 400],
      [big - 7, big + 5],
      [big + 10, big + 20],
      [big + 99_990, big + 100_030],
      [big - 100, whole.length + 50],
    ]) {
      expect(j.readBodyRange(mine, a, b).toString()).toBe(whole.subarray(a, b).toString());
      expect(j.readBodyRange(mine, a, b, Buffer.alloc(200_000)).toString()).toBe(whole.subarray(a, b).toString());
    }
    await j.close();
  });

  it('reads the newest body frames from memory, even before their batch is written, and older ones from the file', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 1 << 20, maxBytes: 8 << 20, cacheBytes: 1300 });
    const call = j.append(Buffer.from('{"type":"call_start"}')).offset;
    const old = j.appendBody(call, 'request', Buffer.alloc(600, 'o'), Infinity);
    // Pushes `old` out of memory (600 + 600 + 600 bytes > 1300).
    j.appendBody(call, 'request', Buffer.alloc(600, 'x'), Infinity);
    const recent = j.appendBody(call, 'response', [Buffer.alloc(300, 'r'), Buffer.alloc(300, 's')], Infinity);
    // Not kept: read from the file.
    const unkept = j.appendBody(call, 'response', Buffer.from('plain'));
    // Queued, not yet written: readable all the same (an episode may be built before the write).
    expect(j.readBodies([recent]).toString()).toBe('r'.repeat(300) + 's'.repeat(300));
    j.flushNow();
    // The file's bytes change under the journal: what is read from memory does not.
    const file = path.join(dir, readdirSync(dir)[0]);
    writeFileSync(
      file,
      readFileSync(file, 'latin1')
        .replace(/o{600}/, 'O'.repeat(600))
        .replace(/r{300}/, 'R'.repeat(300)),
      'latin1',
    );
    expect(j.readBodies([recent]).toString()).toBe('r'.repeat(300) + 's'.repeat(300));
    expect(j.readBodies([old]).toString()).toBe('O'.repeat(600));
    // Read from the file once, it is kept in memory too: changing the file again changes nothing.
    writeFileSync(file, readFileSync(file, 'latin1').replace(/O{600}/, 'P'.repeat(600)), 'latin1');
    // A range across the parts of a frame kept in memory.
    expect(j.readBodies([old, recent], Buffer.alloc(2000)).toString()).toBe('O'.repeat(600) + 'r'.repeat(300) + 's'.repeat(300));
    expect(() => j.readBodies([j.appendBody(call, 'response', Buffer.from('queued, not kept'))])).toThrow(/not in the journal/);
    expect(j.readBodies([unkept]).toString()).toBe('plain');
    await j.close();
  });

  it('does not read from memory what a failed write lost, nor what a released segment held', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 256, maxBytes: 8 << 20 });
    const call = j.append(Buffer.from('{"type":"call_start"}')).offset;
    const kept = j.appendBody(call, 'request', Buffer.from('{"kept":true}'), Infinity);
    j.flushNow();
    const internals = j as unknown as { fd: number | null };
    const fd = internals.fd;
    internals.fd = 1 << 20;
    const lost = j.appendBody(call, 'response', Buffer.from('{"lost":true}'), Infinity);
    j.flushNow();
    internals.fd = fd;
    expect(j.writeFailures).toBe(1);
    expect(() => j.readBodies([lost])).toThrow(/not in the journal/);
    expect(j.readBodies([kept]).toString()).toBe('{"kept":true}');
    for (let i = 0; i < 5; i++) await j.append(Buffer.from(`{"filler":"${'z'.repeat(300)}"}`)).durable;
    await j.release(j.next);
    expect(() => j.readBodies([kept])).toThrow(/not in the journal/);
    await j.close();
  });

  it('runs what waits for a write once the batch of its turn is written, all of it, in one write', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 1 << 20 });
    const order: string[] = [];
    // Nothing queued: at once.
    j.afterWrite(() => order.push('idle'));
    expect(order).toEqual(['idle']);
    const sizes: number[] = [];
    const file = () => statSync(path.join(dir, readdirSync(dir)[0])).size;
    for (const name of ['a', 'b', 'c']) {
      j.append(Buffer.from(`{"call":"${name}"}`));
      j.afterWrite(() => {
        sizes.push(file());
        order.push(name);
        if (name === 'b') throw new Error('one caller fails');
      });
    }
    expect(order).toEqual(['idle']);
    await new Promise((r) => setImmediate(r));
    expect(order).toEqual(['idle', 'a', 'b', 'c']);
    // The three records were in the file before any of them was told, written together.
    expect(new Set(sizes).size).toBe(1);
    expect(sizes[0]).toBe(file());
    await j.close();
  });

  it('hands what waits for the next write in right before it: in that write, lazily, and at close', async () => {
    const dir = tmp();
    const { j } = await reopen(dir, { segmentBytes: 1 << 20 });
    const file = () => statSync(path.join(dir, readdirSync(dir)[0])).size;
    const frames: number[] = [];
    // A callback that fails does not keep the others from appending.
    j.beforeWrite(() => {
      throw new Error('one caller fails');
    });
    j.beforeWrite(() => frames.push(j.appendBody(0, 'response', [Buffer.from('one'), Buffer.from('two')])));
    // It does not call for a write of its own: nothing is in the file yet, and nothing waits to be
    // written through (afterWrite still waits for it, as for anything queued).
    expect(file()).toBe(0);
    let told = false;
    j.afterWrite(() => (told = true));
    expect(told).toBe(false);
    await new Promise((r) => setImmediate(r));
    expect(told).toBe(true);
    expect(frames).toHaveLength(1);
    expect(j.readBodies(frames).toString()).toBe('onetwo');
    // Alone, it is written within the lazy window.
    j.beforeWrite(() => frames.push(j.appendBody(0, 'response', Buffer.from('three'))));
    const before = file();
    await new Promise((r) => setTimeout(r, 60));
    expect(file()).toBeGreaterThan(before);
    // At close, before appends are refused.
    j.beforeWrite(() => frames.push(j.appendBody(0, 'response', Buffer.from('four'))));
    await j.close();
    const { j: j2 } = await reopen(dir, { segmentBytes: 1 << 20 });
    expect(j2.readBodies(frames).toString()).toBe('onetwothreefour');
    await j2.close();
  });
});
