import { cpSync } from 'node:fs';
import path from 'node:path';
import type { CallCapture } from '../../src/receivers/llm-proxy/capture';
import type { Pipeline } from '../../src/service/pipeline';
import { beginCall, chatAnswer, endCall, startPipeline, tempDirs, until } from '../support/pipeline-calls';

/**
 * Segments whose records are all delivered are deleted, but only once the marker that says they
 * were delivered is written: until then a replay exports their episodes again, and needs their
 * bodies to do it. A process killed between the deletion and the marker's write would otherwise
 * replay episodes whose call records survive (in a later segment) while their bodies are gone,
 * and export them again under the same transition ids with bodies that are not there (the
 * short soak once saw it: a copy of each of six just-delivered episodes without its request).
 */

/** A transition as an exporter writes it: its request read from the journal (or why it could not be). */
interface Written {
  id: string;
  rollout: string;
  request: string;
}

function start(dataDir: string, exported: Written[]): Pipeline {
  return startPipeline(dataDir, { segment_bytes: 4096 }, (batch, read) => {
    for (const c of batch)
      for (const t of c.transitions) {
        let request: string;
        try {
          request = read(t.source!.request).toString('utf8');
        } catch (err) {
          request = `unreadable: ${(err as Error).message}`;
        }
        exported.push({ id: t.transition_id, rollout: t.rollout_id, request });
      }
  });
}

/** A call whose request is in the journal and whose answer has not begun. */
function begin(p: Pipeline, rollout: string, seq: number, question: string): CallCapture {
  const c = beginCall(p, rollout, seq, question);
  p.capture.flush();
  return c;
}

function finish(p: Pipeline, c: CallCapture): void {
  c.response(chatAnswer('ok'));
  endCall(p, c);
  p.capture.flush();
}

describe('releasing delivered segments', () => {
  const { dir, remove } = tempDirs('lightning-release-');
  afterAll(remove);

  it('waits for the delivered marker: a journal copied right after a deletion replays no episode without its bodies', async () => {
    const d = dir();
    const exported: Written[] = [];
    const first = start(d, exported);
    await first.start();
    // The journal as a SIGKILL would leave it right after each deletion of segments.
    const snapshots: string[] = [];
    const release = first.journal.release.bind(first.journal);
    first.journal.release = async (low: number) => {
      const removed = await release(low);
      if (removed > 0) {
        const snap = dir();
        cpSync(path.join(d, 'journal'), path.join(snap, 'journal'), { recursive: true });
        snapshots.push(snap);
      }
      return removed;
    };
    try {
      // Two agents at once: a's first call is under way (its request in a segment of its own)
      // when b's call begins, and ends after it; then a's episode is delivered while b's is open.
      // Everything below b's start may go once a's delivery is recorded, a's request with it.
      for (let i = 0; i < 4; i++) {
        const a0 = begin(first, `a${i}`, 0, `first question of a${i} ` + 'x'.repeat(5000));
        const b0 = begin(first, `b${i}`, 0, `question of b${i}`);
        finish(first, a0);
        finish(first, begin(first, `a${i}`, 1, `second question of a${i}`));
        await first.submit({ type: 'end', rolloutId: `a${i}`, attemptId: '0', at: Date.now() });
        await until(() => exported.filter((t) => t.rollout === `a${i}`).length === 2);
        await new Promise((r) => setTimeout(r, 30));
        finish(first, b0);
        await first.submit({ type: 'end', rolloutId: `b${i}`, attemptId: '0', at: Date.now() });
        await until(() => exported.filter((t) => t.rollout === `b${i}`).length === 1);
        await new Promise((r) => setTimeout(r, 30));
      }
      expect(exported.filter((t) => !t.request.startsWith('{"model"'))).toEqual([]);
      expect(snapshots.length).toBeGreaterThan(0);
    } finally {
      await first.shutdown();
    }

    for (const snap of snapshots) {
      const again: Written[] = [];
      const second = start(snap, again);
      await second.start();
      try {
        await new Promise((r) => setTimeout(r, 100));
        // Exported again (at least once) is allowed; without the request it was built from is not.
        expect(again.filter((t) => !t.request.startsWith('{"model"'))).toEqual([]);
      } finally {
        await second.shutdown();
      }
    }
  });
});
