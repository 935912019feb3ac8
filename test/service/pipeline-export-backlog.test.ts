import { RefusedError } from '../../src/model/component';
import type { TransitionRecord } from '../../src/model/records';
import type { Pipeline } from '../../src/service/pipeline';
import type { SpanObservation } from '../../src/pipeline/span-router';
import { beginCall as begin, chatAnswer as answer, endCall as end, startPipeline, tempDirs, until } from '../support/pipeline-calls';

/**
 * Closed episodes wait in memory while the exporter is away. Their records are bounded by
 * `service.max_export_backlog`: above it new captures and spans are refused, as when the journal
 * is full, while rewards, ends and the end records of calls under way still go in (so episodes
 * can close); once the exporter catches up, intake resumes.
 */

const reward = (p: Pipeline, rollout: string) =>
  p.submit({ type: 'reward', rolloutId: rollout, attemptId: '0', name: 'final', value: 1, final: true, at: Date.now(), source: 'rollout_api' });

const toolSpan = (rollout: string): SpanObservation => ({
  type: 'span',
  traceId: 'a'.repeat(32),
  spanId: 'b'.repeat(16),
  startedAt: Date.now(),
  endedAt: Date.now(),
  rollout: { rolloutId: rollout, attemptId: '0' },
  what: { kind: 'tool', tool: { convention: 'gen_ai', toolName: 'calc', toolCallId: 'call_1', result: null, outcome: 'ok', errorType: null } },
  attributes: {},
  at: Date.now(),
});

describe('the export backlog', () => {
  const { dir, remove } = tempDirs('lightning-backlog-');
  afterAll(remove);

  it('refuses new captures and spans above max_export_backlog, keeps closing episodes, and resumes once exported', async () => {
    let exporterUp = false;
    const exported: TransitionRecord[] = [];
    const p = startPipeline(
      dir(),
      {},
      (batch) => {
        if (!exporterUp) throw new Error('broker away');
        for (const c of batch) exported.push(...c.transitions);
      },
      { max_export_backlog: 5 },
    );
    await p.start();
    try {
      // Each episode holds two records (its call and its final reward): the third reaches the bound.
      for (let i = 0; i < 3; i++) {
        const c = begin(p, `r${i}`, 0, 'q');
        expect(c.begin()).not.toBeNull();
        c.response(answer('a'));
        end(p, c);
        await reward(p, `r${i}`);
      }
      expect(p.backlogFull()).toMatch(/6 records .*max_export_backlog 5/);

      // A call already under way when the bound was reached ends and closes its episode.
      const under = begin(p, 'under', 0, 'q');
      // New work is refused: a capture starting now is not recorded, a span is refused retryably.
      const refused = begin(p, 'late', 0, 'q');
      expect(refused.begin()).toBeNull();
      await expect(p.submit(toolSpan('late'))).rejects.toMatchObject({ code: 'EXPORT_BACKLOG', retryable: true });
      await expect(p.submit(toolSpan('late'))).rejects.toBeInstanceOf(RefusedError);
      under.response(answer('b'));
      end(p, under);
      await reward(p, 'under');

      exporterUp = true;
      await until(() => exported.length === 4, 15_000);
      expect(exported.map((t) => t.rollout_id).sort()).toEqual(['r0', 'r1', 'r2', 'under']);
      await until(() => p.backlogFull() === null);
      expect(p.backlogFull()).toBeNull();

      // Intake resumes.
      const again = begin(p, 'again', 0, 'q');
      expect(again.begin()).not.toBeNull();
      again.response(answer('c'));
      end(p, again);
      await reward(p, 'again');
      await until(() => exported.some((t) => t.rollout_id === 'again'));
      expect(exported.map((t) => t.rollout_id)).toContain('again');
    } finally {
      await p.shutdown();
    }
  });
});
