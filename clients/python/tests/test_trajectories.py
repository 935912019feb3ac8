"""Trajectory rows: one group row per lightning.trajectory.v1 record (the default)."""
from lightning_sidecar_client import js_json
from lightning_sidecar_client.groups import EpisodeNotExported, GroupAssembler, GroupIncomplete, GroupReady, TransitionsOrphaned
from lightning_sidecar_client.position import Position
from lightning_sidecar_client.records import PROTOBUF, decode_episode, decode_trajectory
from factories import encode_episode_pb, encode_trajectory_pb, episode, rollout, three_calls, trajectory, trajectory_rollout

J, E = 'lightning.trajectories', 'lightning.episodes'


def pos(offset, topic=J):
    return Position(topic, 0, offset)


def one_group(records, episodes, group_size=1, rows='trajectories'):
    """Feeds trajectories then episodes; returns the one group emitted."""
    a = GroupAssembler(group_size, rows=rows)
    events = [ev for i, t in enumerate(records) for ev in a.add_trajectory(t, pos(i), 0)]
    events += [ev for i, e in enumerate(episodes) for ev in a.add_episode(e, pos(i, E), 0)]
    [ready] = [ev for ev in events if isinstance(ev, GroupReady)]
    return ready.batch


def test_a_three_call_trajectory_is_one_row_its_first_prompt_then_everything_after_it():
    ts, tr, e = three_calls()
    g = one_group([tr], [e])
    b = g['batch']
    assert list(g) == ['schema', 'uid', 'group_size', 'rows', 'episodes', 'batch', 'unmerged_calls']
    assert list(b) == ['uid', 'rollout_id', 'attempt_id', 'trajectory_id', 'segment', 'turns', 'prompt_ids', 'response_ids', 'response_mask',
                       'token_level_scores', 'rollout_log_probs', 'reward', 'is_last', 'policy_versions']
    assert b['prompt_ids'] == [[1, 2, 3]]
    assert b['response_ids'] == [[10, 11, 4, 5, 12, 6, 13, 14]]
    assert b['response_mask'] == [[1, 1, 0, 0, 1, 0, 1, 1]]
    # AIR -0.25 on call 0's last token (11), AIR 0.5 on call 1's (12), the final reward on the last sampled token (14).
    assert b['token_level_scores'] == [[0, -0.25, 0, 0, 0.5, 0, 0, 1]]
    assert b['rollout_log_probs'] == [[-0.1, -0.2, 0, 0, -0.3, 0, -0.4, -0.5]]
    assert (b['reward'], b['turns'], b['segment'], b['is_last'], b['policy_versions']) == ([1.25], [3], [0], [True], [['7']])
    assert (b['trajectory_id'], b['rollout_id'], b['attempt_id'], b['uid']) == (['r/0/s0'], ['r'], ['0'], ['g'])
    assert g['unmerged_calls'] == 1
    assert g['episodes'] == [{'rollout_id': 'r', 'attempt_id': '0', 'final_reward': 1, 'episode_status': 'completed', 'transitions': 4,
                              'policy_version_lag': None}]


def test_the_group_line_is_what_json_stringify_prints_key_order_included():
    _, tr, e = three_calls()
    line = js_json.dumps(one_group([tr], [e]))
    assert line == (
        '{"schema":"lightning.group.v1","uid":"g","group_size":1,"rows":"trajectories",'
        '"episodes":[{"rollout_id":"r","attempt_id":"0","final_reward":1,"episode_status":"completed","transitions":4,"policy_version_lag":null}],'
        '"batch":{"uid":["g"],"rollout_id":["r"],"attempt_id":["0"],"trajectory_id":["r/0/s0"],"segment":[0],"turns":[3],'
        '"prompt_ids":[[1,2,3]],"response_ids":[[10,11,4,5,12,6,13,14]],"response_mask":[[1,1,0,0,1,0,1,1]],'
        '"token_level_scores":[[0,-0.25,0,0,0.5,0,0,1]],"rollout_log_probs":[[-0.1,-0.2,0,0,-0.3,0,-0.4,-0.5]],'
        '"reward":[1.25],"is_last":[true],"policy_versions":[["7"]]},"unmerged_calls":1}'
    )


def test_each_sampled_token_is_masked_in_scored_where_its_call_ends_and_carries_its_calls_logprob():
    """The row checked against the calls it was merged from, token by token."""
    ts, tr, e = three_calls()
    b = one_group([tr], [e])['batch']
    p = tr['prompt_length']
    response, mask, scores, logprobs = b['response_ids'][0], b['response_mask'][0], b['token_level_scores'][0], b['rollout_log_probs'][0]
    assert len(response) == len(mask) == len(scores) == len(logprobs)
    assert sum(mask) == sum(len(t['response_token_ids']) for t in ts)
    sampled = set()
    for k, t in enumerate(ts):
        start = len(t['prompt_token_ids']) - p
        end = start + len(t['response_token_ids'])
        assert b['prompt_ids'][0] + response[:start] == t['prompt_token_ids']
        assert response[start:end] == t['response_token_ids']
        assert mask[start:end] == [1] * (end - start)
        assert logprobs[start:end] == t['response_logprobs']
        expected_last = (t['intermediate_reward'] or 0) + (e['final_reward'] if k == len(ts) - 1 else 0)
        assert scores[end - 1] == expected_last
        assert scores[start:end - 1] == [0] * (end - 1 - start)
        sampled |= set(range(start, end))
    for i in set(range(len(response))) - sampled:
        assert (mask[i], scores[i], logprobs[i]) == (0, 0, 0), i
    assert sum(scores) == b['reward'][0]


def test_protobuf_records_decode_to_their_json_and_give_the_same_line_byte_for_byte():
    _, tr, e = three_calls(final_reward=1)
    got_tr = decode_trajectory(encode_trajectory_pb(tr), PROTOBUF)
    got_e = decode_episode(encode_episode_pb(e), PROTOBUF)
    assert got_tr == tr and list(got_tr) == list(tr)
    assert got_e == e
    # Doubles come back as floats (1.0, 0.0) where the JSON has integers; the line must not show it.
    assert isinstance(got_tr['reward'], float) and isinstance(got_tr['token_rewards'][-1]['value'], float)
    line = js_json.dumps(one_group([got_tr], [got_e]))
    assert line == js_json.dumps(one_group([tr], [e]))
    assert '.0,' not in line and '.0]' not in line


def test_segments_are_rows_in_the_episodes_trajectory_ids_order_and_only_the_last_is_last():
    ts, _ = rollout('r', 3, group_id='g', final_reward=0.5)
    s0 = trajectory(ts[:1], segment=0, segments=2, final_reward=0.5)
    s1 = trajectory(ts[1:], segment=1, segments=2, start_reason='diverged', final_reward=0.5, parent=s0)
    e = episode('r', [t['transition_id'] for t in ts], group_id='g', final_reward=0.5, exported=['trajectories'],
                trajectory_ids=[s0['trajectory_id'], s1['trajectory_id']])
    a = GroupAssembler(1)
    assert a.add_trajectory(s1, pos(0), 0) == []
    assert a.add_episode(e, pos(0, E), 0) == []  # s0 still missing
    [ev] = a.add_trajectory(s0, pos(1), 0)
    b = ev.batch['batch']
    assert b['trajectory_id'] == ['r/0/s0', 'r/0/s1']
    assert (b['segment'], b['is_last'], b['turns']) == ([0, 1], [False, True], [1, 2])
    assert b['prompt_ids'] == [ts[0]['prompt_token_ids'], ts[1]['prompt_token_ids']]
    # The final reward sits on the last segment's last token only.
    assert [sum(s) for s in b['token_level_scores']] == [0, 0.5]
    assert b['token_level_scores'][1][-1] == 0.5


def test_a_group_is_emitted_once_whatever_the_order_and_duplicates():
    a_ts, a_trs, ea = trajectory_rollout('a', 2, group_id='g', final_reward=1)
    b_ts, b_trs, eb = trajectory_rollout('b', 1, group_id='g', final_reward=0, base=500)
    asm = GroupAssembler(2, timeout_ms=10_000)
    assert asm.add_episode(eb, pos(0, E), 0) == []
    assert asm.add_trajectory(a_trs[0], pos(0), 0) == []
    assert asm.add_trajectory(a_trs[0], pos(1), 0) == []  # duplicate
    assert asm.add_episode(ea, pos(1, E), 0) == []
    assert asm.lowest_pending() == {(J, 0): 0, (E, 0): 0}
    [ev] = asm.add_trajectory(b_trs[0], pos(2), 0)
    assert ev.batch['batch']['rollout_id'] == ['a', 'b']
    assert asm.lowest_pending() == {} and asm.pending_groups == 0
    assert asm.add_trajectory(b_trs[0], pos(3), 0) == [] and asm.add_episode(ea, pos(2, E), 0) == []


def test_logprobs_are_null_when_no_turn_had_them():
    ts, _ = rollout('r', 2, group_id='g', final_reward=1)
    for t in ts:
        t['response_logprobs'] = None
    tr = trajectory(ts, final_reward=1)
    assert tr['logprobs'] is None
    e = episode('r', [t['transition_id'] for t in ts], group_id='g', final_reward=1, exported=['trajectories'], trajectory_ids=[tr['trajectory_id']])
    assert one_group([tr], [e])['batch']['rollout_log_probs'] == [None]


def test_an_episode_without_exported_trajectories_is_reported_once_and_its_group_times_out():
    ts, e_old = rollout('old', 1, group_id='g', final_reward=1)  # an older sidecar: no trajectory_ids, no exported
    _, trs, e_new = trajectory_rollout('new', 1, group_id='g', final_reward=0, base=500)
    a = GroupAssembler(2, timeout_ms=1000)
    a.add_trajectory(trs[0], pos(0), 0)
    assert a.add_episode(e_old, pos(0, E), 0) == [EpisodeNotExported('old', '0', 'trajectories')]
    assert a.add_episode(e_old, pos(1, E), 0) == []  # redelivered: reported once
    assert a.pending_groups == 0  # it starts no group
    assert a.add_episode(e_new, pos(2, E), 100) == []
    assert a.tick(1100) == [GroupIncomplete('g', 1, 1000)]


def test_what_counts_as_exported_for_each_row_kind():
    def verdict(rows, e):
        return GroupAssembler(2, rows=rows).add_episode(e, pos(0, E), 0)

    transitions_only = episode('r', ['r/0/0'], group_id='g', exported=['transitions'])
    trajectories_only = episode('r', ['r/0/0'], group_id='g', exported=['trajectories'], trajectory_ids=['r/0/s0'])
    both = episode('r', ['r/0/0'], group_id='g', exported=['transitions', 'trajectories'], trajectory_ids=['r/0/s0'])
    older = episode('r', ['r/0/0'], group_id='g')
    older_pb = decode_episode(encode_episode_pb(older), PROTOBUF)  # empty lists where the JSON has no keys
    assert verdict('trajectories', transitions_only) == [EpisodeNotExported('r', '0', 'trajectories')]
    assert verdict('trajectories', older) == [EpisodeNotExported('r', '0', 'trajectories')]
    assert verdict('trajectories', older_pb) == [EpisodeNotExported('r', '0', 'trajectories')]
    assert verdict('transitions', trajectories_only) == [EpisodeNotExported('r', '0', 'transitions')]
    # An empty `exported` is an older sidecar's protobuf episode: it wrote transitions.
    for rows, e in (('trajectories', trajectories_only), ('trajectories', both), ('transitions', both), ('transitions', transitions_only),
                    ('transitions', older), ('transitions', older_pb)):
        assert verdict(rows, e) == [], (rows, e.get('exported'))


def test_trajectories_whose_episode_never_comes_are_dropped_after_the_timeout_and_counted_as_such():
    a = GroupAssembler(2, timeout_ms=1000)
    _, x, _ = three_calls('x')
    _, y, _ = three_calls('y', group_id=None)
    a.add_trajectory(x, pos(5), 0)
    a.add_trajectory(y, pos(6), 0)
    assert a.lowest_pending() == {(J, 0): 5}
    assert a.tick(999) == []
    assert a.tick(1000) == [TransitionsOrphaned(2, 'trajectories')]
    assert a.lowest_pending() == {}


def test_an_episode_without_a_group_releases_its_trajectories():
    _, tr, e = three_calls(group_id=None)
    a = GroupAssembler(1)
    a.add_trajectory(tr, pos(0), 0)
    assert a.has_trajectory(tr['trajectory_id'])
    assert [ev.kind for ev in a.add_episode(e, pos(0, E), 0)] == ['ungrouped']
    assert a.lowest_pending() == {} and not a.has_trajectory(tr['trajectory_id'])


def test_each_row_kind_uses_only_its_own_records():
    ts, trs, e = trajectory_rollout('r', 2, group_id='g', final_reward=1)
    traj = GroupAssembler(1)
    assert [traj.add_transition(t, pos(i, 'lightning.transitions'), 0) for i, t in enumerate(ts)] == [[], []]
    assert traj.lowest_pending() == {}
    [ev] = traj.add_trajectory(trs[0], pos(0), 0) + traj.add_episode(e, pos(0, E), 0)
    assert ev.batch['rows'] == 'trajectories'
    calls = GroupAssembler(1, rows='transitions')
    assert calls.add_trajectory(trs[0], pos(0), 0) == [] and calls.lowest_pending() == {}
    for i, t in enumerate(ts):
        calls.add_transition(t, pos(i, 'lightning.transitions'), 0)
    [ev] = calls.add_episode(e, pos(0, E), 0)
    assert 'rows' not in ev.batch and ev.batch['batch']['transition_id'] == ['r/0/0', 'r/0/1']


def test_unmerged_calls_are_summed_over_the_groups_episodes_and_an_episode_may_have_no_trajectory():
    _, tr, e1 = three_calls('a')
    _, _, e2 = three_calls('b')
    e2 = dict(e2, trajectory_ids=[], unmerged_calls=[{'transition_id': f'b/0/{i}', 'reason': 'no_token_ids'} for i in range(3)])
    g = one_group([tr], [e1, e2], group_size=2)
    assert g['unmerged_calls'] == 4
    assert g['batch']['rollout_id'] == ['a'] and [x['rollout_id'] for x in g['episodes']] == ['a', 'b']

