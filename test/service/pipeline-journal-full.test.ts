import type { TransitionRecord } from '../../src/model/records';
import type { Pipeline } from '../../src/service/pipeline';
import { beginCall as begin, chatAnswer as answer, endCall as end, startPipeline, tempDirs, until } from '../support/pipeline-calls';

/**
 * A call whose start the journal took is recorded even when the journal reaches its high
 * watermark before the call ends (its bytes refused from then on): its end record may use the room
 * above the watermark, as rewards and ends do. Otherwise an answered call would vanish, in the
 * running process and, worse, at a restart that finds it cut by a crash.
 */

function start(dataDir: string, exported: TransitionRecord[]): Pipeline {
  return startPipeline(dataDir, { max_bytes: 60_000, segment_bytes: 4096, high_watermark: 0.5 }, (batch) => {
    for (const c of batch) exported.push(...c.transitions);
  });
}

const WATERMARK = 60_000 * 0.5;

/**
 * Whole calls of an open rollout until the journal refuses one (nothing of it can be released),
 * then rewards that do not close it (they may use the room above the watermark) until the journal
 * is over its watermark: no ordinary append fits, however small.
 */
function fill(p: Pipeline): void {
  for (let i = 0; i < 200 && !p.journal.full; i++) {
    const c = begin(p, 'filler', i, 'x'.repeat(1000));
    c.response(answer('y'.repeat(1000)));
    end(p, c);
  }
  for (let i = 0; i < 100 && p.journal.bytes < WATERMARK; i++)
    void p.submit({ type: 'reward', rolloutId: 'filler', attemptId: '0', name: 'pad', value: i, final: false, at: Date.now(), source: 'rollout_api' });
  expect(p.journal.bytes).toBeGreaterThanOrEqual(WATERMARK);
}

describe('a call in flight when the journal reaches its high watermark', () => {
  const { dir, remove } = tempDirs('lightning-full-call-');
  afterAll(remove);

  it('is recorded at its end, truncated where its bytes were refused', async () => {
    const exported: TransitionRecord[] = [];
    const p = start(dir(), exported);
    await p.start();
    try {
      const c = begin(p, 'late', 0, 'q');
      p.capture.flush();
      fill(p);
      // The journal refuses the answer's bytes now; the call ends all the same.
      c.response(answer('a'));
      end(p, c);
      await p.submit({ type: 'end', rolloutId: 'late', attemptId: '0', at: Date.now() });
      await until(() => exported.some((t) => t.rollout_id === 'late'));
      const t = exported.find((x) => x.rollout_id === 'late');
      expect(t).toMatchObject({ transition_id: 'late/0/0', truncated: true });
    } finally {
      await p.shutdown();
    }
  });

  it('cut by a crash, is recorded at the restart even with the journal above its watermark', async () => {
    const d = dir();
    const first = start(d, []);
    await first.start();
    const c = begin(first, 'cut', 0, 'q');
    c.response(answer('part of an answer the agent got'));
    first.capture.flush();
    fill(first);
    // The process stops with the call unended (as a SIGKILL leaves it) and the journal over its watermark.
    const over = first.journal.bytes;
    await first.shutdown();

    const exported: TransitionRecord[] = [];
    const second = start(d, exported);
    await second.start();
    try {
      // Replay found the journal as it was left, over its watermark, and the recovered call's end
      // record went on top of it.
      expect(over).toBeGreaterThanOrEqual(WATERMARK);
      expect(second.journal.bytes).toBeGreaterThan(over);
      await second.submit({ type: 'end', rolloutId: 'cut', attemptId: '0', at: Date.now() });
      await until(() => exported.some((t) => t.rollout_id === 'cut'));
      expect(exported.find((t) => t.rollout_id === 'cut')).toMatchObject({
        transition_id: 'cut/0/0',
        status: 'aborted',
        error: expect.stringMatching(/recovered from the journal/),
      });
    } finally {
      await second.shutdown();
    }
  });
});
