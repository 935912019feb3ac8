import { FrameIndex } from '../../src/journal/frame-index';

describe('FrameIndex', () => {
  it('finds frames added in offset order, past several growths', () => {
    const idx = new FrameIndex();
    for (let i = 0; i < 1000; i++) idx.add(10 + 3 * i, 100 * i, i + 1, i % 7 === 0);
    expect(idx.size).toBe(1000);
    for (let i = 0; i < 1000; i++) {
      const f = idx.find(10 + 3 * i);
      expect(f).toBe(i);
      expect([idx.offsetAt(f), idx.pos(f), idx.len(f), idx.isRef(f)]).toEqual([10 + 3 * i, 100 * i, i + 1, i % 7 === 0]);
    }
    // Offsets between frames, before the first and after the last are not frames.
    for (const missing of [0, 9, 11, 12, 10 + 3 * 999 + 1, 1e12]) expect(idx.find(missing)).toBe(-1);
  });

  it('keeps a zero-length reference frame apart from a zero-length body frame', () => {
    const idx = new FrameIndex();
    idx.add(1, 0, 0, false);
    idx.add(2, 0, 0, true);
    expect([idx.len(0), idx.isRef(0), idx.len(1), idx.isRef(1)]).toEqual([0, false, 0, true]);
  });

  it('puts a frame added out of order in its place, and replaces one added again', () => {
    const idx = new FrameIndex();
    for (const o of [5, 9, 7, 1, 9]) idx.add(o, o * 10, o, false);
    expect(idx.size).toBe(4);
    expect(Array.from({ length: idx.size }, (_, i) => idx.offsetAt(i))).toEqual([1, 5, 7, 9]);
    expect(idx.pos(idx.find(7))).toBe(70);
  });

  it('holds offsets and positions beyond 32 bits', () => {
    const idx = new FrameIndex();
    idx.add(2 ** 40, 2 ** 33, 5, false);
    expect(idx.pos(idx.find(2 ** 40))).toBe(2 ** 33);
  });

  it("stores offsets from the segment's first one, and still takes a frame from below it", () => {
    const base = 2 ** 40;
    const idx = new FrameIndex(base);
    for (let i = 0; i < 100; i++) idx.add(base + 2 * i, i * 1000, 10, false);
    expect(idx.offsetAt(idx.find(base + 198))).toBe(base + 198);
    expect(idx.find(base - 1)).toBe(-1);
    idx.add(base - 5, 7, 3, true);
    expect(idx.size).toBe(101);
    expect([idx.offsetAt(0), idx.pos(0), idx.len(0), idx.isRef(0)]).toEqual([base - 5, 7, 3, true]);
    expect(idx.find(base + 198)).toBe(100);
    expect(idx.pos(idx.find(base + 2))).toBe(1000);
  });

  it('answers as a plain sorted list does, for frames in order and out of it, lookups in any order', () => {
    // A fixed pseudo-random sequence: mostly in order (as the journal writes), sometimes not.
    let seed = 20261127;
    const rand = (n: number): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
    const idx = new FrameIndex(1000);
    const ref = new Map<number, [number, number, boolean]>();
    let offset = 1000;
    let pos = 0;
    for (let k = 0; k < 3000; k++) {
      const o = rand(50) === 0 ? 1000 + rand(offset - 999) : (offset += 1 + rand(4));
      const p = rand(50) === 0 ? rand(2 ** 20) : (pos += rand(300_000));
      const f: [number, number, boolean] = [p, rand(200_000), rand(5) === 0];
      idx.add(o, ...f);
      ref.set(o, f);
    }
    const sorted = [...ref.keys()].sort((a, b) => a - b);
    expect(idx.size).toBe(sorted.length);
    // Walk in index order, then random lookups (hits and misses).
    sorted.forEach((o, i) => expect([idx.offsetAt(i), idx.pos(i), idx.len(i), idx.isRef(i)]).toEqual([o, ...ref.get(o)!]));
    for (let k = 0; k < 3000; k++) {
      const o = 990 + rand(offset - 980);
      const i = idx.find(o);
      if (!ref.has(o)) expect(i).toBe(-1);
      else expect([i, idx.pos(i), idx.len(i), idx.isRef(i)]).toEqual([sorted.indexOf(o), ...ref.get(o)!]);
    }
    expect(() => idx.pos(sorted.length)).toThrow(RangeError);
  });

  it('holds a frame of a typical segment in under 8 bytes once trimmed', () => {
    const idx = new FrameIndex(5000);
    let pos = 0;
    for (let i = 0; i < 100_000; i++) {
      const len = 200 + ((i * 7919) % 20_000);
      idx.add(5000 + 3 * i, (pos += len + 40), len, i % 3 === 0);
    }
    idx.trim();
    expect(idx.heldBytes / idx.size).toBeLessThan(8);
    expect(idx.len(idx.find(5000 + 3 * 99_999))).toBe(200 + ((99_999 * 7919) % 20_000));
  });
});
