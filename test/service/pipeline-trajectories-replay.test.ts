import { cpSync } from 'node:fs';
import path from 'node:path';
import { TransitionWriter } from '../../src/exporters/transition-json';
import { trajectoryJson } from '../../src/exporters/trajectory-json';
import type { Pipeline } from '../../src/service/pipeline';
import { beginCall, endCall, startPipeline, tempDirs, until } from '../support/pipeline-calls';

/**
 * Trajectories are built from the journal alone: a sidecar killed after it built and tried to
 * export an episode, restarted on the journal as the kill left it, exports the same trajectories,
 * byte for byte, under the same ids.
 */

/** A vLLM-shaped answer: `prompt` as the prompt's ids, `answer` as the sampled ids, with logprobs. */
function vllmAnswer(prompt: number[], answer: number[]): Buffer {
  const logprobs = answer.map((id, i) => ({ token: `t${id}`, logprob: -0.125 * (i + 1), bytes: null, top_logprobs: [] }));
  return Buffer.from(
    JSON.stringify({
      id: 'c',
      model: 'm',
      choices: [{ index: 0, message: { role: 'assistant', content: 'a' }, logprobs: { content: logprobs }, finish_reason: 'stop', token_ids: answer }],
      prompt_token_ids: prompt,
    }),
  );
}

function start(dataDir: string, out: Buffer[], refuse: boolean): Pipeline {
  return startPipeline(dataDir, {}, (batch, read) => {
    const writer = new TransitionWriter(read);
    for (const c of batch) for (const t of c.trajectories) out.push(trajectoryJson(writer, t));
    if (refuse) throw new Error('the broker is away');
  });
}

describe('trajectories after a restart', () => {
  const { dir, remove } = tempDirs('lightning-trajectories-');
  afterAll(remove);

  it('replaying the journal of a killed sidecar rebuilds the same trajectories (same ids, same bytes)', async () => {
    const d = dir();
    const first: Buffer[] = [];
    const p1 = start(d, first, true);
    await p1.start();
    // Two rollouts: one whose calls continue each other, one whose history was rewritten.
    let prompt = Array.from({ length: 300 }, (_, i) => 500 + i);
    for (let seq = 0; seq < 4; seq++) {
      const c = beginCall(p1, 'grow', seq, `question ${seq}`);
      const answer = [10 + seq, 20 + seq];
      c.response(vllmAnswer(prompt, answer));
      endCall(p1, c);
      prompt = [...prompt, ...answer, 7, 8];
    }
    for (const [seq, p] of [
      [0, [1, 2, 3]],
      [1, [1, 2, 3, 40, 41, 5]],
      [2, [9, 9]],
    ] as [number, number[]][]) {
      const c = beginCall(p1, 'split', seq, `q${seq}`);
      c.response(vllmAnswer(p, [40 + seq, 41 + seq]));
      endCall(p1, c);
    }
    for (const r of ['grow', 'split']) await p1.submit({ type: 'end', rolloutId: r, attemptId: '0', at: Date.now() });
    await until(() => first.length >= 3);
    expect(first).toHaveLength(3);
    // The journal as a SIGKILL would leave it: the episodes closed, their export not acknowledged.
    p1.capture.flush();
    const snapshot = dir();
    cpSync(path.join(d, 'journal'), path.join(snapshot, 'journal'), { recursive: true });
    await p1.shutdown();

    const second: Buffer[] = [];
    const p2 = start(snapshot, second, false);
    await p2.start();
    await until(() => second.length >= 3);
    await p2.shutdown();
    expect(second.map((b) => b.toString('utf8'))).toEqual(first.slice(0, 3).map((b) => b.toString('utf8')));
    const ids = second.map((b) => (JSON.parse(b.toString('utf8')) as { trajectory_id: string; turns: unknown[] }).trajectory_id);
    expect(ids).toEqual(['grow/0/s0', 'split/0/s0', 'split/0/s1']);
    const grow = JSON.parse(second[0].toString('utf8')) as { token_ids: number[]; loss_mask: number[]; turns: unknown[] };
    expect(grow.turns).toHaveLength(4);
    expect(grow.token_ids.slice(0, 300)).toEqual(Array.from({ length: 300 }, (_, i) => 500 + i));
    expect(grow.loss_mask.reduce((a, b) => a + b, 0)).toBe(8);
  });
});
