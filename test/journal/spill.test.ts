import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Spill } from '../../src/journal/spill';

describe('Spill', () => {
  const root = mkdtempSync(path.join(os.tmpdir(), 'lightning-spill-unit-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it('keeps values of parts as one, reads any range of them back, and deletes a file once all its values are released', () => {
    const dir = path.join(root, 'a');
    const spill = new Spill(dir, 1000);
    const a = spill.writeBytes([Buffer.from('head'), Buffer.from('-'), Buffer.from('tail')]);
    const b = spill.write({ x: 1 });
    // Bigger than the rest of the file: it takes the file past its size, and the next value starts another.
    const big = Buffer.alloc(2500, 7);
    const c = spill.writeBytes([big]);
    const d = spill.writeBytes([Buffer.from('after')]);
    expect(spill.readBytes(a).toString()).toBe('head-tail');
    expect(spill.readBytes(a, 5, 4).toString()).toBe('tail');
    expect(spill.readBytes(a, 4).toString()).toBe('-tail');
    expect(spill.read(b)).toEqual({ x: 1 });
    expect(spill.readBytes(c).equals(big)).toBe(true);
    expect(spill.readBytes(d).toString()).toBe('after');
    expect([a.file === b.file, c.file === a.file, d.file !== c.file]).toEqual([true, true, true]);
    expect(() => spill.readBytes(a, 5, 5)).toThrow(RangeError);
    expect(() => spill.readBytes(a, -1, 2)).toThrow(RangeError);
    expect(readdirSync(dir)).toHaveLength(2);
    spill.release(a);
    spill.release(b);
    spill.release(c);
    expect(readdirSync(dir)).toHaveLength(1);
    expect(() => spill.readBytes(c)).toThrow(/gone/);
    spill.release(d);
    expect(readdirSync(dir)).toEqual([]);
    spill.close();
  });

  it('writes a value in parts as they come, small ones gathered, large ones as they are, in order; an aborted value is written over', () => {
    const spill = new Spill(path.join(root, 'b'), 1 << 20);
    const parts: Buffer[] = [];
    // Sizes around the gathering buffer's limits (256 KiB, a quarter of it for a part of its own).
    for (const n of [1, 3, 65535, 65536, 70000, 10, 200_000, 7, 262_144, 262_145, 5, 1000]) parts.push(Buffer.alloc(n, parts.length + 1));
    const dropped = spill.begin();
    dropped.append(Buffer.alloc(100_000, 0xee));
    dropped.abort();
    const v = spill.begin();
    expect(() => spill.begin()).toThrow(/being written/);
    for (const p of parts) v.append(p);
    const ref = v.end();
    expect(ref.at).toBe(0);
    expect(spill.readBytes(ref).equals(Buffer.concat(parts))).toBe(true);
    spill.release(ref);
    spill.close();
  });
});
