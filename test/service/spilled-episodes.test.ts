import { SETTLED, SpilledEpisodes } from '../../src/pipeline/spilled-episodes';
import type { EpisodeClose } from '../../src/processors/episodes/assembler';

describe('SpilledEpisodes', () => {
  it('gives entries back in the order they came, across the ring wrapping and growing', () => {
    const s = new SpilledEpisodes();
    let pushed = 0;
    let taken = 0;
    // Push and take unevenly, so the ring wraps before it grows, several times.
    for (let round = 0; round < 40; round++) {
      for (let k = 0; k < 300; k++, pushed++)
        s.push(
          { ref: { file: pushed % 7, at: pushed * 100, length: pushed + 1 }, close: null, firstOffset: 1e9 - pushed, marker: 2 * pushed, weight: pushed % 5 },
          SETTLED,
        );
      for (let k = 0; k < 200; k++, taken++) {
        expect(s.firstMarker).toBe(2 * taken);
        const e = s.shift();
        expect([e.ref, e.firstOffset, e.marker, e.weight]).toEqual([
          { file: taken % 7, at: taken * 100, length: taken + 1 },
          1e9 - taken,
          2 * taken,
          taken % 5,
        ]);
      }
    }
    expect(s.length).toBe(pushed - taken);
    expect(s.lowestFirstOffset()).toBe(1e9 - (pushed - 1));
    while (s.length > 0) s.shift();
    expect([s.firstMarker, s.lowestFirstOffset()]).toEqual([Infinity, Infinity]);
    expect(() => s.shift()).toThrow(RangeError);
  });

  it('keeps an entry that could not go to disk in memory, and the write of a marker until it settles', async () => {
    const s = new SpilledEpisodes();
    const close = { firstOffset: 3 } as unknown as EpisodeClose;
    let written!: () => void;
    const writing = new Promise<void>((r) => (written = r));
    s.push({ ref: null, close, firstOffset: 3, marker: 4, weight: 2 }, writing);
    s.push({ ref: { file: 0, at: 0, length: 1 }, close: null, firstOffset: 5, marker: 6, weight: 1 }, writing);
    const a = s.shift();
    expect([a.ref, a.close, a.durable]).toEqual([null, close, writing]);
    written();
    await writing;
    // Settled before it was taken: what it hands out is already resolved, not the marker's write.
    const b = s.shift();
    expect(b.durable).not.toBe(writing);
    await expect(b.durable).resolves.toBeUndefined();
  });

  it('writes held entries later, in order, wherever the ring has moved: firstHeld, then store', () => {
    const s = new SpilledEpisodes();
    const closes = Array.from({ length: 3000 }, (_, i) => ({ firstOffset: i }) as unknown as EpisodeClose);
    // Entries held in memory behind ones already on disk, taken and pushed so the ring wraps and grows.
    for (let i = 0; i < 3000; i++) {
      if (i % 3 === 0) s.push({ ref: { file: 1, at: i, length: 1 }, encoded: true, close: null, firstOffset: i, marker: i, weight: 1 }, SETTLED);
      else s.push({ ref: null, close: closes[i], firstOffset: i, marker: i, weight: i % 4 }, SETTLED);
      if (i % 2 === 0) s.shift();
    }
    // The first held entry still in the ring is the oldest one not taken.
    const taken = 1500;
    let held = s.firstHeld();
    let expected = taken;
    while (expected % 3 === 0) expected++;
    expect([held?.close, held?.weight]).toEqual([closes[expected], expected % 4]);
    // Each is written in turn (some encoded, some as facts); then none is held.
    let n = 0;
    while ((held = s.firstHeld())) {
      s.store(held.seq, { file: 2, at: n, length: 10 }, n % 2 === 0);
      n++;
    }
    expect(() => s.store(0, { file: 2, at: 0, length: 1 }, false)).toThrow(RangeError);
    const out = [];
    while (s.length > 0) out.push(s.shift());
    expect(out).toHaveLength(1500);
    expect(out.every((e) => e.close === null && e.ref !== null)).toBe(true);
    // Entries keep their place and their weight; those written here say how.
    expect(out.map((e) => e.firstOffset)).toEqual(Array.from({ length: 1500 }, (_, k) => taken + k));
    const written = out.filter((e) => e.ref!.file === 2);
    expect(written.map((e) => e.ref!.at)).toEqual(Array.from({ length: n }, (_, k) => k));
    expect(written.map((e) => e.encoded)).toEqual(Array.from({ length: n }, (_, k) => k % 2 === 0));
    expect(out.filter((e) => e.ref!.file === 1).every((e) => e.encoded)).toBe(true);
    expect(written.map((e) => e.weight)).toEqual(written.map((e) => e.firstOffset % 4));
  });
});
