import type { EpisodeSummary, Transition } from '../../src/model/records';
import { GroupAssembler, type GroupEvent } from '../../src/trainer/groups';

const pos = (offset: number, topic = 't') => ({ topic, partition: 0, offset });

function transition(rollout: string, seq: number, group: string | null, extra: Partial<Transition> = {}): Transition {
  return {
    transition_id: `${rollout}/0/${seq}`,
    rollout_id: rollout,
    attempt_id: '0',
    group_id: group,
    seq,
    prompt_token_ids: [1, 2, 3 + seq],
    response_token_ids: [7, 8, 9],
    response_logprobs: [-0.1, -0.2, -0.3],
    reward: 0.5,
    is_last: false,
    policy_version: '3',
    ...extra,
  } as Transition;
}

function episode(rollout: string, group: string | null, n: number, reward = 1): EpisodeSummary {
  return {
    schema: 'lightning.episode.v1',
    rollout_id: rollout,
    attempt_id: '0',
    group_id: group,
    episode_status: 'completed',
    final_reward: reward,
    rewards: [],
    credit_mode: 'identical',
    transitions: n,
    transition_ids: Array.from({ length: n }, (_, i) => `${rollout}/0/${i}`),
    policy_versions: ['3'],
    policy_version_lag: 0,
    started_at: '',
    ended_at: '',
  };
}

const groups = (events: GroupEvent[]) => events.filter((e) => e.kind === 'group');

describe('GroupAssembler', () => {
  it('emits a group once N episodes and all their transitions are in, in any order, ignoring duplicates', () => {
    const a = new GroupAssembler({ groupSize: 2, timeoutMs: 10_000 });
    expect(a.addEpisode(episode('r1', 'g', 2), pos(0, 'e'), 0)).toEqual([]); // before its transitions
    expect(a.addTransition(transition('r1', 0, 'g'), pos(0), 0)).toEqual([]);
    expect(a.addTransition(transition('r1', 0, 'g'), pos(1), 0)).toEqual([]); // duplicate
    expect(a.addTransition(transition('r1', 1, 'g', { is_last: true, reward: 1.1 }), pos(2), 0)).toEqual([]);
    expect(a.addTransition(transition('r2', 0, 'g', { reward: 0 }), pos(3), 0)).toEqual([]);
    expect(a.addEpisode(episode('r1', 'g', 2), pos(1, 'e'), 0)).toEqual([]); // duplicate episode
    const [ev] = a.addEpisode(episode('r2', 'g', 1, 0), pos(2, 'e'), 0);
    expect(ev.kind).toBe('group');
    const g = (ev as Extract<GroupEvent, { kind: 'group' }>).batch;
    expect(g.uid).toBe('g');
    expect(g.batch.transition_id).toEqual(['r1/0/0', 'r1/0/1', 'r2/0/0']);
    expect(g.batch.uid).toEqual(['g', 'g', 'g']);
    expect(g.batch.response_mask).toEqual([
      [1, 1, 1],
      [1, 1, 1],
      [1, 1, 1],
    ]);
    expect(g.batch.token_level_scores).toEqual([
      [0, 0, 0.5],
      [0, 0, 1.1],
      [0, 0, 0],
    ]);
    expect(g.batch.rollout_log_probs[0]).toEqual([-0.1, -0.2, -0.3]);
    expect(g.episodes.map((e) => e.final_reward)).toEqual([1, 0]);
    // Nothing pending any more; a redelivery of the group is ignored.
    expect(a.lowestPending().size).toBe(0);
    expect(groups(a.addTransition(transition('r1', 0, 'g'), pos(4), 0))).toEqual([]);
    expect(a.addEpisode(episode('r1', 'g', 2), pos(3, 'e'), 0).map((e) => e.kind)).toEqual([]);
    expect(a.addEpisode(episode('r9', 'g', 0), pos(4, 'e'), 0).map((e) => e.kind)).toEqual(['late']);
  });

  it('never emits a group named in `done` (state from a previous run)', () => {
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 10_000 }, new Set(['g']));
    a.addTransition(transition('r1', 0, 'g'), pos(0), 0);
    expect(groups(a.addEpisode(episode('r1', 'g', 1), pos(0, 'e'), 0))).toEqual([]);
  });

  it('keeps offsets of pending records uncommitted, and gives up on a group after the timeout', () => {
    const a = new GroupAssembler({ groupSize: 2, timeoutMs: 1000 });
    a.addTransition(transition('r1', 0, 'g'), pos(5), 0);
    a.addEpisode(episode('r1', 'g', 1), pos(7, 'e'), 0);
    expect(a.lowestPending()).toEqual(
      new Map([
        ['t\u00000', 5],
        ['e\u00000', 7],
      ]),
    );
    expect(a.tick(999)).toEqual([]);
    expect(a.tick(1000)).toEqual([{ kind: 'incomplete', uid: 'g', episodes: 1, waitedMs: 1000 }]);
    expect(a.lowestPending().size).toBe(0);
    expect(a.done.has('g')).toBe(true);
  });

  it('skips rows without token ids and counts them', () => {
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
    a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: null }), pos(0), 0);
    a.addTransition(transition('r1', 1, 'g'), pos(1), 0);
    const [ev] = a.addEpisode(episode('r1', 'g', 2), pos(0, 'e'), 0);
    const g = (ev as Extract<GroupEvent, { kind: 'group' }>).batch;
    expect([g.batch.transition_id, g.skipped_no_token_ids]).toEqual([['r1/0/1'], 1]);
  });

  describe('prompt deltas', () => {
    const delta = (previous: string, prefix_length: number, suffix: number[]) => ({
      prompt_token_ids: null,
      prompt_token_ids_delta: { previous_transition_id: previous, prefix_length, suffix },
    });

    it('rebuilds each full prompt from the previous transition of the episode: its prompt, its response, then the suffix', () => {
      const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
      expect(a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: [1, 2], response_token_ids: [3, 4] }), pos(0), 0)).toEqual([]);
      expect(a.addTransition(transition('r1', 1, 'g', { response_token_ids: [6], ...delta('r1/0/0', 4, [5]) } as Partial<Transition>), pos(1), 0)).toEqual([]);
      // A delta on a delta: the previous prompt is already whole.
      a.addTransition(transition('r1', 2, 'g', { response_token_ids: [8], ...delta('r1/0/1', 6, [7]) } as Partial<Transition>), pos(2), 0);
      const [ev] = a.addEpisode(episode('r1', 'g', 3), pos(0, 'e'), 0);
      const g = (ev as Extract<GroupEvent, { kind: 'group' }>).batch;
      expect(g.batch.prompt_ids).toEqual([
        [1, 2],
        [1, 2, 3, 4, 5],
        [1, 2, 3, 4, 5, 6, 7],
      ]);
      expect(g.skipped_no_token_ids).toBe(0);
    });

    it('reports a delta whose previous transition is not held or whose prefix length disagrees, and leaves that row out', () => {
      const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
      a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: [1, 2], response_token_ids: [3] }), pos(0), 0);
      expect(a.addTransition(transition('r1', 1, 'g', delta('r1/0/0', 9, [4]) as Partial<Transition>), pos(1), 0)).toEqual([
        { kind: 'unresolved_delta', transition_id: 'r1/0/1', reason: 'prefix_length 9 but the previous prompt and response hold 3 ids' },
      ]);
      expect(a.addTransition(transition('r1', 2, 'g', delta('r1/0/7', 3, [4]) as Partial<Transition>), pos(2), 0)).toEqual([
        { kind: 'unresolved_delta', transition_id: 'r1/0/2', reason: 'previous transition r1/0/7 is not held' },
      ]);
      const [ev] = a.addEpisode(episode('r1', 'g', 3), pos(0, 'e'), 0);
      const g = (ev as Extract<GroupEvent, { kind: 'group' }>).batch;
      expect([g.batch.transition_id, g.skipped_no_token_ids]).toEqual([['r1/0/0'], 2]);
    });

    it('ignores a redelivered delta transition it already holds', () => {
      const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
      a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: [1], response_token_ids: [2] }), pos(0), 0);
      const t1 = transition('r1', 1, 'g', delta('r1/0/0', 2, [3]) as Partial<Transition>);
      a.addTransition(t1, pos(1), 0);
      expect(a.addTransition(t1, pos(2), 0)).toEqual([]);
      const [ev] = a.addEpisode(episode('r1', 'g', 2), pos(0, 'e'), 0);
      expect((ev as Extract<GroupEvent, { kind: 'group' }>).batch.batch.prompt_ids).toEqual([[1], [1, 2, 3]]);
    });
  });
});
