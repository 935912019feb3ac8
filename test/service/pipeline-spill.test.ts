import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import type { BodyReader } from '../../src/formats/extract';
import type { ClosedEpisode } from '../../src/model/records';
import { beginCall, chatAnswer, endCall, startPipeline, tempDirs, until } from '../support/pipeline-calls';

/**
 * While the exporter is away, closed episodes past `service.export_backlog_memory_records` wait on
 * disk, not in memory; when it is back they are read back and exported whole, in order, and the
 * files are deleted.
 */
/** `n` one-call rollouts r0… with a final reward each: `n` closed episodes. */
async function rollouts(p: ReturnType<typeof startPipeline>, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const c = beginCall(p, `r${i}`, 0, `question ${i}`);
    c.response(chatAnswer(`answer ${i}`));
    endCall(p, c);
    await p.submit({ type: 'reward', rolloutId: `r${i}`, attemptId: '0', name: 'final', value: 1, final: true, at: Date.now(), source: 'rollout_api' });
  }
}

describe('closed episodes waiting for the exporter', () => {
  const { dir, remove } = tempDirs('lightning-spill-');
  afterAll(remove);

  const spillBytes = (d: string) => {
    const spill = path.join(d, 'spill');
    return existsSync(spill) ? readdirSync(spill).reduce((n, f) => n + statSync(path.join(spill, f)).size, 0) : 0;
  };

  it('wait on disk past the memory bound and are exported whole, in close order, when the exporter is back', async () => {
    const d = dir();
    let up = false;
    const exported: { rollout: string; request: string }[] = [];
    const onDisk: boolean[] = [];
    const p = startPipeline(
      d,
      {},
      (batch: ClosedEpisode[], read: BodyReader) => {
        if (!up) throw new Error('the broker is away');
        for (const c of batch) for (const t of c.transitions) exported.push({ rollout: t.rollout_id, request: read(t.source!.request).toString('utf8') });
      },
      { export_backlog_memory_records: 10 },
      { backlogOnDisk: (b) => onDisk.push(b) },
    );
    await p.start();
    const n = 300;
    try {
      await rollouts(p, n);
      // All but the first batches due (kept in memory) and the few records the bound allows wait on disk.
      await until(() => spillBytes(d) > 0);
      expect(spillBytes(d)).toBeGreaterThan(0);
      up = true;
      await until(() => exported.length >= n, 20_000);
      expect(exported.map((e) => e.rollout)).toEqual(Array.from({ length: n }, (_, i) => `r${i}`));
      for (const [i, e] of exported.entries()) expect(JSON.parse(e.request).messages[0].content).toBe(`question ${i}`);
      await until(() => spillBytes(d) === 0);
      expect(existsSync(path.join(d, 'spill')) ? readdirSync(path.join(d, 'spill')) : []).toEqual([]);
      // The heap's headroom was told when the backlog went to disk and when it came back.
      expect(onDisk).toEqual([true, false]);
    } finally {
      await p.shutdown();
    }
  });

  it('a restart with part of the backlog delivered exports the rest once, in order, through the disk again', async () => {
    const d = dir();
    const n = 300;
    const first: string[] = [];
    // The exporter takes the first 100 episodes, then is away until the restart.
    const p = startPipeline(
      d,
      {},
      (batch: ClosedEpisode[]) => {
        if (first.length >= 100) throw new Error('the broker is away');
        for (const c of batch) first.push(c.transitions[0].rollout_id);
      },
      { export_backlog_memory_records: 10 },
    );
    await p.start();
    try {
      await rollouts(p, n);
      await until(() => first.length >= 100 && spillBytes(d) > 0);
    } finally {
      await p.shutdown();
    }
    const second: string[] = [];
    const q = startPipeline(
      d,
      {},
      (batch: ClosedEpisode[]) => {
        for (const c of batch) second.push(c.transitions[0].rollout_id);
      },
      { export_backlog_memory_records: 10 },
    );
    await q.start();
    try {
      await until(() => first.length + second.length >= n, 20_000);
      // The replay spilled again what it queued past the bound; nothing delivered is exported twice.
      expect([...first, ...second]).toEqual(Array.from({ length: n }, (_, i) => `r${i}`));
      await until(() => spillBytes(d) === 0);
    } finally {
      await q.shutdown();
    }
  });
});
