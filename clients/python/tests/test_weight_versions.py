"""Weight versions: a trajectory's ``weight_versions`` decodes to the same dict, keys in the same order,
from JSON and protobuf, here and in Node; ``weight_version_per_token`` spreads it over ``token_ids``."""
import base64
import json
import subprocess

import pytest

import lightning_sidecar_client
from lightning_sidecar_client import js_json, weight_version_per_token
from lightning_sidecar_client.proto import records_pb2
from lightning_sidecar_client.records import JSON, PROTOBUF, decode_trajectory
from factories import REPO, encode_trajectory_pb, node, three_calls, with_routing, NODE_DECODE_TRAJECTORIES, built_node_encoding, node_encode_trajectory

# The 3-call trajectory: token_ids 1 2 3 | 10 11 | 4 5 | 12 | 6 | 13 14, sampled at 3-4, 7 and 9-10.
SPANS = [
    {'version': 'step-41', 'start': 3, 'end': 5},
    {'version': 'step-41', 'start': 7, 'end': 8},
    {'version': 'step-42', 'start': 9, 'end': 10},
    {'version': 'step-43', 'start': 10, 'end': 11},
]


def with_weight_versions(t, spans):
    """``t`` with ``weight_versions`` where the sidecar puts it: right before ``turns``."""
    out = {}
    for k, v in t.items():
        if k == 'turns':
            out['weight_versions'] = [dict(s) for s in spans]
        out[k] = v
    return out


def encode_pb(t):
    """The protobuf encoding, field for field as the exporter writes it (spans, and the flag whenever the key is there)."""
    m = records_pb2().Trajectory()
    m.ParseFromString(encode_trajectory_pb({k: v for k, v in t.items() if k != 'weight_versions'}))
    if 'weight_versions' in t:
        m.has_weight_versions = True
        for s in t['weight_versions']:
            m.weight_versions.add(**s)
    return m.SerializeToString()


def same(got, want):
    """Equal, keys in the same order at every level (the same line as JavaScript prints it)."""
    assert got == want
    assert js_json.dumps(got) == js_json.dumps(want)


def keys_around(t):
    keys = list(t)
    return keys[keys.index('logprobs'):keys.index('turns') + 1]


@pytest.mark.parametrize('spans', [SPANS, SPANS[:1], [{'version': '', 'start': 0, 'end': 0}], []])
def test_a_protobuf_trajectory_with_weight_versions_decodes_to_its_json_dict_keys_in_order(spans):
    tr = with_weight_versions(three_calls()[1], spans)
    got = decode_trajectory(encode_pb(tr), PROTOBUF)
    same(got, tr)
    same(decode_trajectory(json.dumps(tr).encode(), JSON), tr)
    assert keys_around(got) == ['logprobs', 'weight_versions', 'turns']
    assert [list(s) for s in got['weight_versions']] == [['version', 'start', 'end']] * len(spans)


def test_weight_versions_come_after_the_routing_keys():
    np = pytest.importorskip('numpy')
    _, tr, _ = three_calls()
    tr = with_weight_versions(with_routing(tr, np.ones((len(tr['token_ids']) - 1, 2, 2), dtype='uint8')), SPANS)
    got = decode_trajectory(encode_pb(tr), PROTOBUF)
    same(got, tr)
    assert keys_around(got) == ['logprobs', 'routed_experts', 'routing_coverage', 'routing_complete', 'weight_versions', 'turns']


def test_a_trajectory_without_weight_versions_has_no_key_in_either_encoding():
    _, tr, _ = three_calls()
    for got in (decode_trajectory(encode_pb(tr), PROTOBUF), decode_trajectory(json.dumps(tr).encode(), JSON)):
        same(got, tr)
        assert 'weight_versions' not in got
    # What an older sidecar wrote (no flag, no spans) is the same bytes as a record without them.
    assert encode_pb(tr) == encode_trajectory_pb(tr)


def test_an_empty_list_is_not_an_absent_one():
    tr = with_weight_versions(three_calls()[1], [])
    got = decode_trajectory(encode_pb(tr), PROTOBUF)
    assert got['weight_versions'] == []


def test_weight_version_per_token_gives_each_position_its_version_and_none_elsewhere():
    tr = with_weight_versions(three_calls()[1], SPANS)
    per = weight_version_per_token(tr)
    assert len(per) == len(tr['token_ids']) == 11
    assert per == [None, None, None, 'step-41', 'step-41', None, None, 'step-41', None, 'step-42', 'step-43']
    # From the protobuf record alike.
    assert weight_version_per_token(decode_trajectory(encode_pb(tr), PROTOBUF)) == per


def test_weight_version_per_token_without_weight_versions_is_all_none():
    _, tr, _ = three_calls()
    assert weight_version_per_token(tr) == [None] * 11
    assert weight_version_per_token(with_weight_versions(tr, [])) == [None] * 11


def test_weight_version_per_token_cuts_a_span_past_the_ids():
    tr = with_weight_versions(three_calls()[1], [{'version': 'v', 'start': 9, 'end': 40}, {'version': 'w', 'start': 50, 'end': 60}])
    assert weight_version_per_token(tr) == [None] * 9 + ['v', 'v']


def test_the_helper_is_exported_from_the_package():
    assert 'weight_version_per_token' in lightning_sidecar_client.__all__
    assert lightning_sidecar_client.weight_version_per_token is weight_version_per_token


# --- with the Node code (dist/): the Node exporter's records decode here, and ours decode there ---

def _node_encoding():
    return built_node_encoding('weight_versions', 'weight versions')


def node_trajectories():
    _, tr, _ = three_calls()
    return [with_weight_versions(tr, SPANS), with_weight_versions(tr, []), tr]


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node encoder')
@pytest.mark.parametrize('which', range(3))
def test_trajectories_the_node_exporter_encodes_decode_here_to_the_same_dict_in_json_and_protobuf(which):
    tr = node_trajectories()[which]
    as_json, as_pb = node_encode_trajectory(tr, _node_encoding())
    # The JSON line is JavaScript's text of the dict, byte for byte (no key when no call said).
    assert as_json.decode() == js_json.dumps(tr)
    same(decode_trajectory(as_json, JSON), tr)
    same(decode_trajectory(as_pb, PROTOBUF), tr)


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node decoder')
def test_protobuf_with_weight_versions_written_here_decodes_in_node_to_the_same_json():
    trs = node_trajectories()
    done = subprocess.run([node(), '-e', NODE_DECODE_TRAJECTORIES, str(_node_encoding())], capture_output=True,
                          input=json.dumps([base64.b64encode(encode_pb(t)).decode() for t in trs]).encode())
    assert done.returncode == 0, done.stderr.decode()
    for got, want in zip(json.loads(done.stdout), trs):
        same(got, want)
