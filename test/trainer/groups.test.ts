import type { EpisodeSummary, Trajectory, Transition } from '../../src/model/records';
import { GroupAssembler, type GroupBatch, type GroupEvent, type TrajectoryGroupBatch } from '../../src/trainer/groups';

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
    trajectory_ids: [],
    unmerged_calls: [],
    exported: ['transitions'],
    policy_versions: ['3'],
    policy_version_lag: 0,
    started_at: '',
    ended_at: '',
  };
}

const groups = (events: GroupEvent[]) => events.filter((e) => e.kind === 'group');
const perCall = (ev: GroupEvent) => (ev as Extract<GroupEvent, { kind: 'group' }>).batch as GroupBatch;
const ofTrajectories = (ev: GroupEvent) => (ev as Extract<GroupEvent, { kind: 'group' }>).batch as TrajectoryGroupBatch;

describe('GroupAssembler, per-call rows', () => {
  it('emits a group once N episodes and all their transitions are in, in any order, ignoring duplicates', () => {
    const a = new GroupAssembler({ groupSize: 2, timeoutMs: 10_000, rows: 'transitions' });
    expect(a.addEpisode(episode('r1', 'g', 2), pos(0, 'e'), 0)).toEqual([]); // before its transitions
    expect(a.addTransition(transition('r1', 0, 'g'), pos(0), 0)).toEqual([]);
    expect(a.addTransition(transition('r1', 0, 'g'), pos(1), 0)).toEqual([]); // duplicate
    expect(a.addTransition(transition('r1', 1, 'g', { is_last: true, reward: 1.1 }), pos(2), 0)).toEqual([]);
    expect(a.addTransition(transition('r2', 0, 'g', { reward: 0 }), pos(3), 0)).toEqual([]);
    expect(a.addEpisode(episode('r1', 'g', 2), pos(1, 'e'), 0)).toEqual([]); // duplicate episode
    const [ev] = a.addEpisode(episode('r2', 'g', 1, 0), pos(2, 'e'), 0);
    expect(ev.kind).toBe('group');
    const g = perCall(ev);
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
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 10_000, rows: 'transitions' }, new Set(['g']));
    a.addTransition(transition('r1', 0, 'g'), pos(0), 0);
    expect(groups(a.addEpisode(episode('r1', 'g', 1), pos(0, 'e'), 0))).toEqual([]);
  });

  it('keeps offsets of pending records uncommitted, and gives up on a group after the timeout', () => {
    const a = new GroupAssembler({ groupSize: 2, timeoutMs: 1000, rows: 'transitions' });
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
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000, rows: 'transitions' });
    a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: null }), pos(0), 0);
    a.addTransition(transition('r1', 1, 'g'), pos(1), 0);
    const [ev] = a.addEpisode(episode('r1', 'g', 2), pos(0, 'e'), 0);
    const g = perCall(ev);
    expect([g.batch.transition_id, g.skipped_no_token_ids]).toEqual([['r1/0/1'], 1]);
  });

  describe('prompt deltas', () => {
    const delta = (previous: string, prefix_length: number, suffix: number[]) => ({
      prompt_token_ids: null,
      prompt_token_ids_delta: { previous_transition_id: previous, prefix_length, suffix },
    });

    it('rebuilds each full prompt from the previous transition of the episode: its prompt, its response, then the suffix', () => {
      const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000, rows: 'transitions' });
      expect(a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: [1, 2], response_token_ids: [3, 4] }), pos(0), 0)).toEqual([]);
      expect(a.addTransition(transition('r1', 1, 'g', { response_token_ids: [6], ...delta('r1/0/0', 4, [5]) } as Partial<Transition>), pos(1), 0)).toEqual([]);
      // A delta on a delta: the previous prompt is already whole.
      a.addTransition(transition('r1', 2, 'g', { response_token_ids: [8], ...delta('r1/0/1', 6, [7]) } as Partial<Transition>), pos(2), 0);
      const [ev] = a.addEpisode(episode('r1', 'g', 3), pos(0, 'e'), 0);
      const g = perCall(ev);
      expect(g.batch.prompt_ids).toEqual([
        [1, 2],
        [1, 2, 3, 4, 5],
        [1, 2, 3, 4, 5, 6, 7],
      ]);
      expect(g.skipped_no_token_ids).toBe(0);
    });

    it('reports a delta whose previous transition is not held or whose prefix length disagrees, and leaves that row out', () => {
      const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000, rows: 'transitions' });
      a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: [1, 2], response_token_ids: [3] }), pos(0), 0);
      expect(a.addTransition(transition('r1', 1, 'g', delta('r1/0/0', 9, [4]) as Partial<Transition>), pos(1), 0)).toEqual([
        { kind: 'unresolved_delta', transition_id: 'r1/0/1', reason: 'prefix_length 9 but the previous prompt and response hold 3 ids' },
      ]);
      expect(a.addTransition(transition('r1', 2, 'g', delta('r1/0/7', 3, [4]) as Partial<Transition>), pos(2), 0)).toEqual([
        { kind: 'unresolved_delta', transition_id: 'r1/0/2', reason: 'previous transition r1/0/7 is not held' },
      ]);
      const [ev] = a.addEpisode(episode('r1', 'g', 3), pos(0, 'e'), 0);
      const g = perCall(ev);
      expect([g.batch.transition_id, g.skipped_no_token_ids]).toEqual([['r1/0/0'], 2]);
    });

    it('ignores a redelivered delta transition it already holds', () => {
      const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000, rows: 'transitions' });
      a.addTransition(transition('r1', 0, 'g', { prompt_token_ids: [1], response_token_ids: [2] }), pos(0), 0);
      const t1 = transition('r1', 1, 'g', delta('r1/0/0', 2, [3]) as Partial<Transition>);
      a.addTransition(t1, pos(1), 0);
      expect(a.addTransition(t1, pos(2), 0)).toEqual([]);
      const [ev] = a.addEpisode(episode('r1', 'g', 2), pos(0, 'e'), 0);
      expect(perCall(ev).batch.prompt_ids).toEqual([[1], [1, 2, 3]]);
    });
  });
});

/** A trajectory of `rollout`: prompt [1, 2], two turns (ids 10-11 and 20), AIR on the first, the final reward on the last. */
function trajectory(rollout: string, segment: number, group: string | null, extra: Partial<Trajectory> = {}): Trajectory {
  return {
    schema: 'lightning.trajectory.v1',
    trajectory_id: `${rollout}/0/s${segment}`,
    rollout_id: rollout,
    attempt_id: '0',
    group_id: group,
    agent_name: null,
    segment,
    segments: 1,
    start_reason: 'first',
    parent_trajectory_id: null,
    parent_rollout_id: null,
    parent_attempt_id: null,
    parent_transition_id: null,
    prompt_length: 2,
    token_ids: [1, 2, 10, 11, 3, 20],
    loss_mask: [0, 0, 1, 1, 0, 1],
    logprobs: [0, 0, -0.1, -0.2, 0, -0.3],
    turns: [],
    token_rewards: [
      { position: 3, value: 0.1 },
      { position: 5, value: 1 },
    ],
    reward: 1.1,
    final_reward: 1,
    episode_status: 'completed',
    policy_versions: ['3'],
    started_at: '',
    ended_at: '',
    ...extra,
  };
}

function trajectoryEpisode(rollout: string, group: string | null, segments: number, extra: Partial<EpisodeSummary> = {}): EpisodeSummary {
  return {
    ...episode(rollout, group, 2),
    trajectory_ids: Array.from({ length: segments }, (_, i) => `${rollout}/0/s${i}`),
    exported: ['trajectories'],
    ...extra,
  };
}

describe('GroupAssembler, trajectory rows (the default)', () => {
  it('emits one row per trajectory: the first prompt, the rest as response with its mask, scores and logprobs where the record puts them', () => {
    const a = new GroupAssembler({ groupSize: 2, timeoutMs: 10_000 });
    expect(a.rows).toBe('trajectories');
    expect(a.addTrajectory(trajectory('r2', 0, 'g'), pos(0), 0)).toEqual([]);
    expect(a.addEpisode(trajectoryEpisode('r2', 'g', 1, { unmerged_calls: [{ transition_id: 'r2/0/5', reason: 'not_ok' }] }), pos(0, 'e'), 0)).toEqual([]);
    a.addTrajectory(trajectory('r1', 0, 'g', { segments: 2 }), pos(1), 0);
    a.addTrajectory(trajectory('r1', 0, 'g', { segments: 2 }), pos(2), 0); // duplicate
    expect(a.addEpisode(trajectoryEpisode('r1', 'g', 2), pos(1, 'e'), 0)).toEqual([]); // s1 still missing
    const [ev] = a.addTrajectory(trajectory('r1', 1, 'g', { segments: 2, logprobs: null, token_rewards: [{ position: 5, value: 1 }], reward: 1 }), pos(3), 0);
    const g = ofTrajectories(ev);
    expect(g.rows).toBe('trajectories');
    expect(g.batch.trajectory_id).toEqual(['r1/0/s0', 'r1/0/s1', 'r2/0/s0']);
    expect(g.batch.prompt_ids).toEqual([
      [1, 2],
      [1, 2],
      [1, 2],
    ]);
    expect(g.batch.response_ids[0]).toEqual([10, 11, 3, 20]);
    expect(g.batch.response_mask[0]).toEqual([1, 1, 0, 1]);
    expect(g.batch.token_level_scores).toEqual([
      [0, 0.1, 0, 1],
      [0, 0, 0, 1],
      [0, 0.1, 0, 1],
    ]);
    expect(g.batch.rollout_log_probs).toEqual([[-0.1, -0.2, 0, -0.3], null, [-0.1, -0.2, 0, -0.3]]);
    expect(g.batch.is_last).toEqual([false, true, true]);
    expect(g.batch.reward).toEqual([1.1, 1, 1.1]);
    expect(g.unmerged_calls).toBe(1);
    expect(a.lowestPending().size).toBe(0);
    // A redelivered trajectory of a done group is ignored.
    expect(a.addTrajectory(trajectory('r1', 0, 'g'), pos(4), 0)).toEqual([]);
  });

  it('reports an episode whose trajectories were not exported (or that predates them) once, and never counts it', () => {
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
    const transitionsOnly = trajectoryEpisode('r1', 'g', 1, { exported: ['transitions'] });
    expect(a.addEpisode(transitionsOnly, pos(0, 'e'), 0)).toEqual([{ kind: 'not_exported', rollout_id: 'r1', attempt_id: '0', rows: 'trajectories' }]);
    expect(a.addEpisode(transitionsOnly, pos(1, 'e'), 0)).toEqual([]);
    const { trajectory_ids: _ids, unmerged_calls: _u, exported: _e, ...old } = episode('r2', 'g', 1);
    expect(a.addEpisode(old as EpisodeSummary, pos(2, 'e'), 0)).toEqual([{ kind: 'not_exported', rollout_id: 'r2', attempt_id: '0', rows: 'trajectories' }]);
    expect(a.pendingGroups).toBe(0);
    const perCallRows = new GroupAssembler({ groupSize: 1, timeoutMs: 1000, rows: 'transitions' });
    expect(perCallRows.addEpisode(trajectoryEpisode('r3', 'g', 1), pos(3, 'e'), 0)).toEqual([
      { kind: 'not_exported', rollout_id: 'r3', attempt_id: '0', rows: 'transitions' },
    ]);
    // A protobuf episode of a sidecar before trajectories: `exported` decodes empty, and it exported transitions.
    perCallRows.addTransition(transition('r4', 0, 'h'), pos(4), 0);
    expect(perCallRows.addEpisode({ ...episode('r4', 'h', 1), exported: [] }, pos(5, 'e'), 0).map((e) => e.kind)).toEqual(['group']);
    expect(a.addEpisode({ ...trajectoryEpisode('r5', 'h', 1), exported: [] }, pos(6, 'e'), 0).map((e) => e.kind)).toEqual(['not_exported']);
  });

  it('keeps offsets of held trajectories uncommitted and drops strays after the timeout', () => {
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
    a.addTrajectory(trajectory('r1', 0, 'g'), pos(5), 0);
    expect(a.lowestPending()).toEqual(new Map([['t\u00000', 5]]));
    expect(a.tick(1000)).toEqual([{ kind: 'orphaned', records: 1 }]);
    expect(a.lowestPending().size).toBe(0);
  });

  it('gives every row its sampling mask and flag only when a trajectory of the group has a mask, after the routing columns', () => {
    // r1: rows at 2-3, the last call (position 5) returned none; r2: every sampled position has its row; r3: no mask.
    const incomplete = { offsets: [0, 0, 0, 2, 3, 3, 3], ids: [10, 12, 11], missing: [[5, 6]] as [number, number][] };
    const complete = { offsets: [0, 0, 0, 1, 3, 3, 4], ids: [10, 11, 4, 20], missing: [] };
    const masked = (m: typeof incomplete, done: boolean): Partial<Trajectory> => ({
      sampling_mask: m,
      sampling_mask_coverage: done ? 1 : 2 / 3,
      sampling_mask_complete: done,
      sampling_mask_violations: 0,
    });
    const routed = {
      routed_experts: { dtype: 'uint8', shape: [5, 1, 1], data: 'AQEBAQE=', missing: [] },
      routing_coverage: 1,
      routing_complete: true,
    } as Partial<Trajectory>;
    const run = (extras: Partial<Trajectory>[]) => {
      const a = new GroupAssembler({ groupSize: extras.length, timeoutMs: 10_000 });
      const events = extras.flatMap((extra, i) => [
        ...a.addTrajectory(trajectory(`r${i + 1}`, 0, 'g', extra), pos(i), 0),
        ...a.addEpisode(trajectoryEpisode(`r${i + 1}`, 'g', 1), pos(i, 'e'), 0),
      ]);
      const [ev, ...more] = groups(events);
      expect(more).toEqual([]);
      return ofTrajectories(ev).batch;
    };
    const b = run([masked(incomplete, false), masked(complete, true), {}]);
    expect(b.sampling_mask).toEqual([incomplete, complete, null]);
    expect(b.sampling_mask_complete).toEqual([false, true, false]);
    expect(Object.keys(b).slice(-2)).toEqual(['sampling_mask', 'sampling_mask_complete']);
    expect(b).not.toHaveProperty('routed_experts');
    // With routing too: the mask columns come after the routing ones.
    const both = run([{ ...routed, ...masked(complete, true) }, {}]);
    expect(Object.keys(both).slice(-4)).toEqual(['routed_experts', 'routing_complete', 'sampling_mask', 'sampling_mask_complete']);
    expect([both.sampling_mask, both.sampling_mask_complete]).toEqual([
      [complete, null],
      [true, false],
    ]);
    // Without masks the batch is as before (a mode alone brings no columns).
    for (const none of [run([{}, {}]), run([{ logprobs_mode: 'processed_logprobs' }, routed])]) {
      expect(none).not.toHaveProperty('sampling_mask');
      expect(none).not.toHaveProperty('sampling_mask_complete');
    }
  });
});

describe('GroupAssembler: groups leave in partition order', () => {
  const groupOf = (events: GroupEvent[]) => events.filter((e) => e.kind === 'group').map((e) => ofTrajectories(e).uid);

  it('holds a complete group back while a group still being assembled has a record before its last one, then yields it', () => {
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
    a.addTrajectory(trajectory('h1', 0, 'h'), pos(0), 0); // h: its episode is still to come
    a.addTrajectory(trajectory('g1', 0, 'g'), pos(1), 0);
    expect(groupOf(a.addEpisode(trajectoryEpisode('g1', 'g', 1), pos(0, 'e'), 0))).toEqual([]);
    // Committing now would stop at h's record (offset 0), below g's: g waits.
    expect(a.lowestPending().get('t\u00000')).toBe(0);
    // Released together, in the order they completed.
    expect(groupOf(a.addEpisode(trajectoryEpisode('h1', 'h', 1), pos(1, 'e'), 0))).toEqual(['g', 'h']);
    expect(a.lowestPending().size).toBe(0);
  });

  it('yields a held group once the group before it is given up on', () => {
    const a = new GroupAssembler({ groupSize: 2, timeoutMs: 1000 });
    a.addTrajectory(trajectory('h1', 0, 'h'), pos(0), 0);
    a.addEpisode(trajectoryEpisode('h1', 'h', 1), pos(0, 'e'), 0); // h needs a second episode
    a.addTrajectory(trajectory('g1', 0, 'g'), pos(1), 10);
    a.addTrajectory(trajectory('g2', 0, 'g'), pos(2), 10);
    a.addEpisode(trajectoryEpisode('g1', 'g', 1), pos(1, 'e'), 10);
    expect(groupOf(a.addEpisode(trajectoryEpisode('g2', 'g', 1), pos(2, 'e'), 10))).toEqual([]);
    const events = a.tick(1000);
    expect(events.map((e) => e.kind)).toEqual(['incomplete', 'group']);
    expect(groupOf(events)).toEqual(['g']);
  });

  it('yields complete groups whose records interleave together, and a group before a pending one at once', () => {
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000 });
    a.addTrajectory(trajectory('x1', 0, 'x'), pos(0), 0);
    a.addTrajectory(trajectory('y1', 0, 'y'), pos(1), 0);
    a.addTrajectory(trajectory('x1', 1, 'x', { segments: 2 }), pos(2), 0);
    a.addTrajectory(trajectory('w1', 0, 'w'), pos(3), 0); // w's episode never comes here
    expect(groupOf(a.addEpisode(trajectoryEpisode('x1', 'x', 2), pos(0, 'e'), 0))).toEqual([]); // y's record lies before x's last
    expect(groupOf(a.addEpisode(trajectoryEpisode('y1', 'y', 1), pos(1, 'e'), 0))).toEqual(['x', 'y']);
    expect(a.lowestPending().get('t\u00000')).toBe(3);
  });

  it('waits for records held elsewhere (chunks) before its last record, and starts over after a reset', () => {
    let chunks = new Map([['t\u00000', 0]]);
    const a = new GroupAssembler({ groupSize: 1, timeoutMs: 1000, blockers: () => chunks });
    a.addTrajectory(trajectory('g1', 0, 'g'), pos(1), 0);
    expect(groupOf(a.addEpisode(trajectoryEpisode('g1', 'g', 1), pos(0, 'e'), 0))).toEqual([]);
    chunks = new Map();
    expect(groupOf(a.tick(1))).toEqual(['g']);
    // After a rebalance everything pending is forgotten; what is done stays done.
    a.addTrajectory(trajectory('k1', 0, 'k'), pos(2), 0);
    a.reset();
    expect(a.lowestPending().size).toBe(0);
    expect(a.done.has('g')).toBe(true);
    expect(a.addTrajectory(trajectory('g1', 0, 'g'), pos(1), 0)).toEqual([]);
  });
});
