"""Routed experts (MoE routing replay): the same dict from JSON and protobuf, as numpy arrays, in a veRL batch."""
import base64
import json
import subprocess

import pytest

from lightning_sidecar_client import routed_experts_array, routing_missing_mask, to_verl_batch
from lightning_sidecar_client.groups import GroupAssembler
from lightning_sidecar_client.position import Position
from lightning_sidecar_client.records import JSON, PROTOBUF, decode_trajectory
from factories import REPO, encode_trajectory_pb, node, three_calls, trajectory_rollout, with_routing, node_encode_trajectory

np = pytest.importorskip('numpy')

ROUTING_KEYS = ('routed_experts', 'routing_coverage', 'routing_complete')


def values(rows, layers=2, top_k=3, dtype='uint8', offset=1):
    """Distinct expert ids per (row, layer, k), wrapped into ``dtype``, none 0 (so padding shows)."""
    n = rows * layers * top_k
    if dtype == 'uint8':
        flat = np.arange(n) % 255 + offset
    elif dtype == 'int16':
        flat = np.arange(n) * 7 - 300
        flat[flat == 0] = 1
    elif dtype == 'uint16':
        flat = np.arange(n) + 40_000
    else:
        flat = np.arange(n) * 1000 + 70_000
    return flat.astype(dtype).reshape(rows, layers, top_k)


def routed_trajectory(dtype='uint8', missing=(), rollout_id='r'):
    """The 3-call trajectory (11 ids: 10 rows) with routing; ``missing`` rows zeroed, as the sidecar writes them."""
    _, tr, _ = three_calls(rollout_id)
    v = values(len(tr['token_ids']) - 1, dtype=dtype)
    for start, end in missing:
        v[start:end] = 0
    return with_routing(tr, v, missing=[list(m) for m in missing], coverage=0.8 if missing else 1, complete=not missing), v


@pytest.mark.parametrize('dtype', ['uint8', 'int16', 'uint16', 'int32'])
def test_a_protobuf_trajectory_with_routing_decodes_to_the_same_dict_as_its_json(dtype):
    t, _ = routed_trajectory(dtype, missing=[(2, 4)])
    keys = list(t)
    assert keys[keys.index('logprobs'):keys.index('turns') + 1] == ['logprobs', *ROUTING_KEYS, 'turns']
    from_pb = decode_trajectory(encode_trajectory_pb(t), PROTOBUF)
    from_json = decode_trajectory(json.dumps(t).encode(), JSON)
    assert from_pb == t == from_json
    assert list(from_pb) == list(t)
    assert from_pb['routed_experts'] == {'dtype': dtype, 'shape': [10, 2, 3], 'data': t['routed_experts']['data'], 'missing': [[2, 4]]}
    assert (from_pb['routing_coverage'], from_pb['routing_complete']) == (0.8, False)


def test_protobuf_carries_the_raw_bytes_not_base64():
    t, v = routed_trajectory('int32')
    encoded = encode_trajectory_pb(t)
    assert v.astype('<i4').tobytes() in encoded and t['routed_experts']['data'].encode() not in encoded


def test_a_trajectory_without_routing_has_none_of_the_keys_and_no_arrays():
    _, tr, _ = three_calls()
    got = decode_trajectory(encode_trajectory_pb(tr), PROTOBUF)
    assert got == tr and not any(k in got for k in ROUTING_KEYS)
    assert routed_experts_array(got) is None and routing_missing_mask(got) is None


@pytest.mark.parametrize('dtype', ['uint8', 'int16', 'uint16', 'int32'])
def test_the_array_holds_the_values_written_with_their_dtype_from_either_encoding(dtype):
    t, v = routed_trajectory(dtype)
    for got in (decode_trajectory(json.dumps(t).encode(), JSON), decode_trajectory(encode_trajectory_pb(t), PROTOBUF)):
        a = routed_experts_array(got)
        assert a.dtype == np.dtype(dtype) and a.shape == (10, 2, 3)
        np.testing.assert_array_equal(a, v)
        a[0, 0, 0] = 5  # a writable copy
        assert not routing_missing_mask(got).any()
    # What the contract documents: numpy frombuffer + reshape, little-endian.
    r = t['routed_experts']
    raw = np.frombuffer(base64.b64decode(r['data']), dtype=np.dtype(dtype).newbyteorder('<')).reshape(r['shape'])
    np.testing.assert_array_equal(raw, v)
    # The routed_experts member itself works as well.
    np.testing.assert_array_equal(routed_experts_array(r), v)


def test_missing_ranges_are_a_row_mask_and_hold_zeros():
    t, v = routed_trajectory('uint8', missing=[(0, 2), (5, 7), (9, 12)])
    mask = routing_missing_mask(t)
    assert mask.dtype == bool and mask.tolist() == [True, True, False, False, False, True, True, False, False, True]
    a = routed_experts_array(t)
    assert not a[mask].any() and a[~mask].all()
    np.testing.assert_array_equal(a, v)


def test_a_malformed_routed_experts_is_an_error_naming_it():
    t, _ = routed_trajectory()
    bad = dict(t, routed_experts=dict(t['routed_experts'], shape=[11, 2, 3]))
    with pytest.raises(ValueError, match='bytes of data for shape'):
        routed_experts_array(bad)
    with pytest.raises(ValueError, match='dtype'):
        routed_experts_array(dict(t, routed_experts=dict(t['routed_experts'], dtype='float32')))


def routed_group(b_routing=True):
    """a: the 3-call trajectory (prompt 3, response 8; rows 0-9, 4-5 missing, uint8); b: 1 call (prompt 2,
    response 2; rows 0-2, int16) with routing when ``b_routing``."""
    _, _, ea = three_calls('a')
    a, va = routed_trajectory('uint8', missing=[(4, 6)], rollout_id='a')
    _, [b], eb = trajectory_rollout('b', 1, group_id='g', final_reward=-0.5, base=500)
    vb = values(3, dtype='int16')
    if b_routing:
        b = with_routing(b, vb)
    asm = GroupAssembler(2)
    for i, t in enumerate((a, b)):
        asm.add_trajectory(t, Position('j', 0, i), 0)
    asm.add_episode(ea, None, 0)
    [ev] = asm.add_episode(eb, None, 0)
    return ev.batch, va, vb


def test_the_verl_batch_aligns_routed_rows_with_input_ids_and_masks_padding_missing_and_last_tokens():
    g, va, vb = routed_group()
    assert g['batch']['routing_complete'] == [False, True]
    out = to_verl_batch(g, max_response_length=10)
    experts, mask = out['routed_experts'], out['routed_experts_mask']
    assert experts.shape == (2, 13, 2, 3) and out['input_ids'].shape == (2, 13)
    assert experts.dtype == np.int16 and mask.dtype == np.int64  # uint8 and int16 promoted
    # a: no prompt padding; row i at column i; 4-5 missing; the last token (column 10) and the padding have no row.
    np.testing.assert_array_equal(experts[0, :10], va)
    assert not experts[0, 10:].any()
    assert mask[0].tolist() == [1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0]
    # b: one pad column before its 2-token prompt, so row i sits at column i + 1.
    np.testing.assert_array_equal(experts[1, 1:4], vb)
    assert not experts[1, 0].any() and not experts[1, 4:].any()
    assert mask[1].tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    # A real row is exactly where attention is on, but the last token.
    assert ((mask == 1) <= (out['attention_mask'] == 1)).all()
    assert out['routing_complete'].tolist() == [False, True]
    # Without numpy: the same values as nested lists.
    plain = to_verl_batch(g, max_response_length=10, use_numpy=False)
    assert plain['routed_experts'] == experts.tolist() and plain['routed_experts_mask'] == mask.tolist()
    assert plain['routing_complete'] == [False, True]


def test_a_row_without_routing_in_a_routed_group_is_all_padding():
    g, va, _ = routed_group(b_routing=False)
    assert g['batch']['routed_experts'][1] is None and g['batch']['routing_complete'] == [False, False]
    out = to_verl_batch(g)
    assert out['routed_experts'].dtype == np.uint8 and out['routed_experts'].shape == (2, 11, 2, 3)
    assert not out['routed_experts'][1].any() and not out['routed_experts_mask'][1].any()
    np.testing.assert_array_equal(out['routed_experts'][0, :10], va)


def test_groups_without_routing_have_no_routing_columns_or_tensors():
    from test_tensors import trajectory_group

    g, _ = trajectory_group()
    assert 'routed_experts' not in g['batch'] and 'routing_complete' not in g['batch']
    out = to_verl_batch(g)
    assert not any(k in out for k in ('routed_experts', 'routed_experts_mask', 'routing_complete'))


def test_routed_rows_must_be_one_per_token_but_the_last_and_agree_in_size():
    g, _, _ = routed_group()
    r = g['batch']['routed_experts'][1]
    g['batch']['routed_experts'][1] = dict(r, shape=[4, 2, 3], data=base64.b64encode(values(4, dtype='int16').tobytes()).decode())
    with pytest.raises(ValueError, match='routed_experts of b/0/s0 has 4 rows for 4 tokens'):
        to_verl_batch(g)
    g['batch']['routed_experts'][1] = dict(r, shape=[3, 3, 2])
    with pytest.raises(ValueError, match='3 layers'):
        to_verl_batch(g, use_numpy=False)


# --- with the Node code (dist/): the Node exporter's records decode here, and ours decode there ---

NODE_DECODE = """
const enc = require(process.argv[1]);
const b64 = require('fs').readFileSync(0, 'utf8');
process.stdout.write(JSON.stringify(enc.decodeTrajectory(Buffer.from(b64, 'base64'), 'protobuf')));
"""


def _node_encoding():
    encoding_js = REPO / 'dist' / 'exporters' / 'kafka' / 'encoding.js'
    if 'routed_experts' not in encoding_js.read_text():
        pytest.skip('the built Node encoding has no routed experts (npx tsc -p tsconfig.build.json)')
    return encoding_js


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node encoder')
@pytest.mark.parametrize('routed', [True, False])
def test_trajectories_the_node_exporter_encodes_decode_here_to_the_same_dict_in_json_and_protobuf(routed):
    t = routed_trajectory('uint16', missing=[(3, 5)])[0] if routed else three_calls()[1]
    as_json, as_pb = node_encode_trajectory(t, _node_encoding())
    from_json, from_pb = decode_trajectory(as_json, JSON), decode_trajectory(as_pb, PROTOBUF)
    assert from_json == t and from_pb == t
    assert list(from_json) == list(t) == list(from_pb)


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node decoder')
def test_protobuf_with_routing_written_here_decodes_in_node_to_the_same_json():
    t, _ = routed_trajectory('int16', missing=[(0, 1)])
    done = subprocess.run([node(), '-e', NODE_DECODE, str(_node_encoding())], input=base64.b64encode(encode_trajectory_pb(t)), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    got = json.loads(done.stdout)
    assert got == t and list(got) == list(t)


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node GroupAssembler')
@pytest.mark.parametrize('b_routing', [True, False])
def test_the_node_group_assembler_gives_the_same_group_line_with_routing(b_routing):
    from test_groups import node_events, python_events
    _, _, ea = three_calls('a')
    a, _ = routed_trajectory('uint8', missing=[(4, 6)], rollout_id='a')
    _, [b], eb = trajectory_rollout('b', 1, group_id='g', final_reward=-0.5, base=500)
    if b_routing:
        b = with_routing(b, values(3, dtype='int16'))
    ops = []
    for i, (kind, record) in enumerate((('j', a), ('j', b), ('e', ea), ('e', eb))):
        ops.append({'op': kind, 'record': record, 'pos': {'topic': kind, 'partition': 0, 'offset': i}, 'now': 1000 + i})
    expected = node_events(ops, 2, 'trajectories')
    got = python_events(ops, 2, 10_000, 'trajectories')
    groups = [e for e in got if e[0] == 'group']
    assert len(groups) == 1
    assert got == expected
    batch = json.loads(groups[0][1])['batch']
    assert batch['routing_complete'] == [False, b_routing]
    assert batch['routed_experts'][0] == a['routed_experts'] and (batch['routed_experts'][1] is None) == (not b_routing)


def test_routing_that_could_not_be_read_is_no_rows_in_the_verl_batch_and_not_complete():
    g, va, _ = routed_group(b_routing=True)
    rows = g['batch']['routed_experts'][1]['shape'][0]
    g['batch']['routed_experts'][1] = {'dtype': 'uint8', 'shape': [rows, 0, 0], 'data': '', 'missing': [[0, rows]]}
    g['batch']['routing_complete'][1] = False
    out = to_verl_batch(g, max_response_length=10)
    np.testing.assert_array_equal(out['routed_experts'][0, :10], va)
    assert not out['routed_experts'][1].any() and not out['routed_experts_mask'][1].any()
    assert out['routing_complete'].tolist() == [False, False]
    # Alone in its group, too.
    g['batch']['routed_experts'][0] = None
    out = to_verl_batch(g, max_response_length=10)
    assert out['routed_experts'].shape == (2, 13, 0, 0) and not out['routed_experts_mask'].any()
