import json
import subprocess

import pytest

from lightning_sidecar_client.records import JSON, PROTOBUF, DecodeError, decode_episode, decode_trajectory, decode_transition, encoding_of
from factories import (REPO, encode_episode_pb, encode_trajectory_pb, encode_transition_pb, episode, node, proto_has_delta, rollout, three_calls,
                       trajectory, transition)


def rich_transition():
    return transition('r-1', 3, group_id='g', policy_version='7', reward=0.25, is_last=True, final_reward=1, credit=0.5,
                      tool_calls=[{'id': 'call_1', 'name': 'calc', 'status': 'ok', 'reward': None, 'span_id': 'ab', 'join': 'tool_call_id'}],
                      injected=['return_token_ids'], ttft_ms=12.5, trace_id='t' * 32)


def test_a_protobuf_transition_decodes_to_the_same_dict_as_its_json():
    t = rich_transition()
    assert decode_transition(encode_transition_pb(t), PROTOBUF) == t
    assert decode_transition(json.dumps(t).encode(), JSON) == t


def test_absent_token_ids_stay_null_and_empty_ones_stay_empty_in_protobuf():
    t = transition('r', 0, prompt=None, response=[], logprobs=None)
    t['response_logprobs'] = None
    got = decode_transition(encode_transition_pb(t), PROTOBUF)
    assert (got['prompt_token_ids'], got['response_token_ids'], got['response_logprobs']) == (None, [], None)


def test_a_protobuf_episode_decodes_to_the_same_dict_as_its_json():
    e = episode('r-1', ['r-1/0/0', 'r-1/0/1'], group_id='g', final_reward=0.5, lag=2, exported=['transitions', 'trajectories'],
                trajectory_ids=['r-1/0/s0'], unmerged_calls=[{'transition_id': 'r-1/0/1', 'reason': 'truncated'}])
    got = decode_episode(encode_episode_pb(e), PROTOBUF)
    assert got == e and list(got) == list(e)
    bare = episode('r-2', [], group_id=None, exported=['trajectories'])
    assert decode_episode(encode_episode_pb(bare), PROTOBUF) == bare


def test_an_older_sidecars_protobuf_episode_has_empty_lists_where_its_json_lacks_the_keys():
    old = episode('r-1', ['r-1/0/0'], group_id='g', final_reward=1)
    assert 'exported' not in old
    got = decode_episode(encode_episode_pb(old), PROTOBUF)
    assert (got['trajectory_ids'], got['unmerged_calls'], got['exported']) == ([], [], [])
    assert {k: v for k, v in got.items() if k not in ('trajectory_ids', 'unmerged_calls', 'exported')} == old


def rich_trajectories():
    """The 3-call trajectory (tool calls, AIR, logprobs), and a second segment without logprobs with a parent."""
    _, tr, _ = three_calls()
    ts, _ = rollout('p', 2, group_id=None, final_reward=0.5)
    for t in ts:
        t['response_logprobs'] = None
    second = trajectory(ts[1:], segment=1, segments=2, start_reason='other_agent', final_reward=0.5,
                        parent=trajectory(ts[:1], segments=2))
    second['agent_name'] = 'critic'
    return [tr, second]


def test_a_protobuf_trajectory_decodes_to_the_same_dict_as_its_json_keys_in_order():
    for tr in rich_trajectories():
        got = decode_trajectory(encode_trajectory_pb(tr), PROTOBUF)
        assert got == tr and list(got) == list(tr)
        assert list(got['turns'][0]) == list(tr['turns'][0])
        assert decode_trajectory(json.dumps(tr).encode(), JSON) == tr
    _, second = rich_trajectories()
    got = decode_trajectory(encode_trajectory_pb(second), PROTOBUF)
    assert got['logprobs'] is None and got['parent_transition_id'] == 'p/0/0' and got['group_id'] is None
    # Ids and positions are ints as in the JSON, never floats.
    assert all(type(x) is int for x in got['token_ids'] + got['loss_mask'] + [r['position'] for r in got['token_rewards']])


def test_an_empty_trajectory_keeps_empty_lists_and_a_null_logprobs():
    _, tr, _ = three_calls()
    tr.update(token_ids=[], loss_mask=[], logprobs=None, turns=[], token_rewards=[], reward=0, policy_versions=[], prompt_length=0)
    assert decode_trajectory(encode_trajectory_pb(tr), PROTOBUF) == tr


def test_the_content_type_header_picks_the_decoder():
    assert encoding_of([('content-type', b'application/x-protobuf')]) == PROTOBUF
    assert encoding_of({'content-type': b'application/json'}) == JSON
    assert encoding_of(None) == JSON


def test_garbage_is_a_decode_error_in_either_encoding():
    with pytest.raises(DecodeError):
        decode_transition(b'{"not json', JSON)
    with pytest.raises(DecodeError):
        decode_transition(b'[1,2]', JSON)
    with pytest.raises(DecodeError):
        decode_episode(b'\xff\xff\xff\xff', PROTOBUF)
    with pytest.raises(DecodeError, match='trajectory'):
        decode_trajectory(b'\xff\xff\xff\xff', PROTOBUF)
    with pytest.raises(DecodeError):
        decode_trajectory(b'"a string"', JSON)


@pytest.mark.skipif(not proto_has_delta(), reason='records.proto has no prompt_token_ids_delta field yet')
def test_a_protobuf_prompt_delta_decodes_to_the_json_delta_member():
    t = transition('r', 1, prompt=None)
    t['prompt_token_ids_delta'] = {'previous_transition_id': 'r/0/0', 'prefix_length': 3, 'suffix': [9, 10]}
    assert decode_transition(encode_transition_pb(t), PROTOBUF)['prompt_token_ids_delta'] == t['prompt_token_ids_delta']


NODE_ENCODE = """
const enc = require(process.argv[1]);
const records = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const out = records.map((r) => (r.schema === 'lightning.episode.v1' ? enc.encodeEpisode(r, 'protobuf') : enc.encodeTransition(r, 'protobuf')).toString('base64'));
process.stdout.write(JSON.stringify(out));
"""


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node encoder')
def test_records_encoded_by_the_node_exporter_decode_to_their_json():
    import base64

    records = [rich_transition(), transition('r-2', 0, prompt=None, response=None, logprobs=None),
               episode('r-1', ['r-1/0/3'], group_id='g', final_reward=1, exported=['transitions', 'trajectories'], trajectory_ids=['r-1/0/s0'],
                       unmerged_calls=[{'transition_id': 'r-1/0/2', 'reason': 'retried'}])]
    records[1]['response_logprobs'] = None
    done = subprocess.run([node(), '-e', NODE_ENCODE, str(REPO / 'dist' / 'exporters' / 'kafka' / 'encoding.js')], input=json.dumps(records).encode(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    encoded = [base64.b64decode(b) for b in json.loads(done.stdout)]
    assert decode_transition(encoded[0], PROTOBUF) == records[0]
    assert decode_transition(encoded[1], PROTOBUF) == records[1]
    assert decode_episode(encoded[2], PROTOBUF) == records[2]


NODE_DECODE = """
const enc = require(process.argv[1]);
const records = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const out = records.map(([kind, b64]) => (kind === 'episode' ? enc.decodeEpisode : enc.decodeTrajectory)(Buffer.from(b64, 'base64'), 'protobuf'));
process.stdout.write(JSON.stringify(out));
"""


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node decoder')
def test_protobuf_written_with_the_generated_classes_decodes_in_node_to_the_same_json():
    import base64

    encoding_js = REPO / 'dist' / 'exporters' / 'kafka' / 'encoding.js'
    if 'decodeTrajectory' not in encoding_js.read_text():
        pytest.skip('the built Node encoding has no trajectories')
    _, _, e = three_calls()
    records = [('trajectory', t, encode_trajectory_pb(t)) for t in rich_trajectories()] + [('episode', e, encode_episode_pb(e))]
    done = subprocess.run([node(), '-e', NODE_DECODE, str(encoding_js)], capture_output=True,
                          input=json.dumps([[k, base64.b64encode(b).decode()] for k, _, b in records]).encode())
    assert done.returncode == 0, done.stderr.decode()
    decoded = json.loads(done.stdout)
    assert decoded == [r for _, r, _ in records]
    assert [list(d) for d in decoded] == [list(r) for _, r, _ in records]
