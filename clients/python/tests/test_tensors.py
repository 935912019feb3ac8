import pytest

from lightning_sidecar_client.groups import GroupAssembler
from lightning_sidecar_client.position import Position
from lightning_sidecar_client.tensors import to_verl_batch
from factories import episode, transition


def group():
    a = GroupAssembler(2)
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
