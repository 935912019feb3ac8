import type { CallRecord, Trajectory } from '../../../src/model/records';
import { buildEpisode, type EpisodeFacts, type TransitionOptions } from '../../../src/processors/rewards/transitions';
import { TransitionWriter } from '../../../src/exporters/transition-json';
import { materializeTrajectory } from '../../../src/exporters/trajectory-json';
import { callRecord } from '../../support/records';

/**
 * Journaled calls whose prompts repeat the previous call's prompt and answer (an agent's growing
 * context): the export reads only what each prompt adds (its validity, length and image
 * placeholders). Each case is checked against the same calls with their ids inline, which are
 * read whole.
 */

const IMAGE = 151655;
const options: TransitionOptions = {
  credit: { mode: 'identical', gamma: 1 } as TransitionOptions['credit'],
  airWeight: 0.5,
  air: null,
  includeAgents: [],
  excludeAgents: [],
  images: { imageTokenId: IMAGE, processor: null },
};

interface Turn {
  /** The prompt's ids as the server wrote them (text: a malformed one can be given). */
  prompt: string;
  answer: number[];
}

/** A vLLM chat answer with `prompt_token_ids` and `token_ids`, as journaled bytes. */
function answerBytes(t: Turn): Buffer {
  const logprobs = { content: t.answer.map((id) => ({ token: `t${id}`, logprob: -id / 1e6, bytes: null, top_logprobs: [] })) };
  return Buffer.from(
    `{"id":"x","object":"chat.completion","model":"m","prompt_token_ids":${t.prompt},"choices":[{"index":0,"message":{"role":"assistant","content":"a"},` +
      `"logprobs":${JSON.stringify(logprobs)},"finish_reason":"stop","token_ids":${JSON.stringify(t.answer)}}]}`,
  );
}

/** The same turns journaled (ids as byte ranges, read from the bodies) and inline. */
function both(turns: Turn[]): { journaled: Trajectory[]; inline: Trajectory[]; unmerged: unknown[][] } {
  const bodies = new Map<number, Buffer>();
  const request = Buffer.from('{"model":"m","messages":[{"role":"user","content":"hi"}]}');
  const journaled: CallRecord[] = turns.map((t, seq) => {
    bodies.set(seq * 2, request);
    bodies.set(seq * 2 + 1, answerBytes(t));
    const c = callRecord('r', seq, 1000 + seq * 10, { promptTokenIds: null, choices: [] });
    return { ...c, request: null, response: null, bodies: { request: [seq * 2], response: [seq * 2 + 1], encoding: null } } as CallRecord;
  });
  const inline: CallRecord[] = turns.map((t, seq) => {
    let prompt: number[] | null;
    try {
      const v: unknown = JSON.parse(t.prompt);
      prompt = Array.isArray(v) && v.every((x) => Number.isInteger(x)) ? (v as number[]) : null;
    } catch {
      prompt = null;
    }
    return callRecord('r', seq, 1000 + seq * 10, {
      promptTokenIds: prompt,
      request: { model: 'm', messages: [{ role: 'user', content: 'hi' }] },
      choices: [
        { index: 0, finishReason: 'stop', responseTokenIds: t.answer, responseLogprobs: t.answer.map((id) => -id / 1e6), promptTokenIds: null, toolCalls: [] },
      ],
    });
  });
  const read = (offsets: readonly number[]) => Buffer.concat(offsets.map((o) => bodies.get(o)!));
  const writer = new TransitionWriter(read);
  const facts = (calls: CallRecord[]): EpisodeFacts => ({
    rolloutId: 'r',
    attemptId: '0',
    groupId: null,
    calls,
    toolSpans: [],
    rewards: [],
    finalReward: 1,
    startedAt: 1000,
    endedAt: 2000,
  });
  const j = buildEpisode(facts(journaled), 'completed', { ...options, read });
  const i = buildEpisode(facts(inline), 'completed', options);
  return {
    journaled: j.trajectories.map((t) => materializeTrajectory(writer, t)),
    inline: i.trajectories.map((t) => materializeTrajectory(writer, t)),
    unmerged: [j.episode.unmerged_calls, i.episode.unmerged_calls],
  };
}

const ids = (a: number[]) => JSON.stringify(a);
const range = (from: number, n: number) => Array.from({ length: n }, (_, k) => from + k);

/** What a trajectory says, without its times and ids of the run. */
const shape = (t: Trajectory) => ({
  token_ids: t.token_ids,
  loss_mask: t.loss_mask,
  logprobs: t.logprobs,
  prompt_length: t.prompt_length,
  turns: t.turns.map((x) => [x.seq, x.response_start, x.response_end]),
  start_reason: t.start_reason,
  images_complete: t.images_complete,
  images_error: t.images_error,
});

describe('repeating prompts: the export reads what each prompt adds', () => {
  it('a growing context gives the trajectory its inline ids give, positions counted from the added ids', () => {
    const p0 = range(1, 300);
    const a0 = range(5000, 20);
    const p1 = [...p0, ...a0, ...range(400, 250)];
    const a1 = range(6000, 7);
    const p2 = [...p1, ...a1, ...range(900, 3)];
    const a2 = [7000];
    const p3 = [...p2, ...a2];
    const a3 = range(8000, 2);
    const { journaled, inline } = both([
      { prompt: ids(p0), answer: a0 },
      { prompt: ids(p1), answer: a1 },
      { prompt: ids(p2), answer: a2 },
      // Nothing added: the prompt is the previous prompt and answer exactly.
      { prompt: ids(p3), answer: a3 },
    ]);
    expect(journaled).toHaveLength(1);
    expect(journaled.map(shape)).toEqual(inline.map(shape));
    expect(journaled[0].token_ids).toEqual([...p3, ...a3]);
    expect(journaled[0].turns.map((x) => [x.response_start, x.response_end])).toEqual([
      [300, 320],
      [570, 577],
      [580, 581],
      [581, 583],
    ]);
  });

  it('a prompt whose added part is not an int array has no ids, as when read whole, and breaks nothing after it', () => {
    const p0 = range(1, 50);
    const a0 = [100, 101];
    const bad = `[${[...p0, ...a0].join(',')},1.5,7]`;
    const p2 = [...p0, ...a0, 9, 9];
    const { journaled, inline, unmerged } = both([
      { prompt: ids(p0), answer: a0 },
      { prompt: bad, answer: [200] },
      { prompt: ids(p2), answer: [300] },
    ]);
    expect(unmerged[0]).toEqual(unmerged[1]);
    expect(unmerged[0]).toEqual([{ transition_id: 'r/0/1', reason: 'no_token_ids' }]);
    expect(journaled.map(shape)).toEqual(inline.map(shape));
    expect(journaled[0].token_ids).toEqual([...p2, 300]);
  });

  it.each([
    ['the first prompt', 0],
    ["an earlier call's answer", 1],
    ['what the last prompt adds', 2],
  ])('finds image placeholders in %s (the trajectory then fails closed: no image in its request)', (_where, at) => {
    const p0 = [1, 2, ...(at === 0 ? [IMAGE] : [1516550]), 3];
    const a0 = at === 1 ? [10, IMAGE] : [10, 11];
    const p1 = [...p0, ...a0, ...(at === 2 ? [IMAGE, 4] : [15165, 4])];
    const { journaled, inline } = both([
      { prompt: ids(p0), answer: a0 },
      { prompt: ids(p1), answer: [20] },
    ]);
    expect(journaled.map(shape)).toEqual(inline.map(shape));
    expect(journaled[0].images_complete).toBe(false);
    expect(journaled[0].images_error).toMatch(/placeholder/);
  });

  it('finds no placeholders where the image token only begins or ends longer numbers', () => {
    const p0 = [1, 1516550, 3];
    const p1 = [...p0, 10, 11, 2151655];
    const { journaled, inline } = both([
      { prompt: ids(p0), answer: [10, 11] },
      { prompt: ids(p1), answer: [20] },
    ]);
    expect(journaled.map(shape)).toEqual(inline.map(shape));
    expect(journaled[0].images_error ?? null).toBeNull();
  });
});
