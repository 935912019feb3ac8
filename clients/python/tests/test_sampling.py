"""Sampling parameters (``processors.sampling.record``): a transition's and a trajectory turn's ``sampling``
decodes to the same dict, keys in the same order, from JSON and protobuf, here and in Node."""
import base64
import json
import subprocess

import pytest

from lightning_sidecar_client import js_json
from lightning_sidecar_client.records import JSON, PROTOBUF, decode_trajectory, decode_transition
from factories import REPO, as_delta, encode_trajectory_pb, encode_transition_pb, node, rollout, three_calls, transition

KEYS = ['temperature', 'top_p', 'top_k', 'min_p', 'seed', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'max_tokens']
ALL_NULL = dict.fromkeys(KEYS)
# Each as JavaScript's JSON.stringify writes it and json.loads reads it back: whole numbers as ints
# (an integer past 2^32, 0, a negative top_k), the rest floats (the smallest normal, 1e21 and up).
SAMPLINGS = [
    {'temperature': 0.7, 'top_p': None, 'top_k': None, 'min_p': None, 'seed': 7, 'presence_penalty': None,
     'frequency_penalty': None, 'repetition_penalty': None, 'max_tokens': 256},
    {'temperature': 0, 'top_p': 0.1, 'top_k': -1, 'min_p': 2.2250738585072014e-308, 'seed': 2 ** 53 - 1, 'presence_penalty': -1.5,
     'frequency_penalty': 1e-07, 'repetition_penalty': 1.05, 'max_tokens': 1e21},
    ALL_NULL,
]


def same(got, want):
    """Equal, keys in the same order at every level (the same line as JavaScript prints it), and a
    ``sampling``'s numbers of the same types (an int stays an int; other protobuf doubles are floats)."""
    assert got == want
    assert js_json.dumps(got) == js_json.dumps(want)
    for g, w in [(got, want)] + list(zip(got.get('turns', []), want.get('turns', []))):
        if 'sampling' in w:
            assert [type(v) for v in g['sampling'].values()] == [type(v) for v in w['sampling'].values()]


def sampled(t, sampling):
    """``t`` with ``sampling`` as its last key, where the sidecar puts it."""
    return {**t, 'sampling': dict(sampling)}


def sampled_trajectory(samplings):
    """The 3-call trajectory, each turn with the matching sampling (None: no key)."""
    _, tr, _ = three_calls()
    tr['turns'] = [turn if s is None else sampled(turn, s) for turn, s in zip(tr['turns'], samplings)]
    return tr


def test_the_JSON_text_the_sidecar_writes_parses_to_these_dicts():
    # What js_json (JSON.stringify's text) prints parses back to the same values and types.
    for s in SAMPLINGS:
        same(json.loads(js_json.dumps(s)), s)


@pytest.mark.parametrize('sampling', SAMPLINGS)
def test_a_protobuf_transition_with_sampling_decodes_to_its_json_dict_keys_in_order(sampling):
    t = sampled(transition('r', 1, group_id='g', policy_version='7', upstream_replica='10.0.0.1:8000', token_in='spliced',
                           translation={'upstream_api': 'chat.completions', 'notes': ['n']}), sampling)
    got = decode_transition(encode_transition_pb(t), PROTOBUF)
    same(got, t)
    assert list(got)[-2:] == ['upstream_replica', 'sampling'] and list(got['sampling']) == KEYS
    same(decode_transition(json.dumps(t).encode(), JSON), t)
    # A prompt delta comes after it, as the exporter appends it.
    ts, _ = rollout('d', 2, group_id=None, final_reward=1)
    d = as_delta(sampled(ts[1], sampling), ts[0])
    got = decode_transition(encode_transition_pb(d), PROTOBUF)
    same(got, d)
    assert list(got)[-3:] == ['upstream_replica', 'sampling', 'prompt_token_ids_delta']


def test_a_protobuf_transition_without_sampling_has_no_key_and_the_json_order():
    t = transition('r', 0)
    got = decode_transition(encode_transition_pb(t), PROTOBUF)
    same(got, t)
    assert 'sampling' not in got and list(got)[-1] == 'upstream_replica'


def test_whole_numbers_come_back_as_ints_and_the_rest_as_floats():
    got = decode_transition(encode_transition_pb(sampled(transition('r', 0), SAMPLINGS[1])), PROTOBUF)['sampling']
    assert [type(got[k]).__name__ for k in KEYS] == ['int', 'float', 'int', 'float', 'int', 'float', 'float', 'float', 'float']
    assert got['seed'] == 2 ** 53 - 1 and got['max_tokens'] == 1e21


def test_protobuf_trajectory_turns_with_and_without_sampling_decode_to_their_json_dict():
    for samplings in (SAMPLINGS, [SAMPLINGS[0], None, None], [None, None, None]):
        tr = sampled_trajectory(samplings)
        got = decode_trajectory(encode_trajectory_pb(tr), PROTOBUF)
        same(got, tr)
        same(decode_trajectory(json.dumps(tr).encode(), JSON), tr)
        for turn, s in zip(got['turns'], samplings):
            assert list(turn)[-1] == ('policy_version' if s is None else 'sampling')


# --- with the Node code (dist/): the Node exporter's records decode here, and ours decode there ---

NODE_ENCODE = """
const [encJs, writerJs] = process.argv.slice(1);
const enc = require(encJs);
const { TransitionWriter } = require(writerJs);
const writer = new TransitionWriter(() => { throw new Error('no journal'); });
const { transitions, trajectory: t } = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const { token_ids, loss_mask, logprobs, ...rest } = t;
const cut = t.turns[t.turns.length - 1].response_start;
const record = {
  ...rest,
  routing: null,
  weightVersions: null,
  samplingMask: null,
  logprobsMode: null,
  images: null,
  last: { transition_id: t.turns[t.turns.length - 1].transition_id, prompt_token_ids: token_ids.slice(0, cut), response_token_ids: token_ids.slice(cut) },
  length: token_ids.length,
  turnLogprobs: t.turns.map((u) => (u.has_logprobs && logprobs ? logprobs.slice(u.response_start, u.response_end) : null)),
};
const both = (f) => ['json', 'protobuf'].map((e) => f(e).toString('base64'));
process.stdout.write(JSON.stringify({
  transitions: transitions.map((x) => both((e) => enc.encodeTransition(x, e, writer))),
  trajectory: both((e) => enc.encodeTrajectory(record, e, writer)),
}));
"""

NODE_DECODE = """
const enc = require(process.argv[1]);
const records = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const out = records.map(([kind, b64]) => (kind === 'transition' ? enc.decodeTransition : enc.decodeTrajectory)(Buffer.from(b64, 'base64'), 'protobuf'));
process.stdout.write(JSON.stringify(out));
"""


def _node_encoding():
    encoding_js = REPO / 'dist' / 'exporters' / 'kafka' / 'encoding.js'
    if 'sampling' not in encoding_js.read_text():
        pytest.skip('the built Node encoding has no sampling parameters (npx tsc -p tsconfig.build.json)')
    return encoding_js


def node_records():
    transitions = [sampled(transition('r', i, upstream_replica='10.0.0.1:8000'), s) for i, s in enumerate(SAMPLINGS)] + [transition('r', 3)]
    return transitions, sampled_trajectory([SAMPLINGS[0], None, SAMPLINGS[1]])


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node encoder')
def test_records_the_node_exporter_encodes_decode_here_to_the_same_dict_in_json_and_protobuf():
    transitions, tr = node_records()
    done = subprocess.run([node(), '-e', NODE_ENCODE, str(_node_encoding()), str(REPO / 'dist' / 'exporters' / 'transition-json.js')],
                          input=json.dumps({'transitions': transitions, 'trajectory': tr}).encode(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    for t, (as_json, as_pb) in zip(transitions, out['transitions']):
        same(decode_transition(base64.b64decode(as_json), JSON), t)
        same(decode_transition(base64.b64decode(as_pb), PROTOBUF), t)
    as_json, as_pb = (base64.b64decode(x) for x in out['trajectory'])
    same(decode_trajectory(as_json, JSON), tr)
    same(decode_trajectory(as_pb, PROTOBUF), tr)


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node decoder')
def test_protobuf_with_sampling_written_here_decodes_in_node_to_the_same_json():
    transitions, tr = node_records()
    records = [('transition', t, encode_transition_pb(t)) for t in transitions] + [('trajectory', tr, encode_trajectory_pb(tr))]
    done = subprocess.run([node(), '-e', NODE_DECODE, str(_node_encoding())], capture_output=True,
                          input=json.dumps([[k, base64.b64encode(b).decode()] for k, _, b in records]).encode())
    assert done.returncode == 0, done.stderr.decode()
    # Node's JSON text (JSON.stringify) read back: whole numbers as ints, keys in Node's order.
    for got, (_, want, _) in zip(json.loads(done.stdout), records):
        same(got, want)
