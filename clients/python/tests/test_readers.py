import json

import pytest

pytest.importorskip('confluent_kafka')

from lightning_sidecar_client.kafka_source import KafkaSource
from lightning_sidecar_client.readers import GroupReader, RecordReader
from lightning_sidecar_client import js_json
from factories import (JSON_HEADERS, PROTO_HEADERS, as_delta, chunk, encode_episode_pb, encode_trajectory_pb, encode_transition_pb, proto_has_delta,
                       rollout, trajectory_rollout)

T, E, J = 'lightning.transitions', 'lightning.episodes', 'lightning.trajectories'


class Msg:
    def __init__(self, topic, partition, offset, headers, value):
        self._t, self._p, self._o, self._h, self._v = topic, partition, offset, headers, value

    def error(self):
        return None

    def topic(self):
        return self._t

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def headers(self):
        return self._h

    def value(self):
        return self._v


class FakeConsumer:
    """A consumer over a fixed log: hands out messages from the committed offsets on, records commits."""

    def __init__(self, log, committed=None):
        self.log = log  # {(topic, partition): [(headers, value)]}
        self.committed = dict(committed or {})
        self.next = dict(self.committed)
        self.commits = []
        self.closed = False

    def subscribe(self, topics):
        self.topics = topics

    def consume(self, num_messages, timeout):
        out = []
        for (t, p), msgs in self.log.items():
            if t not in self.topics:
                continue
            i = self.next.get((t, p), 0)
            out += [Msg(t, p, j, h, v) for j, (h, v) in enumerate(msgs[i:], start=i)]
            self.next[(t, p)] = len(msgs)
        return out[:num_messages]

    def commit(self, offsets, asynchronous):
        assert asynchronous is False
        for tp in offsets:
            self.committed[(tp.topic, tp.partition)] = tp.offset
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def close(self):
        self.closed = True


def source(consumer, records='transitions'):
    return KafkaSource(['broker:9092'], 'trainer', records=records, consumer_factory=lambda settings: consumer)


def stream():
    """Group g (a: 3 calls, b: 1 call) complete, group h (c) waiting for its second episode."""
    a, ea = rollout('a', 3, group_id='g', final_reward=1)
    b, eb = rollout('b', 1, group_id='g', final_reward=0)
    c, ec = rollout('c', 2, group_id='h', final_reward=0.5)
    return a, b, c, ea, eb, ec


def test_groups_from_json_protobuf_and_chunked_records_with_commits_below_what_is_still_pending(tmp_path):
    a, b, c, ea, eb, ec = stream()
    big = json.dumps(a[2]).encode()
    transitions = [(JSON_HEADERS, json.dumps(c[0]).encode()), (JSON_HEADERS, json.dumps(a[0]).encode()), (PROTO_HEADERS, encode_transition_pb(a[1]))]
    transitions += chunk(a[2]['transition_id'], big, 300)
    transitions += [(JSON_HEADERS, json.dumps(b[0]).encode()), (JSON_HEADERS, json.dumps(c[1]).encode())]
    episodes = [(PROTO_HEADERS, encode_episode_pb(ea)), (JSON_HEADERS, json.dumps(ec).encode()), (JSON_HEADERS, json.dumps(eb).encode())]
    consumer = FakeConsumer({(T, 0): transitions, (E, 0): episodes})
    reader = GroupReader(source(consumer), 2, rows='transitions', state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0)
    [g] = list(reader)
    assert g['uid'] == 'g'
    assert g['batch']['prompt_ids'] == [t['prompt_token_ids'] for t in a + b]
    # h's records (c at offset 0 of transitions, its episode at 1) are still needed.
    assert consumer.committed == {(T, 0): 0, (E, 0): 1}
    assert [json.loads(line)['uid'] for line in open(tmp_path / 'state')] == ['g']


def test_a_restarted_reader_emits_nothing_twice_and_completes_what_was_pending(tmp_path):
    a, b, c, ea, eb, ec = stream()
    d, ed = rollout('d', 1, group_id='h', final_reward=1)
    log = {(T, 0): [(JSON_HEADERS, json.dumps(t).encode()) for t in c + a + b], (E, 0): [(JSON_HEADERS, json.dumps(e).encode()) for e in (ea, ec, eb)]}
    first = FakeConsumer(log)
    assert [g['uid'] for g in GroupReader(source(first), 2, rows='transitions', state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0)] == ['g']
    # Redelivered g records and h's second episode arrive while the reader is down.
    log[(T, 0)] += [(JSON_HEADERS, json.dumps(t).encode()) for t in a + d]
    log[(E, 0)] += [(JSON_HEADERS, json.dumps(e).encode()) for e in (ea, ed)]
    second = FakeConsumer(log, committed=first.committed)
    late = []
    groups = list(GroupReader(source(second), 2, rows='transitions', state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0, on_event=late.append))
    assert [g['uid'] for g in groups] == ['h']
    assert [g['rollout_id'] for g in groups[0]['episodes']] == ['c', 'd']
    # b's episode (read again: it came after h's pending one) and a's redelivered one.
    assert [(ev.kind, ev.uid, ev.rollout_id) for ev in late] == [('late', 'g', 'b'), ('late', 'g', 'a')]
    assert second.committed == {(T, 0): len(log[(T, 0)]), (E, 0): len(log[(E, 0)])}


def test_offsets_stay_below_the_first_chunk_of_a_record_still_in_pieces():
    a, b, c, ea, eb, ec = stream()
    pieces = chunk(c[1]['transition_id'], json.dumps(c[1]).encode(), 200)
    log = {(T, 0): [(JSON_HEADERS, json.dumps(t).encode()) for t in a + b] + pieces[:1] + [(JSON_HEADERS, json.dumps(c[0]).encode())],
           (E, 0): [(JSON_HEADERS, json.dumps(e).encode()) for e in (ea, eb)]}
    consumer = FakeConsumer(log)
    assert [g['uid'] for g in GroupReader(source(consumer), 2, rows='transitions', idle_exit_ms=0, poll_s=0)] == ['g']
    assert consumer.committed[(T, 0)] == 4


def test_stop_after_a_group_commits_nothing_past_the_records_not_yet_handled():
    a, b, c, ea, eb, ec = stream()
    log = {(T, 0): [(JSON_HEADERS, json.dumps(t).encode()) for t in a + b + c], (E, 0): [(JSON_HEADERS, json.dumps(e).encode()) for e in (ea, eb, ec)]}
    consumer = FakeConsumer(log)
    reader = GroupReader(source(consumer), 2, rows='transitions', poll_s=0)
    for g in reader:
        reader.stop()
    # Transitions are read first (one poll), g completes on b's episode: c's transitions and
    # episode are not handled, so neither is committed.
    assert consumer.committed == {(T, 0): 4, (E, 0): 2}


@pytest.mark.parametrize('encoding', ['json', 'protobuf'])
def test_plain_transitions_come_once_each_with_delta_prompts_made_whole(encoding):
    if encoding == 'protobuf' and not proto_has_delta():
        pytest.skip('records.proto has no prompt_token_ids_delta field yet')
    a, _, _, ea, _, _ = stream()
    wire = [a[0], as_delta(a[1], a[0]), as_delta(a[2], a[1])]
    enc = (lambda t: (JSON_HEADERS, json.dumps(t).encode())) if encoding == 'json' else (lambda t: (PROTO_HEADERS, encode_transition_pb(t)))
    log = {(T, 0): [enc(t) for t in wire + wire[:2]], (E, 0): [(JSON_HEADERS, json.dumps(ea).encode())]}
    consumer = FakeConsumer(log)
    reader = RecordReader(source(consumer), idle_exit_ms=0, poll_s=0)
    assert list(reader.transitions()) == a
    assert consumer.committed == {(T, 0): 5, (E, 0): 1}
    assert consumer.closed is False


def trajectory_stream():
    """As ``stream``, from a sidecar exporting both kinds: g (a: 3 calls, b: 1) complete, h (c) waiting."""
    a = trajectory_rollout('a', 3, group_id='g', final_reward=1)
    b = trajectory_rollout('b', 1, group_id='g', final_reward=0, base=300)
    c = trajectory_rollout('c', 2, group_id='h', final_reward=0.5, base=500)
    return a, b, c


def as_json(records):
    return [(JSON_HEADERS, json.dumps(r).encode()) for r in records]


def test_trajectory_groups_from_json_protobuf_and_chunked_records_without_reading_transitions(tmp_path):
    (a_ts, [a], ea), (b_ts, [b], eb), (c_ts, [c], ec) = trajectory_stream()
    big = encode_trajectory_pb(a)
    trajectories = as_json([c]) + chunk(a['trajectory_id'], big, 40, PROTO_HEADERS) + [(PROTO_HEADERS, encode_trajectory_pb(b))]
    episodes = [(PROTO_HEADERS, encode_episode_pb(ea)), (JSON_HEADERS, json.dumps(ec).encode()), (JSON_HEADERS, json.dumps(eb).encode())]
    assert len(chunk(a['trajectory_id'], big, 40)) > 2
    consumer = FakeConsumer({(T, 0): as_json(a_ts + b_ts + c_ts), (J, 0): trajectories, (E, 0): episodes})
    reader = GroupReader(source(consumer, 'trajectories'), 2, state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0)
    [g] = list(reader)
    assert consumer.topics == [J, E]
    assert g['rows'] == 'trajectories' and g['batch']['trajectory_id'] == ['a/0/s0', 'b/0/s0']
    # The same line as from the JSON records.
    plain = FakeConsumer({(J, 0): as_json([c, a, b]), (E, 0): as_json([ea, ec, eb])})
    assert js_json.dumps(g) == js_json.dumps(next(iter(GroupReader(source(plain, 'trajectories'), 2, idle_exit_ms=0, poll_s=0))))
    assert g['batch']['response_ids'][0] == a['token_ids'][a['prompt_length']:]
    # h's trajectory (offset 0) and episode (offset 1) are still needed; the transitions topic was never read.
    assert consumer.committed == {(J, 0): 0, (E, 0): 1}


def test_offsets_stay_below_the_first_chunk_of_a_trajectory_still_in_pieces():
    (_, [a], ea), (_, [b], eb), (_, [c], _) = trajectory_stream()
    pieces = chunk(c['trajectory_id'], json.dumps(c).encode(), 200)
    consumer = FakeConsumer({(J, 0): as_json([a, b]) + pieces[:1], (E, 0): as_json([ea, eb])})
    assert [g['uid'] for g in GroupReader(source(consumer, 'trajectories'), 2, idle_exit_ms=0, poll_s=0)] == ['g']
    assert consumer.committed[(J, 0)] == 2


def test_plain_trajectories_come_once_each_from_chunks_and_duplicates():
    (_, [a], ea), (_, [b], _), _ = trajectory_stream()
    log = {(J, 0): chunk(a['trajectory_id'], json.dumps(a).encode(), 100) + as_json([b, a]) + [(PROTO_HEADERS, encode_trajectory_pb(b))],
           (E, 0): as_json([ea])}
    consumer = FakeConsumer(log)
    assert list(RecordReader(source(consumer, 'trajectories'), idle_exit_ms=0, poll_s=0).trajectories()) == [a, b]
    assert consumer.committed == {(J, 0): len(log[(J, 0)]), (E, 0): 1}


def test_both_kinds_can_be_read_and_a_reader_refuses_a_source_without_its_records():
    (a_ts, [a], ea), _, _ = trajectory_stream()
    consumer = FakeConsumer({(T, 0): as_json(a_ts), (J, 0): as_json([a]), (E, 0): as_json([ea])})
    kinds = [item.kind for item in RecordReader(source(consumer, 'both'), idle_exit_ms=0, poll_s=0)]
    assert sorted(kinds) == ['episode', 'trajectory'] + ['transition'] * len(a_ts)
    with pytest.raises(ValueError, match='does not read transition records'):
        GroupReader(source(FakeConsumer({}), 'trajectories'), 2, rows='transitions')
    with pytest.raises(ValueError, match='does not read trajectory records'):
        next(RecordReader(source(FakeConsumer({}), 'transitions')).trajectories())
    with pytest.raises(ValueError, match=r'own topic \(trajectories: lightning.episodes, episodes: lightning.episodes\)'):
        KafkaSource(['b:1'], 'x', trajectories_topic=E, consumer_factory=lambda s: FakeConsumer({}))
