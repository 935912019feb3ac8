import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { collectGarbage, HeapHeadroom } from '../../src/service/heap';

/**
 * `service.heap_headroom_mib`: after each full collection, V8's growing factor is set so that the
 * old generation's room before the next one is about the headroom.
 */

const run = promisify(execFile);
const HEAP = path.join(__dirname, '../../dist/service/heap.js');
const MiB = 1024 * 1024;

describe('heap headroom', () => {
  it('sets the factor from the live heap: headroom / live, at most 300 %, V8 alone below 10 %', () => {
    let live = 16 * MiB;
    const set: string[] = [];
    const h = new HeapHeadroom(
      32 * MiB,
      (f) => set.push(f),
      () => live,
    );
    expect(h.adjust()).toBe(200);
    expect(h.adjust()).toBe(200);
    live = 64 * MiB;
    expect(h.adjust()).toBe(50);
    live = 4 * MiB;
    expect(h.adjust()).toBe(300);
    live = 400 * MiB;
    expect(h.adjust()).toBe(0);
    // Set only when it changes.
    expect(set).toEqual(['--heap-growing-percent=200', '--heap-growing-percent=50', '--heap-growing-percent=300', '--heap-growing-percent=0']);
  });

  it('gives the room back to V8 while the exporter is behind (pressure), and takes it again after', () => {
    const set: string[] = [];
    const h = new HeapHeadroom(
      32 * MiB,
      (f) => set.push(f),
      () => 16 * MiB,
    ).start();
    h.pressure(true);
    h.pressure(true);
    h.pressure(false);
    h.stop();
    expect(set).toEqual(['--heap-growing-percent=200', '--heap-growing-percent=10', '--heap-growing-percent=200']);
  });

  it('does nothing at 0', () => {
    const set: string[] = [];
    const h = new HeapHeadroom(
      0,
      (f) => set.push(f),
      () => 16 * MiB,
    ).start();
    h.stop();
    expect(set).toEqual([]);
    expect(h.percent).toBe(0);
  });

  // V8's own trace of the limit it sets after each full collection: the room past the live heap
  // follows the headroom in a running process (a few full collections forced with gc()).
  const CHILD = `
    const { HeapHeadroom } = require(${JSON.stringify(HEAP)});
    const live = [];
    for (let i = 0; i < 120000; i++) live.push({ i, name: 'object ' + i, pair: [i, i + 1] });
    const h = new HeapHeadroom(Number(process.argv[1]) * 1024 * 1024).start();
    (async () => {
      for (let k = 0; k < 4; k++) {
        let junk = [];
        for (let i = 0; i < 100000; i++) junk.push({ i });
        junk = null;
        gc();
        await new Promise((r) => setTimeout(r, 10));
      }
      h.stop();
      console.log('RESULT ' + JSON.stringify({ percent: h.percent, live: live.length }));
    })();
  `;

  async function lastLimit(headroomMib: number): Promise<{ percent: number; oldKb: number; limitKb: number }> {
    const { stdout } = await run(process.execPath, ['--expose-gc', '--trace-gc-verbose', '-e', CHILD, String(headroomMib)], {
      timeout: 60_000,
      maxBuffer: 16 * MiB,
    });
    const limits = [...stdout.matchAll(/\[HeapController\] Limit: old size: (\d+) KB, new limit: (\d+) KB/g)];
    const result = /RESULT (.*)/.exec(stdout);
    expect(limits.length).toBeGreaterThanOrEqual(3);
    expect(result).not.toBeNull();
    const last = limits[limits.length - 1];
    return { percent: (JSON.parse(result![1]) as { percent: number }).percent, oldKb: Number(last[1]), limitKb: Number(last[2]) };
  }

  it('gives the old generation about that much room in a running process', async () => {
    const small = await lastLimit(8);
    const big = await lastLimit(64);
    expect(small.percent).toBeGreaterThan(10);
    expect(big.percent).toBeGreaterThan(small.percent);
    for (const r of [small, big]) {
      // V8's limit: the live size times the factor, plus the young generation's capacity (≤ 16 MiB here).
      const room = r.limitKb - r.oldKb * (1 + r.percent / 100);
      expect(room).toBeGreaterThanOrEqual(-1024);
      expect(room).toBeLessThanOrEqual(17 * 1024);
    }
    // The room past the live heap grows by what the headroom grows by (56 MiB), give or take a MiB of rounding.
    expect(Math.abs(big.limitKb - big.oldKb - (small.limitKb - small.oldKb) - 56 * 1024)).toBeLessThanOrEqual(2 * 1024);
  }, 120_000);
});

describe('collectGarbage', () => {
  it('runs a full collection without --expose-gc on the command line: an object nothing holds is gone', async () => {
    let ref: WeakRef<object> | null = null;
    (() => {
      ref = new WeakRef({ big: new Array(1000).fill('x') });
    })();
    // A WeakRef's target is kept until the job that made it ends.
    await new Promise((r) => setImmediate(r));
    collectGarbage();
    collectGarbage();
    expect(ref!.deref()).toBeUndefined();
  });
});
