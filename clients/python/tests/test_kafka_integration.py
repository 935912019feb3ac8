"""Against a Kafka-protocol broker holding streams a real sidecar produced.

The jest test test/python/python-client.test.ts starts the broker and sidecars, drives rollouts
through them and describes what it produced in the JSON file named by $LIGHTNING_TEST_KAFKA_SPEC:
brokers, group size, and per stream its topics, encoding, whether it was chunked or sent prompt
deltas, its groups and the exact token ids of every call (from the model server's answers).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SPEC_PATH = os.environ.get('LIGHTNING_TEST_KAFKA_SPEC')
pytestmark = pytest.mark.skipif(not SPEC_PATH, reason='LIGHTNING_TEST_KAFKA_SPEC is not set (the jest test test/python sets it)')

if SPEC_PATH:
    from confluent_kafka import Consumer, Producer, TopicPartition

from lightning_sidecar_client import iter_groups, iter_transitions, js_json
from lightning_sidecar_client.records import decode_episode, decode_transition, encoding_of
from factories import as_delta, chunk, encode_episode_pb, encode_transition_pb

SPEC = json.loads(Path(SPEC_PATH).read_text()) if SPEC_PATH else {'streams': []}
STREAMS = {s['name']: s for s in SPEC['streams']}
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def read_topic(topic: str) -> list[tuple[int, bytes, list, bytes]]:
    """Every message of ``topic``: (partition, key, headers, value), partition by partition."""
    c = Consumer({'bootstrap.servers': SPEC['brokers'], 'group.id': f'reader-{uuid.uuid4()}', 'enable.auto.commit': False})
    try:
        partitions = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        out = []
        for p in partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            c.assign([TopicPartition(topic, p, low)])
            got = []
            while len(got) < high - low:
                got += [m for m in c.consume(500, 1.0) if m.error() is None]
            out += [(p, m.key(), m.headers() or [], m.value()) for m in got]
        return out
    finally:
        c.close()


def produce(topic: str, messages) -> None:
    p = Producer({'bootstrap.servers': SPEC['brokers'], 'linger.ms': 0})
    for partition, key, headers, value in messages:
        p.produce(topic, value=value, key=key, headers=headers, partition=partition)
    assert p.flush(15) == 0


def copy_stream(stream: dict, transform) -> dict:
    """The stream's two topics copied to fresh ones, each message list passed through ``transform``."""
    suffix = uuid.uuid4().hex[:8]
    copy = dict(stream, topic=f"{stream['topic']}.{suffix}", episodes_topic=f"{stream['episodes_topic']}.{suffix}")
    produce(copy['topic'], transform(read_topic(stream['topic']), 'transitions'))
    produce(copy['episodes_topic'], transform(read_topic(stream['episodes_topic']), 'episodes'))
    return copy


def groups_of(stream: dict, **kw) -> list[dict]:
    kw.setdefault('idle_exit_ms', 1500)
    return list(iter_groups(SPEC['group_size'], brokers=SPEC['brokers'], consumer_group=f'trainer-{uuid.uuid4()}',
                            topic=stream['topic'], episodes_topic=stream['episodes_topic'], **kw))


def check_groups(stream: dict, groups: list[dict]) -> None:
    """The complete groups, once each, with every row's token ids exactly as the model server sent them."""
    assert sorted(g['uid'] for g in groups) == sorted(stream['groups'])
    for g in groups:
        assert [e['rollout_id'] for e in g['episodes']] == sorted(stream['groups'][g['uid']])
        b = g['batch']
        expected_rows = [(rid, seq) for rid in sorted(stream['groups'][g['uid']]) for seq in range(len(stream['calls'][rid]))]
        assert list(zip(b['rollout_id'], b['seq'])) == expected_rows
        for i, (rid, seq) in enumerate(expected_rows):
            call = stream['calls'][rid][seq]
            assert b['prompt_ids'][i] == call['prompt'], (rid, seq)
            assert b['response_ids'][i] == call['response'], (rid, seq)
            assert b['rollout_log_probs'][i] == pytest.approx(call['logprobs'])


@pytest.mark.parametrize('name', list(STREAMS))
def test_groups_from_the_sidecars_stream_carry_the_model_servers_exact_token_ids(name):
    stream = STREAMS[name]
    events = []
    groups = groups_of(stream, timeout_ms=1000, idle_exit_ms=2500, on_event=events.append)
    check_groups(stream, groups)
    assert sorted(ev.uid for ev in events if ev.kind == 'incomplete') == sorted(stream['incomplete'])
    assert [ev for ev in events if ev.kind not in ('incomplete', 'orphaned')] == []


@pytest.mark.parametrize('name', list(STREAMS))
def test_plain_transitions_arrive_once_each_with_whole_prompts(name):
    stream = STREAMS[name]
    got = list(iter_transitions(brokers=SPEC['brokers'], consumer_group=f'plain-{uuid.uuid4()}', topic=stream['topic'],
                                episodes_topic=stream['episodes_topic'], idle_exit_ms=1500))
    assert sorted(t['transition_id'] for t in got) == sorted(f'{rid}/0/{seq}' for rid, calls in stream['calls'].items() for seq in range(len(calls)))
    for t in got:
        call = stream['calls'][t['rollout_id']][t['seq']]
        assert (t['prompt_token_ids'], t['response_token_ids']) == (call['prompt'], call['response'])
        assert 'prompt_token_ids_delta' not in t


@pytest.mark.parametrize('name', [n for n, s in STREAMS.items() if s.get('chunked') or s.get('delta')])
def test_the_sidecar_really_sent_chunks_and_prompt_deltas_on_this_stream(name):
    stream = STREAMS[name]
    headers = [dict(h) for _, _, h, _ in read_topic(stream['topic'])]
    if stream.get('chunked'):
        assert any(h.get('lightning-chunk') == b'v1' for h in headers)
    if stream.get('delta'):
        assert any(h.get('lightning-prompt-ids') == b'delta' for h in headers)


def test_every_message_delivered_twice_and_the_stream_again_gives_each_group_once():
    stream = STREAMS['json']
    copy = copy_stream(stream, lambda msgs, _kind: [m for m in msgs for _ in (0, 1)] + msgs)
    check_groups(copy, groups_of(copy))


@pytest.mark.parametrize('encoding', ['json', 'protobuf'])
def test_prompt_deltas_in_interleaved_chunks_give_the_same_group_lines_as_the_plain_stream(encoding):
    """The sidecar's records rewritten as docs/kafka-records.md describes the wire format."""
    from factories import proto_has_delta

    if encoding == 'protobuf' and not proto_has_delta():
        pytest.skip('records.proto has no prompt_token_ids_delta field yet')
    stream = STREAMS['json']
    content_type = b'application/json' if encoding == 'json' else b'application/x-protobuf'

    def encode(kind, record):
        if encoding == 'json':
            return json.dumps(record).encode()
        return encode_episode_pb(record) if kind == 'episodes' else encode_transition_pb(record)

    deltas = []

    def rewrite(msgs, kind):
        out, previous, pending = [], {}, []
        for partition, key, headers, value in msgs:
            if kind == 'episodes':
                record = encode(kind, decode_episode(value, encoding_of(headers)))
            else:
                t = decode_transition(value, encoding_of(headers))
                prev = previous.get((t['rollout_id'], t['seq'] - 1))
                previous[(t['rollout_id'], t['seq'])] = t
                if t['continues_previous'] and prev:
                    t = as_delta(t, prev)
                    deltas.append(t['transition_id'])
                record = encode(kind, t)
            hs = [('content-type', content_type)]
            pieces = chunk(f'{kind}-{len(pending)}-{len(out)}', record, 97, hs) if len(record) > 97 else [(hs, record)]
            pending.append([(partition, key, h, v) for h, v in pieces])
            if len(pending) == 2:  # two records' chunks interleaved
                a, b = pending
                out += [m for pair in zip(a, b) for m in pair] + a[len(b):] + b[len(a):]
                pending = []
        return out + [m for p in pending for m in p]

    copy = copy_stream(stream, rewrite)
    assert deltas and any(dict(h).get('lightning-chunk') for _, _, h, _ in read_topic(copy['topic']))
    want = sorted(js_json.dumps(g) for g in groups_of(stream))
    assert sorted(js_json.dumps(g) for g in groups_of(copy)) == want


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    return subprocess.run([sys.executable, '-m', 'lightning_sidecar_client', 'groups', *args], env=env, capture_output=True, text=True, timeout=60)


def test_the_cli_emits_each_group_once_across_a_restart_with_redelivery_in_between(tmp_path):
    stream = STREAMS['json']
    copy = copy_stream(stream, lambda msgs, _kind: msgs)
    out = tmp_path / 'groups.jsonl'
    common = ['--group-size', str(SPEC['group_size']), '--brokers', SPEC['brokers'], '--group-id', 'cli', '--out', str(out),
              '--topic', copy['topic'], '--episodes-topic', copy['episodes_topic']]
    first = run_cli(*common, '--max-groups', '1')
    assert first.returncode == 0, first.stderr
    assert first.stderr.count('groups: emitted ') == 1
    # The whole stream again (an exporter redelivering) while the consumer is down.
    produce(copy['topic'], read_topic(stream['topic']))
    produce(copy['episodes_topic'], read_topic(stream['episodes_topic']))
    second = run_cli(*common, '--idle-exit-ms', '1500', '--group-timeout-ms', '1000')
    assert second.returncode == 0, second.stderr
    lines = out.read_text().splitlines()
    assert sorted(json.loads(line)['uid'] for line in lines) == sorted(stream['groups'])
    assert sorted(lines) == sorted(js_json.dumps(g) for g in groups_of(stream))
    for uid in stream['incomplete']:
        assert f'groups: gave up on {uid}: 1 of {SPEC["group_size"]} episodes after ' in second.stderr
    assert [json.loads(line)['status'] for line in (tmp_path / 'groups.jsonl.state').read_text().splitlines()] == ['incomplete'] * len(stream['incomplete'])



def test_the_cli_sends_groups_to_a_topic_and_remembers_them_in_its_state_file(tmp_path):
    stream = STREAMS['json']
    topic = f'groups.{uuid.uuid4().hex[:8]}'
    state = tmp_path / 'state'
    args = ['--group-size', str(SPEC['group_size']), '--brokers', SPEC['brokers'], '--group-id', f'to-topic-{topic}', '--to-topic', topic,
            '--state', str(state), '--topic', stream['topic'], '--episodes-topic', stream['episodes_topic'], '--idle-exit-ms', '1500']
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    sent = read_topic(topic)
    assert sorted(v.decode() for _, _, _, v in sent) == sorted(js_json.dumps(g) for g in groups_of(stream))
    assert sorted(k.decode() for _, k, _, _ in sent) == sorted(stream['groups'])
    assert sorted(json.loads(line)['uid'] for line in state.read_text().splitlines()) == sorted(stream['groups'])
