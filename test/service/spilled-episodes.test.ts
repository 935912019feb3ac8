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
});
