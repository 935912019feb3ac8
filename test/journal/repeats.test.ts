import { mkdtempSync, readdirSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Journal, type JournalOptions } from '../../src/journal/journal';
import { BaseStore, BLOCK, BodyWriter, sameBytes, slice, toDigests, type BodyBase } from '../../src/journal/repeats';
import { silentLogger } from '../../src/telemetry/logger';

const tmp = () => mkdtempSync(path.join(os.tmpdir(), 'lightning-repeats-'));

async function open(dir: string, extra: Partial<JournalOptions> = {}): Promise<Journal> {
  const j = new Journal({ dir, fsync: 'never', maxBytes: 1 << 30, segmentBytes: 64 << 20, highWatermark: 1, ...extra }, silentLogger);
  await j.open(() => {});
  return j;
}

/** A small deterministic generator, so a failure can be replayed. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 0x1_0000_0000;
  };
}

function text(random: () => number, bytes: number): string {
  const words = ['alpha', 'beta', 'gamma', 'delta', 'def', 'return', 'x = y + 1', '\\n', 'tool', 'result'];
  let out = '';
  while (out.length < bytes) out += words[Math.floor(random() * words.length)] + ' ';
  return out.slice(0, bytes);
}

/** Cuts `bytes` into chunks of random sizes (1 byte to 40 KiB), as a socket may deliver them. */
function chunks(random: () => number, bytes: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < bytes.length;) {
    const n = Math.max(1, Math.floor(random() ** 3 * 40 * 1024));
    out.push(bytes.subarray(at, at + n));
    at += n;
  }
  return out;
}

/** Writes one body through a writer; returns its frames and what it leaves as the next base. */
function writeBody(
  j: Journal,
  callId: number,
  kind: 'request' | 'response',
  base: BodyBase | null,
  parts: Buffer[],
  flushEach = false,
): { frames: number[]; base: BodyBase | null } {
  const w = new BodyWriter(j, callId, kind, base);
  const frames: number[] = [];
  for (const p of parts) {
    w.write(p, frames);
    if (flushEach) w.flush(frames);
  }
  w.flush(frames);
  return { frames, base: w.result() };
}

const journalBytes = (dir: string) => readdirSync(dir).reduce((n, f) => n + statSync(path.join(dir, f)).size, 0);

describe('bodies that repeat the previous call of their rollout', () => {
  it('journals each growing request as what it adds, and reads every one back byte for byte however its bytes arrive', async () => {
    const dir = tmp();
    const j = await open(dir);
    const random = rng(7);
    const messages: { role: string; content: string }[] = [{ role: 'system', content: 'You are a coding agent.' }];
    const sent: [number[], Buffer][] = [];
    let base: BodyBase | null = null;
    let total = 0;
    for (let turn = 0; turn < 14; turn++) {
      messages.push({ role: turn === 0 ? 'user' : 'tool', content: text(random, 12 * 1024 + Math.floor(random() * 9000)) });
      const body = Buffer.from(JSON.stringify({ model: 'm', messages, max_tokens: 64 }));
      total += body.length;
      const w = writeBody(j, 1000 + turn, 'request', base, chunks(random, body));
      base = w.base;
      sent.push([w.frames, body]);
      messages.push({ role: 'assistant', content: text(random, 300) });
    }
    /**
     * A range of a body reads as those bytes of it, from memory and (after a restart) from the
     * files, wherever it starts and ends: in a frame, on a frame's edge, past the body's end.
     */
    const checkRanges = (journal: Journal): void => {
      for (const [frames, body] of sent) {
        const ranges: [number, number][] = [
          [0, body.length],
          [0, 0],
          [body.length - 1, body.length + 10],
          [body.length, body.length + 1],
        ];
        for (let k = 0; k < 12; k++) {
          const a = Math.floor(random() * body.length);
          ranges.push([a, a + Math.floor(random() * (body.length - a + 1))]);
        }
        for (const [a, b] of ranges) {
          const got = journal.readBodyRange(frames, a, b);
          if (!got.equals(body.subarray(a, b))) throw new Error(`range [${a}, ${b}) of a ${body.length}-byte body: ${got.length} bytes, not its own`);
          expect(journal.readBodyRange(frames, a, b, Buffer.alloc(body.length)).equals(got)).toBe(true);
        }
      }
    };
    j.flushNow();
    for (const [frames, body] of sent) expect(j.readBodies(frames).equals(body)).toBe(true);
    checkRanges(j);
    // Each request repeats the one before, so the journal holds a small part of what was sent.
    expect(journalBytes(dir)).toBeLessThan(total * 0.4);
    await j.close();
    // After a restart the reference frames are read from the segment files.
    const again = await open(dir);
    for (const [frames, body] of sent) expect(again.readBodies(frames).equals(body)).toBe(true);
    checkRanges(again);
    await again.close();
  });

  it('shares the prompt token ids of answers from where they begin, the marker cut across chunks, and holds nothing back once flushed', async () => {
    const dir = tmp();
    const j = await open(dir);
    const random = rng(11);
    const ids: number[] = [];
    const sent: [number[], Buffer][] = [];
    let base: BodyBase | null = null;
    for (let turn = 0; turn < 10; turn++) {
      for (let k = 0; k < 4000; k++) ids.push(Math.floor(random() * 150_000));
      const body = Buffer.from(
        `{"id":"chatcmpl-${turn}","choices":[{"index":0,"message":{"content":"answer ${turn}"},"token_ids":[1,2,3]}],"prompt_token_ids":[${ids.join(',')}]}`,
      );
      // Cut inside the marker on purpose: `"prompt_token_ids":[` spans two chunks.
      const marker = body.indexOf('"prompt_token_ids":[') + 7;
      const parts = [body.subarray(0, marker), ...chunks(random, body.subarray(marker))];
      const streamed = turn % 3 === 2;
      const w: BodyWriter = new BodyWriter(j, 5000 + turn, 'response', base);
      const frames: number[] = [];
      let passed = 0;
      for (const p of parts) {
        w.write(p, frames);
        passed += p.length;
        if (streamed) {
          // A streamed answer is flushed after every chunk: what the agent got is all in the journal.
          w.flush(frames);
          j.flushNow();
          expect(j.readBodies(frames).equals(body.subarray(0, passed))).toBe(true);
        }
      }
      w.flush(frames);
      base = w.result();
      sent.push([frames, body]);
    }
    j.flushNow();
    for (const [frames, body] of sent) expect(j.readBodies(frames).equals(body)).toBe(true);
    const total = sent.reduce((n, [, b]) => n + b.length, 0);
    expect(journalBytes(dir)).toBeLessThan(total * 0.45);
    await j.close();
  });

  it('journals a body that parts from its base early as it is, and one with no base too', async () => {
    const dir = tmp();
    const j = await open(dir);
    const random = rng(3);
    const first = Buffer.from(text(random, 5 * BLOCK));
    const a = writeBody(j, 1, 'request', null, chunks(random, first));
    // Same length, one byte changed in the first block: nothing is shared.
    const second = Buffer.from(first);
    second[100] ^= 1;
    const b = writeBody(j, 2, 'request', a.base, chunks(random, second));
    // The same bytes again, then more: every whole block is shared.
    const third = Buffer.concat([second, Buffer.from(text(random, 3000))]);
    j.flushNow();
    const before = journalBytes(dir);
    const c = writeBody(j, 3, 'request', b.base, [third]);
    j.flushNow();
    expect(j.readBodies(a.frames).equals(first)).toBe(true);
    expect(j.readBodies(b.frames).equals(second)).toBe(true);
    expect(j.readBodies(c.frames).equals(third)).toBe(true);
    // Compared byte for byte: the 3000 new bytes, a reference frame and headers are journaled.
    expect(journalBytes(dir) - before).toBeLessThan(3000 + 1024);
    // A base names every byte of its body.
    expect(c.base!.bytes).toBe(third.length);
    expect(c.base!.extents.filter((_, i) => i % 3 === 2).reduce((n, l) => n + l, 0)).toBe(third.length);
    // Responses without the marker have no base to give.
    expect(writeBody(j, 4, 'response', null, [Buffer.from('{"choices":[]}')]).base).toBeNull();
    await j.close();
  });

  it('keeps a segment while a reference frame still needed names bytes in it, and lets it go after', async () => {
    const dir = tmp();
    const j = await open(dir, { segmentBytes: 4096 });
    const body = Buffer.alloc(3 * BLOCK, 'x');
    const a = writeBody(j, 1, 'request', null, [body]);
    j.flushNow();
    // Other traffic fills a few segments.
    for (let i = 0; i < 20; i++) await j.append(Buffer.from(`{"filler":"${'y'.repeat(1000)}"}`)).durable;
    const mark = j.next;
    const b = writeBody(j, mark, 'request', a.base, [body]);
    j.flushNow();
    expect(b.frames).toHaveLength(1);
    const segments = j.segmentCount;
    // Everything before the second call is no longer needed by anyone but its reference frame.
    await j.release(mark);
    expect(j.segmentCount).toBe(segments);
    expect(j.readBodies(b.frames).equals(body)).toBe(true);
    for (let i = 0; i < 5; i++) await j.append(Buffer.from(`{"filler":"${'z'.repeat(1000)}"}`)).durable;
    await j.release(j.next);
    expect(j.segmentCount).toBeLessThan(segments);
    expect(() => j.readBodies(b.frames)).toThrow(/not in the journal/);
    await j.close();
  });

  it('compares with a base that keeps only block digests, and reads every body back the same', async () => {
    const dir = tmp();
    const j = await open(dir);
    const random = rng(19);
    let body = Buffer.from(text(random, 3 * BLOCK + 500));
    let base: BodyBase | null = writeBody(j, 1, 'request', null, chunks(random, body)).base;
    const sent: [number[], Buffer][] = [];
    for (let turn = 0; turn < 6; turn++) {
      // Every other base gives its bytes up, as one pushed out of the store's budget does.
      if (turn % 2 === 1) {
        base = toDigests(base!);
        expect(base!.chunks).toBeNull();
        expect(base!.bytes % BLOCK).toBe(0);
      }
      body = Buffer.concat([body, Buffer.from(text(random, 5000 + turn * 3000))]);
      if (turn === 4) body[BLOCK + 7] ^= 1; // parts from the base in its second block
      // Every other body is flushed after each chunk, as a streamed answer is.
      const w = writeBody(j, 10 + turn, 'request', base, chunks(random, body), turn % 2 === 1);
      sent.push([w.frames, Buffer.from(body)]);
      base = w.base;
    }
    j.flushNow();
    for (const [frames, b] of sent) expect(j.readBodies(frames).equals(b)).toBe(true);
    // Shared blocks were journaled as references against digests too.
    const total = sent.reduce((n, [, b]) => n + b.length, 0);
    expect(journalBytes(dir)).toBeLessThan(total * 0.6);
    await j.close();
  });

  it('keeps bases in memory within a byte budget; the oldest beyond it keep digests', () => {
    const base = (bytes: number): BodyBase => ({ extents: [1, 0, bytes], bytes, chunks: [Buffer.alloc(bytes)], held: bytes, digests: null, lowest: 1 });
    const store = new BaseStore<string>(3, 3 * BLOCK);
    store.set('a', base(BLOCK + 10), null);
    expect(store.heldBytes).toBe(BLOCK + 10);
    store.set('b', base(BLOCK), base(BLOCK));
    // Over budget: a (the least recently set) gives up its bytes for the digest of its one whole block.
    expect(store.get('a', 'request')!.chunks).toBeNull();
    expect(store.get('a', 'request')!.bytes).toBe(BLOCK);
    expect(store.get('b', 'response')!.chunks).not.toBeNull();
    expect(store.heldBytes).toBe(2 * BLOCK);
    store.set('c', base(10), null);
    store.set('d', null, null);
    // More entries than allowed: the least recently set goes altogether.
    expect(store.size).toBe(3);
    expect(store.get('a', 'request')).toBeNull();
    store.delete('b');
    expect(store.heldBytes).toBe(10);
    store.clear();
    expect(store.heldBytes).toBe(0);
  });

  it('finds where two byte ranges part', () => {
    const random = rng(5);
    const a = Buffer.from(text(random, 70_000));
    for (const at of [0, 1, 31, 32, 33, 1000, 65_535, 69_999]) {
      const b = Buffer.concat([Buffer.from('xx'), a]);
      b[2 + at] ^= 0x20;
      expect(sameBytes(a, 0, b, 2, a.length)).toBe(at);
      expect(sameBytes(a, 10, b, 12, a.length - 10)).toBe(at >= 10 ? at - 10 : a.length - 10);
    }
    expect(sameBytes(a, 5, a, 5, 100)).toBe(100);
    expect(sameBytes(a, 0, a, 0, 0)).toBe(0);
  });

  it('reads reference frames back from the file once the extents kept in memory for them are let go', async () => {
    const dir = tmp();
    const j = await open(dir);
    // 30,000 one-byte frames: a reference naming all of them holds 90,000 numbers.
    const frames: number[] = [];
    const bytes = Buffer.alloc(30_000);
    for (let i = 0; i < bytes.length; i++) {
      bytes[i] = 97 + (i % 26);
      frames.push(j.appendBody(1, 'request', bytes.subarray(i, i + 1)));
    }
    const extents = frames.flatMap((f) => [f, 0, 1]);
    const refs = [0, 1, 2].map(() => j.appendRef(2, 'request', extents));
    j.flushNow();
    // Together they hold more numbers than are kept in memory: the oldest are read from the file.
    for (const r of refs) expect(j.readBodies([r]).equals(bytes)).toBe(true);
    await j.close();
  });

  it('slices extents by byte range', () => {
    const extents = [10, 0, 5, 11, 2, 3, 12, 0, 4];
    expect(slice(extents, 0, 12)).toEqual(extents);
    expect(slice(extents, 4, 3)).toEqual([10, 4, 1, 11, 2, 2]);
    expect(slice(extents, 8, 4)).toEqual([12, 0, 4]);
    expect(slice(extents, 11, 5)).toEqual([12, 3, 1]);
  });

  it('knows how many first bytes of a request equal the previous one, and passes notes on to the next', async () => {
    const dir = tmp();
    const j = await open(dir);
    const random = rng(5);
    const first = Buffer.from(text(random, 3 * BLOCK + 500));
    const second = Buffer.concat([first.subarray(0, 2 * BLOCK + 123), Buffer.from('a different turn'), Buffer.from(text(random, BLOCK))]);
    // Against the bytes: exactly where the two part, however the chunks fall.
    const w1 = new BodyWriter(j, 1, 'request', null);
    const frames: number[] = [];
    for (const c of chunks(random, first)) w1.write(c, frames);
    expect(w1.shared).toBe(0);
    w1.notes = { found: 42 };
    w1.flush(frames);
    const base = w1.result()!;
    expect(base.notes).toEqual({ found: 42 });
    const w2 = new BodyWriter(j, 2, 'request', base);
    expect(w2.baseNotes).toEqual({ found: 42 });
    for (const c of chunks(random, second)) w2.write(c, frames);
    expect(w2.shared).toBe(2 * BLOCK + 123);
    // A body equal to the base all along: all of it.
    const w3 = new BodyWriter(j, 3, 'request', base);
    w3.write(first.subarray(0, 1000), frames);
    expect(w3.shared).toBe(1000);
    // Against digests: the whole blocks that matched, and the notes kept with them.
    const digests = toDigests(base)!;
    expect(digests.notes).toEqual({ found: 42 });
    const w4 = new BodyWriter(j, 4, 'request', digests);
    for (const c of chunks(random, second)) w4.write(c, frames);
    expect(w4.shared).toBe(2 * BLOCK);
    await j.close();
  });
});
