import { EpisodeAssembler } from '../../../src/processors/episodes/assembler';
import type { CallRecord, Correlation } from '../../../src/model/records';

const episodes = { idle_timeout_ms: 1000, tool_span_wait_ms: 100, max_open_episodes: 3, closed_window: 12, tick_interval_ms: 10 };
const make = (mode: 'identical' | 'last' | 'discounted' = 'identical') => new EpisodeAssembler({ episodes, credit: { mode, gamma: 0.5 } });

const corr = (rolloutId: string, extra: Partial<Correlation> = {}): Correlation => ({
  rolloutId,
  attemptId: '0',
  groupId: null,
  agentName: null,
  source: 'path',
  ...extra,
});

function call(rolloutId: string, seq: number, at: number, extra: Partial<CallRecord> = {}): CallRecord {
  return {
    type: 'call',
    correlation: corr(rolloutId),
    seq,
    api: 'chat.completions',
    model: 'm',
    traceId: null,
    spanId: null,
    request: {},
    response: {},
    streamed: false,
    status: 'ok',
    httpStatus: 200,
    error: null,
    usage: null,
    promptTokenIds: [1, 2],
    choices: [{ index: 0, finishReason: 'stop', responseTokenIds: [3], responseLogprobs: [-0.1], promptTokenIds: null, toolCalls: [] }],
    injected: [],
    truncated: false,
    startedAt: at - 5,
    endedAt: at,
    ttftMs: null,
    latencyMs: 5,
    ...extra,
  };
}

describe('episode assembler', () => {
  it('closes on a final reward only after in-flight calls finish and the tool-span wait passed', () => {
    const a = make();
    a.apply({ type: 'call_start', correlation: corr('r'), seq: 0, traceId: null, at: 0 });
    a.apply(call('r', 0, 10));
    a.apply({ type: 'call_start', correlation: corr('r'), seq: 1, traceId: null, at: 20 });
    expect(a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'primary', final: true, at: 30, source: 'rollout_api' })).toEqual([]);
    expect(a.apply({ type: 'tick', at: 500 })).toEqual([]); // call 1 still in flight
    expect(a.apply(call('r', 1, 600))).toEqual([]); // wait for tool spans from its end
    expect(a.apply({ type: 'tick', at: 650 })).toEqual([]);
    const [closed] = a.apply({ type: 'tick', at: 700 });
    expect(closed.episode).toMatchObject({ rollout_id: 'r', episode_status: 'completed', final_reward: 1, transitions: 2, transition_ids: ['r/0/0', 'r/0/1'] });
    expect(a.openCount).toBe(0);
  });

  it('times out an idle episode with a null final reward', () => {
    const a = make();
    a.apply({ type: 'call_start', correlation: corr('r'), seq: 0, traceId: null, at: 0 });
    a.apply(call('r', 0, 10));
    expect(a.apply({ type: 'tick', at: 1009 })).toEqual([]);
    const [closed] = a.apply({ type: 'tick', at: 1010 });
    expect(closed.episode.episode_status).toBe('timed_out');
    expect(closed.transitions[0]).toMatchObject({ final_reward: null, credit: null, reward: 0, episode_status: 'timed_out' });
  });

  it('closes what is still open at shutdown as shutdown, and one whose close was asked for as completed', () => {
    const a = make();
    a.apply(call('r', 0, 10));
    a.apply(call('s', 0, 10));
    a.apply({ type: 'end', rolloutId: 's', attemptId: '0', at: 20 });
    const drained = a.drain(30).map((c) => a.build(c).episode);
    expect(drained.map((e) => [e.rollout_id, e.episode_status])).toEqual([
      ['r', 'shutdown'],
      ['s', 'completed'],
    ]);
  });

  it('does not time out while a call is in flight', () => {
    const a = make();
    a.apply({ type: 'call_start', correlation: corr('r'), seq: 0, traceId: null, at: 0 });
    expect(a.apply({ type: 'tick', at: 5000 })).toEqual([]);
  });

  it('orders transitions by seq whatever order calls end in', () => {
    const a = make();
    a.apply(call('r', 1, 10));
    a.apply(call('r', 0, 20));
    a.apply({ type: 'end', rolloutId: 'r', attemptId: '0', at: 30 });
    const [closed] = a.apply({ type: 'tick', at: 200 });
    expect(closed.transitions.map((t) => t.seq)).toEqual([0, 1]);
    expect(closed.transitions.map((t) => t.is_last)).toEqual([false, true]);
  });

  it('evicts the least recently active episode past max_open_episodes', () => {
    const a = make();
    a.apply(call('a', 0, 1));
    a.apply(call('b', 0, 2));
    a.apply(call('c', 0, 3));
    a.apply(call('a', 1, 4)); // a is now the most recent
    const closed = a.apply(call('d', 0, 5));
    expect(closed.map((c) => [c.episode.rollout_id, c.episode.episode_status])).toEqual([['b', 'evicted']]);
  });

  it('counts a reward for an episode already closed as late and drops it', () => {
    const late: string[] = [];
    const a = new EpisodeAssembler({ episodes, credit: { mode: 'identical', gamma: 0.5 }, onLate: (kind) => late.push(kind) });
    a.apply(call('r', 0, 1));
    a.apply({ type: 'end', rolloutId: 'r', attemptId: '0', at: 2 });
    expect(a.apply({ type: 'tick', at: 200 })).toHaveLength(1);
    expect(a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'p', final: true, at: 300, source: 'rollout_api' })).toEqual([]);
    expect(late).toEqual(['reward']);
    expect(a.openCount).toBe(0);
  });

  it('tells whether a reward would reach an episode: open, closed (how, when, with what reward), or unknown', () => {
    const late: string[] = [];
    const a = new EpisodeAssembler({ episodes, credit: { mode: 'identical', gamma: 1 }, onLate: (kind, r) => late.push(`${kind}:${r}`) });
    expect(a.standing('r', '0')).toEqual({ state: 'unknown' });
    a.apply(call('r', 0, 1));
    expect(a.standing('r', '0')).toEqual({ state: 'open' });
    expect(a.standing('r', '1')).toEqual({ state: 'unknown' });
    a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 0.5, name: 'p', final: true, at: 2, source: 'rollout_api' });
    expect(a.standing('r', '0')).toEqual({ state: 'open' }); // waiting tool_span_wait_ms: a reward still applies
    a.apply({ type: 'tick', at: 200 });
    expect(a.standing('r', '0')).toEqual({ state: 'closed', status: 'completed', at: 200, finalReward: 0.5 });
    a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'p', final: true, at: 300, source: 'rollout_api' });
    a.apply(call('r', 1, 400));
    expect(late).toEqual(['reward:r', 'call:r']);
  });

  it('remembers the last closed_window closed episodes, not more', () => {
    const a = make();
    for (let i = 0; i < 13; i++) {
      a.apply(call(`r${i}`, 0, i));
      a.apply({ type: 'end', rolloutId: `r${i}`, attemptId: '0', at: i });
      a.apply({ type: 'tick', at: i + 200 });
    }
    expect(a.standing('r0', '0')).toEqual({ state: 'unknown' });
    expect(a.standing('r1', '0')).toMatchObject({ state: 'closed' });
    expect(a.standing('r12', '0')).toMatchObject({ state: 'closed', status: 'completed' });
  });

  it('does not report late records while replaying (the run that wrote the journal did)', () => {
    const late: string[] = [];
    const a = new EpisodeAssembler({ episodes, credit: { mode: 'identical', gamma: 1 }, onLate: (kind) => late.push(kind) });
    a.apply(call('r', 0, 1));
    a.apply({ type: 'end', rolloutId: 'r', attemptId: '0', at: 2 });
    a.apply({ type: 'tick', at: 200 });
    a.replaying = true;
    a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'p', final: true, at: 300, source: 'rollout_api' });
    expect(late).toEqual([]);
  });

  it('keeps a late call in a new episode rather than losing it', () => {
    const late: string[] = [];
    const a = new EpisodeAssembler({ episodes, credit: { mode: 'identical', gamma: 0.5 }, onLate: (kind) => late.push(kind) });
    a.apply(call('r', 0, 1));
    a.apply({ type: 'end', rolloutId: 'r', attemptId: '0', at: 2 });
    a.apply({ type: 'tick', at: 200 });
    a.apply(call('r', 1, 300));
    expect(late).toEqual(['call']);
    expect(a.openCount).toBe(1);
  });

  it('marks continues_previous when the prompt extends the previous prompt + response', () => {
    const a = make();
    a.apply(call('r', 0, 1, { promptTokenIds: [1, 2] }));
    a.apply(call('r', 1, 2, { promptTokenIds: [1, 2, 3, 9] }));
    a.apply(call('r', 2, 3, { promptTokenIds: [7] }));
    a.apply({ type: 'end', rolloutId: 'r', attemptId: '0', at: 4 });
    const [closed] = a.apply({ type: 'tick', at: 500 });
    expect(closed.transitions.map((t) => t.continues_previous)).toEqual([false, true, false]);
  });

  it('is deterministic: the same events give the same transitions', () => {
    const events = [
      call('r', 0, 1),
      call('r', 1, 2),
      { type: 'reward' as const, rolloutId: 'r', attemptId: '0', value: 0.5, name: 'p', final: true, at: 3, source: 'rollout_api' as const },
      { type: 'tick' as const, at: 1000 },
    ];
    const run = () => {
      const a = make('discounted');
      return events.flatMap((e) => a.apply(e));
    };
    expect(run()).toEqual(run());
    expect(run()[0].transitions.map((t) => t.reward)).toEqual([0.25, 0.5]);
  });
});
