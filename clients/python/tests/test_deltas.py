from lightning_sidecar_client.deltas import PromptResolver
from lightning_sidecar_client.position import Position
from factories import as_delta, rollout, transition

T = 'lightning.transitions'


def test_a_chain_of_deltas_is_rebuilt_into_the_full_prompts():
    ts, _ = rollout('r', 4, group_id='g', final_reward=1)
    r = PromptResolver()
    wire = [ts[0]] + [as_delta(ts[i], ts[i - 1]) for i in range(1, 4)]
    for i, w in enumerate(wire):
        got, error = r.resolve(w, Position(T, 0, i), 0)
        assert error is None
        assert got == ts[i]
        assert 'prompt_token_ids_delta' not in got


def test_every_choice_of_a_call_with_n_above_1_rebuilds_from_the_first_choice_of_the_previous_call():
    first = transition('r', 0, prompt=[1, 2], response=[3])
    later = [transition('r', 1, choice=c, prompt=[1, 2, 3, 4], response=[10 + c]) for c in range(2)]
    r = PromptResolver()
    r.resolve(first, None, 0)
    for t in later:
        got, error = r.resolve(as_delta(t, first), None, 0)
        assert error is None and got['prompt_token_ids'] == [1, 2, 3, 4]


def test_a_delta_whose_previous_transition_was_never_seen_goes_on_without_prompt_ids():
    ts, _ = rollout('r', 2, group_id='g', final_reward=1)
    got, error = PromptResolver().resolve(as_delta(ts[1], ts[0]), None, 0)
    assert got['prompt_token_ids'] is None and 'prompt_token_ids_delta' not in got
    assert error.reason == 'previous transition r/0/0 is not held'
    assert (error.transition_id, error.previous_transition_id) == ('r/0/1', 'r/0/0')


def test_a_delta_whose_prefix_length_disagrees_with_the_previous_call_is_refused():
    ts, _ = rollout('r', 2, group_id='g', final_reward=1)
    d = as_delta(ts[1], ts[0])
    d['prompt_token_ids_delta']['prefix_length'] += 1
    r = PromptResolver()
    r.resolve(ts[0], None, 0)
    got, error = r.resolve(d, None, 0)
    assert got['prompt_token_ids'] is None
    assert error.reason == 'prefix_length 5 but the previous prompt and response hold 4 ids'


def test_a_delta_against_a_call_without_token_ids_is_refused():
    prev = transition('r', 0, prompt=None, response=None)
    d = transition('r', 1, prompt=None, prompt_token_ids_delta={'previous_transition_id': 'r/0/0', 'prefix_length': 0, 'suffix': [1]})
    r = PromptResolver()
    r.resolve(prev, None, 0)
    _, error = r.resolve(d, None, 0)
    assert error.reason == 'previous transition r/0/0 has no token ids'


def test_offsets_stay_at_the_start_of_an_open_episodes_delta_chain_until_its_summary():
    ts, _ = rollout('r', 3, group_id='g', final_reward=1)
    other, _ = rollout('o', 1, group_id='g', final_reward=1)
    r = PromptResolver()
    r.resolve(ts[0], Position(T, 0, 10), 0)
    r.resolve(other[0], Position(T, 0, 11), 0)
    r.resolve(as_delta(ts[1], ts[0]), Position(T, 0, 12), 0)
    r.resolve(as_delta(ts[2], ts[1]), Position(T, 0, 13), 0)
    assert r.lowest_pending() == {(T, 0): 10}
    r.forget('r', '0')
    assert r.lowest_pending() == {(T, 0): 11}
    r.forget('o', '0')
    assert r.lowest_pending() == {}


def test_a_full_prompt_starts_a_new_chain_and_releases_the_older_offsets():
    ts, _ = rollout('r', 3, group_id='g', final_reward=1)
    r = PromptResolver()
    r.resolve(ts[0], Position(T, 0, 10), 0)
    r.resolve(ts[1], Position(T, 0, 12), 0)  # sent in full (it did not continue its predecessor)
    assert r.lowest_pending() == {(T, 0): 12}
    got, error = r.resolve(as_delta(ts[2], ts[1]), Position(T, 0, 13), 0)
    assert error is None and got == ts[2]


def test_idle_episodes_are_forgotten_after_the_timeout():
    r = PromptResolver(timeout_ms=100)
    r.resolve(transition('r', 0), Position(T, 0, 1), 0)
    assert r.tick(99) == 0 and r.open_episodes == 1
    assert r.tick(100) == 1 and r.lowest_pending() == {}
