import pytest

from lightning_sidecar_client.groups import GroupAssembler
from lightning_sidecar_client.position import Position
from lightning_sidecar_client.tensors import to_verl_batch
from factories import episode, three_calls, trajectory_rollout, transition


def group():
    a = GroupAssembler(2, rows='transitions')
    ts = [
        transition('a', 0, group_id='g', prompt=[11, 12, 13], response=[21, 22], logprobs=[-0.25, -0.5], reward=1, is_last=True),
        transition('b', 0, group_id='g', prompt=[14], response=[23, 24, 25], logprobs=None, reward=-0.5, is_last=True),
    ]
    ts[1]['response_logprobs'] = None
    for i, t in enumerate(ts):
        a.add_transition(t, Position('t', 0, i), 0)
    a.add_episode(episode('a', ['a/0/0'], group_id='g', final_reward=1), None, 0)
    [ev] = a.add_episode(episode('b', ['b/0/0'], group_id='g', final_reward=-0.5), None, 0)
    return ev.batch


EXPECTED = {
    'prompts': [[11, 12, 13], [0, 0, 14]],
    'responses': [[21, 22, 0], [23, 24, 25]],
    'input_ids': [[11, 12, 13, 21, 22, 0], [0, 0, 14, 23, 24, 25]],
    'attention_mask': [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]],
    'position_ids': [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]],
    'response_mask': [[1, 1, 0], [1, 1, 1]],
    'token_level_scores': [[0.0, 1.0, 0.0], [0.0, 0.0, -0.5]],
    'old_log_probs': [[-0.25, -0.5, 0.0], [0.0, 0.0, 0.0]],
    'has_old_log_probs': [True, False],
    'reward': [1.0, -0.5],
    'uid': ['g', 'g'],
}


def test_lists_are_padded_left_for_prompts_right_for_responses_with_the_reward_on_the_last_token():
    out = to_verl_batch(group(), use_numpy=False)
    for k, v in EXPECTED.items():
        assert out[k] == v, k


def test_numpy_arrays_hold_the_same_values_with_trainer_dtypes():
    np = pytest.importorskip('numpy')
    out = to_verl_batch(group())
    for k, v in EXPECTED.items():
        assert out[k].tolist() == v, k
    assert out['input_ids'].dtype == np.int64 and out['token_level_scores'].dtype == np.float32
    assert out['input_ids'].shape == (2, 6)


def test_fixed_widths_pad_further_and_refuse_longer_rows():
    out = to_verl_batch(group(), use_numpy=False, max_prompt_length=4, max_response_length=5, pad_token_id=-1)
    assert out['prompts'][1] == [-1, -1, -1, 14] and out['responses'][0] == [21, 22, -1, -1, -1]
    with pytest.raises(ValueError, match='a/0/0'):
        to_verl_batch(group(), max_prompt_length=2)


def trajectory_group():
    """a: the 3-call trajectory (prompt 3, response 8 tokens); b: 1 call without logprobs (prompt 2, response 2)."""
    _, a, ea = three_calls('a')
    b_ts, [b], eb = trajectory_rollout('b', 1, group_id='g', final_reward=-0.5, base=500)
    b['logprobs'] = None
    asm = GroupAssembler(2)
    for i, t in enumerate((a, b)):
        asm.add_trajectory(t, Position('j', 0, i), 0)
    asm.add_episode(ea, None, 0)
    [ev] = asm.add_episode(eb, None, 0)
    return ev.batch, [a, b]


def expected_rows(records, p_len, r_len, pad=0):
    """What each tensor row must hold, read off the trajectory records themselves."""
    rows = {k: [] for k in ('prompts', 'responses', 'response_mask', 'token_level_scores', 'old_log_probs', 'attention_mask')}
    for t in records:
        p = t['prompt_length']
        prompt, response = t['token_ids'][:p], t['token_ids'][p:]
        scores = [0.0] * len(response)
        for r in t['token_rewards']:
            scores[r['position'] - p] = r['value']
        lp = t['logprobs'][p:] if t['logprobs'] is not None else [0.0] * len(response)
        r_pad = r_len - len(response)
        rows['prompts'].append([pad] * (p_len - p) + prompt)
        rows['responses'].append(response + [pad] * r_pad)
        rows['response_mask'].append(t['loss_mask'][p:] + [0] * r_pad)
        rows['token_level_scores'].append(scores + [0.0] * r_pad)
        rows['old_log_probs'].append(lp + [0.0] * r_pad)
        rows['attention_mask'].append([0] * (p_len - p) + [1] * len(t['token_ids']) + [0] * r_pad)
    return rows


def test_trajectory_rows_take_their_mask_scores_and_log_probs_from_the_records():
    g, records = trajectory_group()
    out = to_verl_batch(g, use_numpy=False)
    for k, v in expected_rows(records, 3, 8).items():
        assert out[k] == v, k
    # The 3-call row: sampled tokens only, AIR and the final reward where their calls end.
    assert out['response_mask'][0] == [1, 1, 0, 0, 1, 0, 1, 1]
    assert out['token_level_scores'][0] == [0.0, -0.25, 0.0, 0.0, 0.5, 0.0, 0.0, 1.0]
    assert out['response_mask'][1] == [1, 1, 0, 0, 0, 0, 0, 0] and out['token_level_scores'][1][1] == -0.5
    assert [sum(m) for m in out['response_mask']] == [5, 2]
    assert out['has_old_log_probs'] == [True, False]
    assert out['trajectory_id'] == ['a/0/s0', 'b/0/s0'] and 'transition_id' not in out
    assert out['reward'] == [1.25, -0.5] and out['uid'] == ['g', 'g'] and out['rollout_id'] == ['a', 'b']


def test_trajectory_rows_as_numpy_arrays():
    np = pytest.importorskip('numpy')
    g, records = trajectory_group()
    out = to_verl_batch(g, max_response_length=10, pad_token_id=-1)
    for k, v in expected_rows(records, 3, 10, pad=-1).items():
        np.testing.assert_array_equal(out[k], np.asarray(v, dtype=out[k].dtype), err_msg=k)
    assert out['response_mask'].dtype == np.int64 and out['old_log_probs'].dtype == np.float32
    assert out['response_mask'].shape == (2, 10) and out['input_ids'].shape == (2, 13)
    assert out['trajectory_id'].tolist() == ['a/0/s0', 'b/0/s0']


def test_errors_name_the_trajectory_and_rows_must_be_aligned():
    g, _ = trajectory_group()
    with pytest.raises(ValueError, match='response of a/0/s0 has 8 tokens, more than max_response_length 4'):
        to_verl_batch(g, max_response_length=4)
    g['batch']['response_mask'][1] = g['batch']['response_mask'][1][:-1]
    with pytest.raises(ValueError, match='response_mask of b/0/s0 has 1 entries for 2 response tokens'):
        to_verl_batch(g, use_numpy=False)


def test_a_group_without_rows_gives_empty_arrays_of_the_right_rank():
    np = pytest.importorskip('numpy')
    _, _, e = three_calls()
    asm = GroupAssembler(1)
    [ev] = asm.add_episode(dict(e, trajectory_ids=[]), None, 0)
    out = to_verl_batch(ev.batch)
    assert out['input_ids'].shape == (0, 0) and out['trajectory_id'].tolist() == []
    assert np.asarray(out['response_mask']).ndim == 2
