"""Sampling masks: a trajectory's ``sampling_mask`` (and its flags, and ``logprobs_mode``) decodes to
the same dict, keys in the same order, from JSON and protobuf, here and in Node; the helpers read
its rows; groups carry it per row, as the Node ``GroupAssembler`` does; ``to_verl_batch`` lays it
over the response columns."""
import base64
import json
import subprocess

import pytest

import lightning_sidecar_client
from lightning_sidecar_client import (js_json, sampling_mask_dense, sampling_mask_missing, sampling_mask_row, sampling_mask_rows,
                                      to_verl_batch)
from lightning_sidecar_client.groups import GroupAssembler
from lightning_sidecar_client.position import Position
from lightning_sidecar_client.proto import records_pb2
from lightning_sidecar_client.records import JSON, PROTOBUF, decode_trajectory
from factories import REPO, encode_trajectory_pb, node, three_calls, trajectory_rollout, with_routing, NODE_DECODE_TRAJECTORIES, built_node_encoding, node_encode_trajectory

MASK_KEYS = ('sampling_mask', 'sampling_mask_coverage', 'sampling_mask_complete', 'sampling_mask_violations')

# The 3-call trajectory: token_ids 1 2 3 | 10 11 | 4 5 | 12 | 6 | 13 14, sampled at 3-4, 7 and 9-10.
# Kept ids per sampled position; each holds the id sampled there (13 at 9 is not: one violation).
ROWS = {3: [10, 20, 30], 4: [11], 7: [40, 12], 9: [99], 10: [14, 15, 16, 17]}
SPANS = [{'version': 'step-41', 'start': 3, 'end': 11}]


def mask_of(rows, n, missing=()):
    """The ``sampling_mask`` dict the sidecar writes for kept ids ``rows`` (by position) over ``n`` ids."""
    offsets, ids = [0], []
    for p in range(n):
        ids += rows.get(p, [])
        offsets.append(len(ids))
    return {'offsets': offsets, 'ids': ids, 'missing': [list(m) for m in missing]}


def with_mask(t, rows=None, *, missing=(), coverage=1, complete=True, violations=0, logprobs_mode=None):
    """``t`` with the mask keys (when ``rows`` is not None) and ``logprobs_mode`` (when given) where
    the sidecar puts them: after ``weight_versions``, right before ``turns``."""
    out = {}
    for k, v in t.items():
        if k == 'turns':
            if rows is not None:
                out.update(sampling_mask=mask_of(rows, len(t['token_ids']), missing), sampling_mask_coverage=coverage,
                           sampling_mask_complete=complete, sampling_mask_violations=violations)
            if logprobs_mode is not None:
                out['logprobs_mode'] = logprobs_mode
        out[k] = v
    return out


def with_weight_versions(t, spans):
    out = {}
    for k, v in t.items():
        if k == 'turns':
            out['weight_versions'] = [dict(s) for s in spans]
        out[k] = v
    return out


def encode_pb(t):
    """The protobuf encoding, field for field as the exporter writes it."""
    m = records_pb2().Trajectory()
    rest = {k: v for k, v in t.items() if k not in (*MASK_KEYS, 'logprobs_mode', 'weight_versions')}
    m.ParseFromString(encode_trajectory_pb(rest))
    if 'weight_versions' in t:
        m.has_weight_versions = True
        for s in t['weight_versions']:
            m.weight_versions.add(**s)
    if 'sampling_mask' in t:
        s = t['sampling_mask']
        m.sampling_mask.SetInParent()
        m.sampling_mask.offsets.extend(s['offsets'])
        m.sampling_mask.ids.extend(s['ids'])
        for start, end in s['missing']:
            m.sampling_mask.missing.add(start=start, end=end)
        m.sampling_mask_coverage = t['sampling_mask_coverage']
        m.sampling_mask_complete = t['sampling_mask_complete']
        m.sampling_mask_violations = t['sampling_mask_violations']
    if 'logprobs_mode' in t:
        m.logprobs_mode = t['logprobs_mode']
    return m.SerializeToString()


def same(got, want):
    """Equal, keys in the same order at every level (the same line as JavaScript prints it)."""
    assert got == want
    assert js_json.dumps(got) == js_json.dumps(want)


def keys_around(t):
    keys = list(t)
    return keys[keys.index('logprobs'):keys.index('turns') + 1]


def masked(**kw):
    """The 3-call trajectory with ``ROWS`` (by default all of them, one violation) and ``kw`` for ``with_mask``."""
    kw.setdefault('rows', ROWS)
    if kw['rows'] is ROWS and 'complete' not in kw:
        kw.update(complete=False, violations=1)
    return with_mask(three_calls()[1], **kw)


CASES = {
    'complete, with mode': lambda: masked(rows={**ROWS, 9: [13]}, logprobs_mode='processed_logprobs'),
    'a violation': lambda: masked(),
    'missing calls': lambda: masked(rows={3: [10], 4: [11, 12]}, missing=[(7, 8), (9, 11)], coverage=0.4, complete=False),
    'asked for, none came': lambda: masked(rows={}, missing=[(3, 5), (7, 8), (9, 11)], coverage=0, complete=False),
    'mode only': lambda: with_mask(three_calls()[1], logprobs_mode='processed_logprobs'),
}


@pytest.mark.parametrize('case', CASES)
def test_a_protobuf_trajectory_with_masks_decodes_to_its_json_dict_keys_in_order(case):
    tr = CASES[case]()
    same(decode_trajectory(encode_pb(tr), PROTOBUF), tr)
    same(decode_trajectory(json.dumps(tr).encode(), JSON), tr)
    got = decode_trajectory(encode_pb(tr), PROTOBUF)
    want = ['logprobs'] + (list(MASK_KEYS) if 'sampling_mask' in tr else []) + (['logprobs_mode'] if 'logprobs_mode' in tr else []) + ['turns']
    assert keys_around(got) == want
    if 'sampling_mask' in tr:
        assert list(got['sampling_mask']) == ['offsets', 'ids', 'missing']
        assert len(got['sampling_mask']['offsets']) == len(tr['token_ids']) + 1


def test_the_mask_keys_come_after_routing_and_weight_versions():
    np = pytest.importorskip('numpy')
    _, tr, _ = three_calls()
    tr = with_routing(tr, np.ones((len(tr['token_ids']) - 1, 2, 2), dtype='uint8'))
    tr = with_mask(with_weight_versions(tr, SPANS), ROWS, complete=False, violations=1, logprobs_mode='raw_logprobs')
    got = decode_trajectory(encode_pb(tr), PROTOBUF)
    same(got, tr)
    assert keys_around(got) == ['logprobs', 'routed_experts', 'routing_coverage', 'routing_complete', 'weight_versions', *MASK_KEYS,
                                'logprobs_mode', 'turns']


def test_a_trajectory_without_masks_has_none_of_the_keys_in_either_encoding():
    _, tr, _ = three_calls()
    for got in (decode_trajectory(encode_pb(tr), PROTOBUF), decode_trajectory(json.dumps(tr).encode(), JSON)):
        same(got, tr)
        assert not any(k in got for k in (*MASK_KEYS, 'logprobs_mode'))
    # An older sidecar's record (none of the fields) is the same bytes.
    assert encode_pb(tr) == encode_trajectory_pb(tr)


# --- the helpers ---

@pytest.fixture
def numpy():
    return pytest.importorskip('numpy')


def test_the_rows_are_the_kept_ids_per_position_from_either_encoding(numpy):
    tr = masked()
    for got in (tr, decode_trajectory(encode_pb(tr), PROTOBUF)):
        offsets, ids = sampling_mask_rows(got)
        assert offsets.dtype == numpy.int64 and ids.dtype == numpy.int32
        assert offsets.tolist() == [0, 0, 0, 0, 3, 4, 4, 4, 6, 6, 7, 11]
        assert ids.tolist() == [10, 20, 30, 11, 40, 12, 99, 14, 15, 16, 17]
        for p in range(len(tr['token_ids'])):
            row = sampling_mask_row(got, p)
            assert row.dtype == numpy.int32 and row.tolist() == ROWS.get(p, [])
    # The member itself works as well.
    assert sampling_mask_rows(tr['sampling_mask'])[1].tolist() == sampling_mask_rows(tr)[1].tolist()
    # A row is a copy: changing it leaves the next read alone.
    sampling_mask_row(tr, 3)[0] = 0
    assert sampling_mask_row(tr, 3).tolist() == [10, 20, 30]


def test_a_position_outside_the_ids_is_an_index_error(numpy):
    tr = masked()
    for p in (-1, 11):
        with pytest.raises(IndexError, match=f'position {p} is outside the 11 token ids'):
            sampling_mask_row(tr, p)


def test_without_a_mask_every_helper_gives_none(numpy):
    for tr in (three_calls()[1], with_mask(three_calls()[1], logprobs_mode='processed_logprobs')):
        assert sampling_mask_rows(tr) is None and sampling_mask_row(tr, 3) is None
        assert sampling_mask_missing(tr) is None and sampling_mask_dense(tr, 100) is None


def test_missing_ranges_are_a_position_mask_and_have_empty_rows(numpy):
    tr = CASES['missing calls']()
    assert sampling_mask_missing(tr).tolist() == [False] * 7 + [True, False, True, True]
    assert all(sampling_mask_row(tr, p).size == 0 for p in (7, 9, 10))
    assert sampling_mask_row(tr, 4).tolist() == [11, 12]


def test_the_dense_mask_is_true_exactly_at_the_kept_ids(numpy):
    tr = masked()
    dense = sampling_mask_dense(tr, 100)
    assert dense.dtype == bool and dense.shape == (11, 100)
    for p in range(11):
        assert numpy.flatnonzero(dense[p]).tolist() == sorted(ROWS.get(p, []))
    # The sampled id is kept where the sampler kept it; at 9 it was not (the violation the record counts).
    sampled = [p for p, m in enumerate(tr['loss_mask']) if m]
    assert [bool(dense[p, tr['token_ids'][p]]) for p in sampled] == [True, True, True, False, True]
    with pytest.raises(ValueError, match='kept id 99 is outside a vocabulary of 99'):
        sampling_mask_dense(tr, 99)
    assert sampling_mask_dense(CASES['asked for, none came'](), 5).shape == (11, 5)


def test_a_malformed_mask_is_an_error_naming_it(numpy):
    tr = masked()
    with pytest.raises(ValueError, match='10 rows for 11 token ids'):
        sampling_mask_rows(dict(tr, sampling_mask=dict(tr['sampling_mask'], offsets=tr['sampling_mask']['offsets'][1:])))
    with pytest.raises(ValueError, match='offsets do not run from 0 up to the 10 ids'):
        sampling_mask_rows(dict(tr, sampling_mask=dict(tr['sampling_mask'], ids=tr['sampling_mask']['ids'][:-1])))
    bad = list(tr['sampling_mask']['offsets'])
    bad[4], bad[5] = bad[5], bad[4]
    with pytest.raises(ValueError, match='offsets do not run'):
        sampling_mask_rows(dict(tr, sampling_mask=dict(tr['sampling_mask'], offsets=bad)))


def test_the_helpers_are_exported_from_the_package():
    for name in ('sampling_mask_rows', 'sampling_mask_row', 'sampling_mask_missing', 'sampling_mask_dense'):
        assert name in lightning_sidecar_client.__all__


# --- groups and the veRL batch ---

def group_rows(b_mask=True, a_mask=True):
    """a: the 3-call trajectory (prompt 3, response 8) with ``ROWS`` but 9-10 missing; b: 1 call
    (prompt 2, response 2, sampled at 2-3) with both rows when ``b_mask``. Their records and episodes."""
    _, a, ea = three_calls('a')
    a = with_mask(a, {3: [10, 20, 30], 4: [11], 7: [40, 12]} if a_mask else None, missing=[(9, 11)], coverage=0.6,
                  complete=False)
    _, [b], eb = trajectory_rollout('b', 1, group_id='g', final_reward=-0.5, base=500)
    if b_mask:
        b = with_mask(b, {2: [505, 7], 3: [506]}, logprobs_mode='processed_logprobs')
    return a, b, ea, eb


def group_of(a, b, ea, eb):
    asm = GroupAssembler(2)
    for i, t in enumerate((a, b)):
        asm.add_trajectory(t, Position('j', 0, i), 0)
    asm.add_episode(ea, None, 0)
    [ev] = asm.add_episode(eb, None, 0)
    return ev.batch


def test_the_group_has_each_rows_mask_and_flag_only_when_a_trajectory_has_one():
    a, b, ea, eb = group_rows()
    batch = group_of(a, b, ea, eb)['batch']
    assert list(batch)[-2:] == ['sampling_mask', 'sampling_mask_complete']
    assert batch['sampling_mask'] == [a['sampling_mask'], b['sampling_mask']]
    assert batch['sampling_mask_complete'] == [False, True]
    a, b, ea, eb = group_rows(b_mask=False)
    batch = group_of(a, b, ea, eb)['batch']
    assert batch['sampling_mask'] == [a['sampling_mask'], None] and batch['sampling_mask_complete'] == [False, False]
    # After the routing columns when a trajectory has both.
    np_ = pytest.importorskip('numpy')
    a = with_routing(a, np_.ones((10, 1, 1), dtype='uint8'))
    assert list(group_of(a, b, ea, eb)['batch'])[-4:] == ['routed_experts', 'routing_complete', 'sampling_mask', 'sampling_mask_complete']
    a, b, ea, eb = group_rows(a_mask=False, b_mask=False)
    batch = group_of(a, b, ea, eb)['batch']
    assert 'sampling_mask' not in batch and 'sampling_mask_complete' not in batch


def test_the_verl_batch_lays_the_rows_over_the_response_columns(numpy):
    a, b, ea, eb = group_rows()
    g = group_of(a, b, ea, eb)
    out = to_verl_batch(g, max_response_length=10)
    offsets, ids, present = out['sampling_mask_offsets'], out['sampling_mask_ids'], out['sampling_mask_present']
    assert offsets.shape == (2, 11) and ids.shape == (2, 6) and present.shape == (2, 10)
    assert offsets.dtype == ids.dtype == present.dtype == numpy.int64
    # a: response 10 11 4 5 12 6 13 14 (positions 3-10); its rows at columns 0, 1 and 4; 9-10 (columns 6-7) missing.
    assert offsets[0].tolist() == [0, 3, 4, 4, 4, 6, 6, 6, 6, 6, 6]
    assert ids[0].tolist() == [10, 20, 30, 11, 40, 12]
    assert present[0].tolist() == [1, 1, 0, 0, 1, 0, 0, 0, 0, 0]
    # b: response 505 506, both sampled, both rows; the rest is padding (empty rows, ids 0).
    assert offsets[1].tolist() == [0, 2, 3] + [3] * 8 and ids[1].tolist() == [505, 7, 506, 0, 0, 0]
    assert present[1].tolist() == [1, 1] + [0] * 8
    assert out['sampling_mask_complete'].tolist() == [False, True]
    # Every kept set of a present column: the ids between its offsets.
    for row in range(2):
        for j in range(10):
            kept = ids[row, offsets[row, j]:offsets[row, j + 1]].tolist()
            assert bool(kept) == bool(present[row, j])
            if kept:
                assert kept == sampling_mask_row(g['batch']['sampling_mask'][row], len(g['batch']['prompt_ids'][row]) + j).tolist()
    # A present column is a sampled one.
    assert ((present == 1) <= (out['response_mask'] == 1)).all()
    # Without numpy: the same values as nested lists.
    plain = to_verl_batch(g, max_response_length=10, use_numpy=False)
    for k in ('sampling_mask_offsets', 'sampling_mask_ids', 'sampling_mask_present', 'sampling_mask_complete'):
        assert plain[k] == out[k].tolist()


def test_a_row_without_a_mask_is_empty_and_not_complete(numpy):
    a, b, ea, eb = group_rows(b_mask=False)
    out = to_verl_batch(group_of(a, b, ea, eb))
    assert out['sampling_mask_offsets'].shape == (2, 9) and not out['sampling_mask_offsets'][1].any()
    assert not out['sampling_mask_present'][1].any() and out['sampling_mask_complete'].tolist() == [False, False]


def test_a_batch_without_masks_is_as_before(numpy):
    a, b, ea, eb = group_rows(a_mask=False, b_mask=False)
    out = to_verl_batch(group_of(a, b, ea, eb))
    assert not any(k.startswith('sampling_mask') for k in out)
    # Identical to the batch of the same group whose rows carry masks, minus the mask keys.
    a2, b2, _, _ = group_rows()
    with_masks = to_verl_batch(group_of(a2, b2, ea, eb))
    assert [k for k in with_masks if not k.startswith('sampling_mask')] == list(out)
    for k in out:
        assert numpy.array_equal(out[k], with_masks[k])


def test_a_mask_that_does_not_fit_its_row_is_an_error_naming_the_row():
    a, b, ea, eb = group_rows()
    g = group_of(a, b, ea, eb)
    m = g['batch']['sampling_mask'][1]
    g['batch']['sampling_mask'][1] = dict(m, offsets=m['offsets'][1:])
    with pytest.raises(ValueError, match='b/0/s0: sampling_mask: 3 rows for 4 token ids'):
        to_verl_batch(g, use_numpy=False)
    g['batch']['sampling_mask'][1] = dict(m, offsets=[0, 1, 1, 3, 4], ids=[9, 505, 7, 506])
    with pytest.raises(ValueError, match='sampling_mask of b/0/s0 has rows in its prompt'):
        to_verl_batch(g, use_numpy=False)


# --- with the Node code (dist/): the Node exporter's records decode here, ours decode there, same groups ---

def _node_encoding():
    return built_node_encoding('sampling_mask', 'sampling masks')


def node_trajectories():
    return [CASES[c]() for c in CASES] + [with_mask(with_weight_versions(three_calls()[1], SPANS), ROWS, complete=False, violations=1),
                                          three_calls()[1]]


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node encoder')
@pytest.mark.parametrize('which', range(len(CASES) + 2))
def test_trajectories_the_node_exporter_encodes_decode_here_to_the_same_dict_in_json_and_protobuf(which):
    tr = node_trajectories()[which]
    as_json, as_pb = node_encode_trajectory(tr, _node_encoding())
    # The JSON line is JavaScript's text of the dict, byte for byte.
    assert as_json.decode() == js_json.dumps(tr)
    same(decode_trajectory(as_json, JSON), tr)
    same(decode_trajectory(as_pb, PROTOBUF), tr)


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node decoder')
def test_protobuf_with_masks_written_here_decodes_in_node_to_the_same_json():
    trs = node_trajectories()
    done = subprocess.run([node(), '-e', NODE_DECODE_TRAJECTORIES, str(_node_encoding())], capture_output=True,
                          input=json.dumps([base64.b64encode(encode_pb(t)).decode() for t in trs]).encode())
    assert done.returncode == 0, done.stderr.decode()
    for got, want in zip(json.loads(done.stdout), trs):
        same(got, want)


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node GroupAssembler')
@pytest.mark.parametrize('b_mask', [True, False])
def test_the_node_group_assembler_gives_the_same_group_line_with_masks(b_mask):
    from test_groups import node_events, python_events
    if 'sampling_mask' not in (REPO / 'dist' / 'trainer' / 'groups.js').read_text():
        pytest.skip('the built Node GroupAssembler has no sampling masks (npx tsc -p tsconfig.build.json)')
    a, b, ea, eb = group_rows(b_mask=b_mask)
    ops = []
    for i, (kind, record) in enumerate((('j', a), ('j', b), ('e', ea), ('e', eb))):
        ops.append({'op': kind, 'record': record, 'pos': {'topic': kind, 'partition': 0, 'offset': i}, 'now': 1000 + i})
    expected = node_events(ops, 2, 'trajectories')
    got = python_events(ops, 2, 10_000, 'trajectories')
    groups = [e for e in got if e[0] == 'group']
    assert len(groups) == 1
    assert got == expected
    batch = json.loads(groups[0][1])['batch']
    assert batch['sampling_mask_complete'] == [False, b_mask]
    assert batch['sampling_mask'][0] == a['sampling_mask'] and (batch['sampling_mask'][1] is None) == (not b_mask)
