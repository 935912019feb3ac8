import type { CallRecord, ChoiceCapture, ClosedEpisode, Trajectory } from '../../../src/model/records';
import { buildEpisode, type EpisodeFacts, type TransitionOptions } from '../../../src/processors/rewards/transitions';
import { TransitionWriter } from '../../../src/exporters/transition-json';
import { materializeTrajectory, trajectoryJson } from '../../../src/exporters/trajectory-json';
import { decodeTrajectory, encodeTrajectory } from '../../../src/exporters/kafka/encoding';
import { callRecord, corr, toolSpan } from '../../support/records';

/** Segments of an attempt's calls, built from inline ids (the journaled path is covered end to end). */

const options: TransitionOptions = {
  credit: { mode: 'identical', gamma: 1 } as TransitionOptions['credit'],
  airWeight: 0.5,
  air: ({ outcome }) => (outcome === 'ok' ? 0.2 : -0.4),
  includeAgents: [],
  excludeAgents: [],
};
const writer = new TransitionWriter(() => {
  throw new Error('no journal');
});

function choice(index: number, response: number[], extra: Partial<ChoiceCapture> = {}): ChoiceCapture {
  return {
    index,
    finishReason: 'stop',
    responseTokenIds: response,
    responseLogprobs: response.map((id) => -id / 1000),
    promptTokenIds: null,
    toolCalls: [],
    ...extra,
  };
}

function call(seq: number, prompt: number[] | null, responses: number[][], extra: Partial<CallRecord> = {}): CallRecord {
  return callRecord('r', seq, 1000 + seq * 10, { promptTokenIds: prompt, choices: responses.map((r, i) => choice(i, r)), ...extra });
}

function build(calls: CallRecord[], extra: Partial<EpisodeFacts> = {}): { closed: ClosedEpisode; trajectories: Trajectory[] } {
  const facts: EpisodeFacts = {
    rolloutId: 'r',
    attemptId: '0',
    groupId: 'g',
    calls,
    toolSpans: [],
    rewards: [],
    finalReward: 1,
    startedAt: 1000,
    endedAt: 2000,
    ...extra,
  };
  const closed = buildEpisode(facts, 'completed', options);
  return { closed, trajectories: closed.trajectories.map((t) => materializeTrajectory(writer, t)) };
}

/** The positions where the mask is 1, and the ids there. */
const sampled = (t: Trajectory) => t.token_ids.filter((_, i) => t.loss_mask[i] === 1);

describe('trajectories: how calls become segments', () => {
  it('merges calls whose prompts continue the one before into one row: the last prompt and answer, each answer masked in', () => {
    const { closed, trajectories } = build([
      call(0, [1, 2, 3], [[10, 11]]),
      call(1, [1, 2, 3, 10, 11, 4, 5], [[12]]),
      call(2, [1, 2, 3, 10, 11, 4, 5, 12, 6], [[13, 14, 15]]),
    ]);
    expect(trajectories).toHaveLength(1);
    const [t] = trajectories;
    expect(t.trajectory_id).toBe('r/0/s0');
    expect(t.token_ids).toEqual([1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14, 15]);
    expect(t.loss_mask).toEqual([0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]);
    expect(t.logprobs).toEqual([0, 0, 0, -0.01, -0.011, 0, 0, -0.012, 0, -0.013, -0.014, -0.015]);
    expect(t.prompt_length).toBe(3);
    expect(t.turns.map((x) => [x.transition_id, x.response_start, x.response_end])).toEqual([
      ['r/0/0', 3, 5],
      ['r/0/1', 7, 8],
      ['r/0/2', 9, 12],
    ]);
    // The final reward once, on the last sampled token.
    expect(t.token_rewards).toEqual([{ position: 11, value: 1 }]);
    expect(t.reward).toBe(1);
    expect([t.segment, t.segments, t.start_reason, t.parent_trajectory_id]).toEqual([0, 1, 'first', null]);
    expect(closed.episode.trajectory_ids).toEqual(['r/0/s0']);
    expect(closed.episode.unmerged_calls).toEqual([]);
  });

  it('places AIR rewards (weighted) on the last sampled token of their call, the final reward on the segment’s last', () => {
    const tc = [{ id: 'call_1', name: 'calculator', arguments: '{}' }];
    const withTool = (seq: number, prompt: number[], response: number[]) =>
      callRecord('r', seq, 1000 + seq * 10, { promptTokenIds: prompt, choices: [choice(0, response, { toolCalls: tc, finishReason: 'tool_calls' })] });
    const { trajectories } = build([withTool(0, [1], [10, 11]), withTool(1, [1, 10, 11, 2], [12])], {
      toolSpans: [toolSpan('r', 'a'.repeat(16), 1000, { toolCallId: 'call_1' })],
    });
    const [t] = trajectories;
    // call 0's tool call joined (ok: 0.2 × 0.5); call 1's had no span (missing: -0.4 × 0.5), plus the final 1.
    expect(t.token_rewards).toEqual([
      { position: 2, value: 0.1 },
      { position: 4, value: -0.2 + 1 },
    ]);
    expect(t.reward).toBeCloseTo(0.9, 12);
    for (const r of t.token_rewards) expect(t.loss_mask[r.position]).toBe(1);
  });

  it('starts a new segment where a prompt does not continue (a re-rendered history), linked to the one before', () => {
    const { trajectories } = build([call(0, [1, 2], [[10]]), call(1, [1, 2, 99, 3], [[11]]), call(2, [1, 2, 99, 3, 11, 4], [[12]])]);
    expect(trajectories.map((t) => [t.trajectory_id, t.start_reason, t.parent_trajectory_id, t.turns.length])).toEqual([
      ['r/0/s0', 'first', null, 1],
      ['r/0/s1', 'diverged', 'r/0/s0', 2],
    ]);
    expect(trajectories[1].token_ids).toEqual([1, 2, 99, 3, 11, 4, 12]);
    expect(sampled(trajectories[1])).toEqual([11, 12]);
    // Each segment carries the final reward on its own last sampled token.
    expect(trajectories.map((t) => t.token_rewards)).toEqual([[{ position: 2, value: 1 }], [{ position: 6, value: 1 }]]);
    expect(trajectories.every((t) => t.segments === 2)).toBe(true);
  });

  it('keeps interleaved agents of one rollout in a segment each (a call continues any earlier segment)', () => {
    const a = (seq: number, prompt: number[], response: number[]) =>
      callRecord('r', seq, 1000 + seq, { correlation: corr('r', { agentName: 'planner' }), promptTokenIds: prompt, choices: [choice(0, response)] });
    const b = (seq: number, prompt: number[], response: number[]) =>
      callRecord('r', seq, 1000 + seq, { correlation: corr('r', { agentName: 'coder' }), promptTokenIds: prompt, choices: [choice(0, response)] });
    const { trajectories, closed } = build([a(0, [1], [10]), b(1, [7], [20]), a(2, [1, 10, 2], [11]), b(3, [7, 20, 8], [21]), a(4, [1, 10, 2, 11, 3], [12])]);
    expect(trajectories.map((t) => [t.agent_name, t.start_reason, t.turns.map((x) => x.seq)])).toEqual([
      ['planner', 'first', [0, 2, 4]],
      ['coder', 'other_agent', [1, 3]],
    ]);
    expect(trajectories[1].parent_trajectory_id).toBe('r/0/s0');
    expect(closed.episode.unmerged_calls).toEqual([]);
  });

  it('replaces a call retried with the same prompt by the retry, and says so', () => {
    const { trajectories, closed } = build([call(0, [1, 2], [[10]]), call(1, [1, 2], [[11]]), call(2, [1, 2, 11, 3], [[12]])]);
    expect(trajectories).toHaveLength(1);
    expect(trajectories[0].turns.map((t) => t.seq)).toEqual([1, 2]);
    expect(closed.episode.unmerged_calls).toEqual([{ transition_id: 'r/0/0', reason: 'retried' }]);
  });

  it('continues an n > 1 call from the choice the next call extends; the other choices are left out', () => {
    const { trajectories, closed } = build([call(0, [1], [[10], [20]]), call(1, [1, 20, 2], [[21]]), call(2, [1, 20, 2, 21, 3], [[30], [31]])]);
    expect(trajectories).toHaveLength(1);
    const t = trajectories[0];
    expect(t.turns.map((x) => [x.transition_id, x.choice_index])).toEqual([
      ['r/0/0.1', 1],
      ['r/0/1', 0],
      ['r/0/2.0', 0],
    ]);
    expect(sampled(t)).toEqual([20, 21, 30]);
    expect(closed.episode.unmerged_calls).toEqual([
      { transition_id: 'r/0/0.0', reason: 'other_choice' },
      { transition_id: 'r/0/2.1', reason: 'other_choice' },
    ]);
  });

  it('leaves out calls that failed, were cut, or have no ids, without breaking the segment', () => {
    const { trajectories, closed } = build([
      call(0, [1], [[10]]),
      call(1, null, [], { status: 'error', httpStatus: 500, error: 'boom', choices: [] }),
      call(2, null, [], { choices: [{ ...choice(0, []), responseTokenIds: null }] }),
      call(3, [1, 10, 2], [[11]], { truncated: true }),
      call(4, [1, 10, 2], [[]]),
      call(5, [1, 10, 2], [[12]]),
    ]);
    expect(trajectories).toHaveLength(1);
    expect(trajectories[0].turns.map((t) => t.seq)).toEqual([0, 5]);
    expect(closed.episode.unmerged_calls).toEqual([
      { transition_id: 'r/0/1', reason: 'not_ok' },
      { transition_id: 'r/0/2', reason: 'no_token_ids' },
      { transition_id: 'r/0/3', reason: 'truncated' },
      { transition_id: 'r/0/4', reason: 'empty_response' },
    ]);
  });

  it('links a subagent rollout to the parent call that spawned it', () => {
    const child = callRecord('child', 0, 1000, {
      correlation: corr('child', { parentRolloutId: 'parent', parentAttemptId: '0', parentSeq: 3 }),
      promptTokenIds: [5],
      choices: [choice(0, [6])],
    });
    const closed = buildEpisode(
      { rolloutId: 'child', attemptId: '0', groupId: null, calls: [child], toolSpans: [], rewards: [], finalReward: null, startedAt: 0, endedAt: 1 },
      'completed',
      options,
    );
    const t = materializeTrajectory(writer, closed.trajectories[0]);
    expect([t.parent_rollout_id, t.parent_attempt_id, t.parent_transition_id, t.parent_trajectory_id]).toEqual(['parent', '0', 'parent/0/3', null]);
    expect(t.token_rewards).toEqual([]);
    expect(t.reward).toBe(0);
  });

  it('writes null logprobs when no call had any, and 0 on the sampled ids of a call without them', () => {
    const none = build([call(0, [1], [[10]], { choices: [{ ...choice(0, [10]), responseLogprobs: null }] })]);
    expect(none.trajectories[0].logprobs).toBeNull();
    const some = build([call(0, [1], [[10]], { choices: [{ ...choice(0, [10]), responseLogprobs: null }] }), call(1, [1, 10, 2], [[11]])]);
    expect(some.trajectories[0].logprobs).toEqual([0, 0, 0, -0.011]);
    expect(some.trajectories[0].turns.map((t) => t.has_logprobs)).toEqual([false, true]);
  });

  it('finds no segments when only transitions are exported', () => {
    const closed = buildEpisode(
      {
        rolloutId: 'r',
        attemptId: '0',
        groupId: 'g',
        calls: [call(0, [1], [[10]]), call(1, [1, 10, 2], [[11]])],
        toolSpans: [],
        rewards: [],
        finalReward: 1,
        startedAt: 0,
        endedAt: 1,
      },
      'completed',
      { ...options, exported: ['transitions'] },
    );
    expect([closed.trajectories, closed.episode.trajectory_ids, closed.episode.unmerged_calls, closed.episode.exported]).toEqual([[], [], [], ['transitions']]);
    expect(closed.transitions).toHaveLength(2);
  });

  it('encodes the same record as JSON (ids spliced as text) and as protobuf', () => {
    const { closed, trajectories } = build([call(0, [1, 2], [[10]]), call(1, [1, 2, 10, 3], [[11, 12]]), call(2, [9], [[13]])]);
    closed.trajectories.forEach((t, i) => {
      expect(JSON.parse(trajectoryJson(writer, t).toString('utf8'))).toEqual(trajectories[i]);
      expect(decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json')).toEqual(trajectories[i]);
      expect(decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf')).toEqual(trajectories[i]);
    });
  });
});
