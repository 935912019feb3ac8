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
    // Bigger than a file: a file of its own, not an empty one before it.
    const big = Buffer.alloc(2500, 7);
    const c = spill.writeBytes([big]);
    const d = spill.writeBytes([Buffer.from('after')]);
    expect(spill.readBytes(a).toString()).toBe('head-tail');
    expect(spill.readBytes(a, 5, 4).toString()).toBe('tail');
    expect(spill.readBytes(a, 4).toString()).toBe('-tail');
    expect(spill.read(b)).toEqual({ x: 1 });
    expect(spill.readBytes(c).equals(big)).toBe(true);
    expect(spill.readBytes(d).toString()).toBe('after');
    expect([a.file === b.file, c.file !== a.file, d.file !== c.file]).toEqual([true, true, true]);
    expect(() => spill.readBytes(a, 5, 5)).toThrow(RangeError);
    expect(() => spill.readBytes(a, -1, 2)).toThrow(RangeError);
    expect(readdirSync(dir)).toHaveLength(3);
    spill.release(c);
    expect(readdirSync(dir)).toHaveLength(2);
    expect(() => spill.readBytes(c)).toThrow(/gone/);
    spill.release(a);
    spill.release(b);
    spill.release(d);
    expect(readdirSync(dir)).toEqual([]);
    spill.close();
  });
});
