import { mkdtempSync, readdirSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Journal, type JournalOptions } from '../../src/journal/journal';
import { BLOCK, BodyWriter, slice, type BodyBase } from '../../src/journal/repeats';
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
    j.flushNow();
    for (const [frames, body] of sent) expect(j.readBodies(frames).equals(body)).toBe(true);
    // Each request repeats the one before, so the journal holds a small part of what was sent.
    expect(journalBytes(dir)).toBeLessThan(total * 0.4);
    await j.close();
    // After a restart the reference frames are read from the segment files.
    const again = await open(dir);
    for (const [frames, body] of sent) expect(again.readBodies(frames).equals(body)).toBe(true);
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
    expect(journalBytes(dir) - before).toBeLessThan(3000 + BLOCK + 1024);
    // A base keeps only its whole blocks: a later body can match nothing else.
    expect(c.base!.bytes).toBe(5 * BLOCK);
    expect(c.base!.extents.filter((_, i) => i % 3 === 2).reduce((n, l) => n + l, 0)).toBe(5 * BLOCK);
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

  it('slices extents by byte range', () => {
    const extents = [10, 0, 5, 11, 2, 3, 12, 0, 4];
    expect(slice(extents, 0, 12)).toEqual(extents);
    expect(slice(extents, 4, 3)).toEqual([10, 4, 1, 11, 2, 2]);
    expect(slice(extents, 8, 4)).toEqual([12, 0, 4]);
    expect(slice(extents, 11, 5)).toEqual([12, 3, 1]);
  });
});
