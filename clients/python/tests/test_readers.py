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


class TP:
    def __init__(self, topic, partition, offset=-1001):
        self.topic, self.partition, self.offset = topic, partition, offset


class FakeConsumer:
    """A consumer over a fixed log: hands out messages from the committed offsets on, one per poll,
    partition after partition, and records commits.

    ``committed`` is shared, not copied (consumers of one group). ``owned``: the partitions
    assigned (default: all of the subscribed topics). ``rebalance(assigned)`` makes the next poll
    revoke every partition and assign ``assigned`` ('all' for all), as librdkafka's eager protocol
    does, before it returns a message; reading then starts again from the committed offsets.
    ``script[n]`` runs at the start of the n-th poll (from 1), ``on_idle`` actions one by one when
    there is nothing to hand out. ``now`` is a clock for the reader (``clock=consumer.clock``) that
    moves ``idle_s`` at each poll with nothing to hand out, and stands still otherwise. ``order``:
    the partitions the first messages come from, one each, before partition after partition.
    """

    def __init__(self, log, committed=None, owned=None, script=None, on_idle=(), idle_s=0.001, order=()):
        self.log = log  # {(topic, partition): [(headers, value)]}
        self.committed = committed if committed is not None else {}
        self.next = dict(self.committed)
        self.commits = []
        self.closed = False
        self.owned = owned
        self.script = dict(script or {})
        self.on_idle = list(on_idle)
        self._rebalance = None
        self.polls = 0
        self.handed = 0
        self.now = 0.0
        self.idle_s = idle_s
        self.order = list(order)

    def clock(self):
        return self.now

    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None):
        self.topics = topics
        self.on_assign, self.on_revoke = on_assign, on_revoke

    def partitions(self):
        return [k for k in self.log if k[0] in self.topics and (self.owned is None or k in self.owned)]

    def rebalance(self, assigned='all'):
        self._rebalance = assigned

    def poll(self, timeout):
        self.polls += 1
        if self.polls in self.script:
            self.script.pop(self.polls)(self)
        if self._rebalance is not None:
            assigned, self._rebalance = self._rebalance, None
            self.on_revoke(self, [TP(t, p) for t, p in self.partitions()])
            self.owned = None if assigned == 'all' else assigned
            self.next = dict(self.committed)
            self.on_assign(self, [TP(t, p) for t, p in self.partitions()])
        while self.order and self.next.get(self.order[0], 0) >= len(self.log[self.order[0]]):
            self.order.pop(0)
        for t, p in self.order[:1] + self.partitions():
            msgs = self.log[(t, p)]
            i = self.next.get((t, p), 0)
            if i < len(msgs):
                self.next[(t, p)] = i + 1
                self.handed += 1
                if self.order:
                    self.order.pop(0)
                return Msg(t, p, i, *msgs[i])
        if self.on_idle:
            self.on_idle.pop(0)(self)
            return self.poll(timeout)
        self.now += self.idle_s
        return None

    def commit(self, offsets, asynchronous):
        assert asynchronous is False
        for tp in offsets:
            self.committed[(tp.topic, tp.partition)] = tp.offset
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def close(self):
        self.closed = True


def source(consumer, records='transitions', **kw):
    return KafkaSource(['broker:9092'], 'trainer', records=records, consumer_factory=lambda settings: consumer, **kw)


def enc(records):
    return [(JSON_HEADERS, json.dumps(r).encode()) for r in records]


def stream():
    """Group g (a: 3 calls, b: 1 call) complete, group h (c) waiting for its second episode."""
    a, ea = rollout('a', 3, group_id='g', final_reward=1)
    b, eb = rollout('b', 1, group_id='g', final_reward=0)
    c, ec = rollout('c', 2, group_id='h', final_reward=0.5)
    return a, b, c, ea, eb, ec


def test_groups_from_json_protobuf_and_chunked_records_with_commits_below_what_is_still_pending(tmp_path):
    a, b, c, ea, eb, ec = stream()
    big = json.dumps(a[2]).encode()
    transitions = [(JSON_HEADERS, json.dumps(a[0]).encode()), (PROTO_HEADERS, encode_transition_pb(a[1]))]
    transitions += chunk(a[2]['transition_id'], big, 300)
    transitions += [(JSON_HEADERS, json.dumps(b[0]).encode())]
    episodes = [(PROTO_HEADERS, encode_episode_pb(ea)), (JSON_HEADERS, json.dumps(eb).encode())]
    # h on partition 1 of both topics (the sidecar keys a group's records by its id).
    log = {(T, 0): transitions, (T, 1): [(JSON_HEADERS, json.dumps(t).encode()) for t in c], (E, 0): episodes, (E, 1): [(JSON_HEADERS, json.dumps(ec).encode())]}
    consumer = FakeConsumer(log)
    reader = GroupReader(source(consumer), 2, rows='transitions', state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0)
    [g] = list(reader)
    assert g['uid'] == 'g'
    assert g['batch']['prompt_ids'] == [t['prompt_token_ids'] for t in a + b]
    # h's records (its transitions and episode, each from offset 0 of partition 1) are still needed.
    assert consumer.committed == {(T, 0): len(transitions), (T, 1): 0, (E, 0): 2, (E, 1): 0}
    assert [json.loads(line)['uid'] for line in open(tmp_path / 'state')] == ['g']


def test_a_restarted_reader_emits_nothing_twice_and_completes_what_was_pending(tmp_path):
    a, b, c, ea, eb, ec = stream()
    d, ed = rollout('d', 1, group_id='h', final_reward=1)
    # h's records first on partition 0, g's on partition 1.
    log = {(T, 0): enc(c), (T, 1): enc(a + b), (E, 0): enc([ec]), (E, 1): enc([ea, eb])}
    first = FakeConsumer(log)
    assert [g['uid'] for g in GroupReader(source(first), 2, rows='transitions', state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0)] == ['g']
    assert first.committed == {(T, 0): 0, (T, 1): 4, (E, 0): 0, (E, 1): 2}
    # Redelivered g records and h's second episode arrive while the reader is down.
    log[(T, 1)] += enc(a)
    log[(T, 0)] += enc(d)
    log[(E, 1)] += enc([ea, eb])
    log[(E, 0)] += enc([ed])
    second = FakeConsumer(log, committed=first.committed)
    late = []
    groups = list(GroupReader(source(second), 2, rows='transitions', state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0, on_event=late.append))
    assert [g['uid'] for g in groups] == ['h']
    assert [g['rollout_id'] for g in groups[0]['episodes']] == ['c', 'd']
    # g's redelivered episodes; its records before the committed offsets are not read again.
    assert [(ev.kind, ev.uid, ev.rollout_id) for ev in late] == [('late', 'g', 'a'), ('late', 'g', 'b')]
    assert second.committed == {k: len(msgs) for k, msgs in log.items()}


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
    trajectories = chunk(a['trajectory_id'], big, 40, PROTO_HEADERS) + [(PROTO_HEADERS, encode_trajectory_pb(b))]
    episodes = [(PROTO_HEADERS, encode_episode_pb(ea)), (JSON_HEADERS, json.dumps(eb).encode())]
    assert len(chunk(a['trajectory_id'], big, 40)) > 2
    # h (c) on partition 1 of both topics.
    consumer = FakeConsumer({(T, 0): as_json(a_ts + b_ts + c_ts), (J, 0): trajectories, (J, 1): as_json([c]), (E, 0): episodes, (E, 1): as_json([ec])})
    reader = GroupReader(source(consumer, 'trajectories'), 2, state_path=tmp_path / 'state', idle_exit_ms=0, poll_s=0)
    [g] = list(reader)
    assert consumer.topics == [J, E]
    assert g['rows'] == 'trajectories' and g['batch']['trajectory_id'] == ['a/0/s0', 'b/0/s0']
    # The same line as from the JSON records.
    plain = FakeConsumer({(J, 0): as_json([c, a, b]), (E, 0): as_json([ea, ec, eb])})
    plain_groups = GroupReader(source(plain, 'trajectories'), 2, timeout_ms=1000, idle_exit_ms=0, poll_s=0, clock=iter(range(0, 10**6, 2)).__next__)
    assert [js_json.dumps(x) for x in plain_groups] == [js_json.dumps(g)]
    assert g['batch']['response_ids'][0] == a['token_ids'][a['prompt_length']:]
    # h's trajectory and episode (each at offset 0 of partition 1) are still needed; the transitions topic was never read.
    assert consumer.committed == {(J, 0): len(trajectories), (J, 1): 0, (E, 0): 2, (E, 1): 0}


def test_a_group_waits_for_a_record_whose_chunks_began_before_it_though_its_last_chunk_is_read_in_the_same_poll():
    """As the Node command, where that record is still in chunks when the group completes: the
    source holds the record, whole but not yet processed, so the group waits for it (here until
    it is dropped as an orphan), and no commit passes its first chunk before."""
    (_, [a], ea), _, (_, [c], _) = trajectory_stream()
    pieces = chunk(c['trajectory_id'], json.dumps(c).encode(), (len(json.dumps(c)) + 1) // 2)
    assert len(pieces) == 2
    log = {(J, 0): [pieces[0]] + as_json([a]) + [pieces[1]], (E, 0): as_json([ea])}
    consumer = FakeConsumer(log, order=[(J, 0), (J, 0), (E, 0), (J, 0)], idle_s=0.3)
    events = list(GroupReader(source(consumer, 'trajectories'), 1, timeout_ms=1000, idle_exit_ms=3000, poll_s=0, clock=consumer.clock).events())
    assert [ev.kind for ev in events] == ['orphaned', 'group']
    assert [c_[(J, 0)] for c_ in consumer.commits if (J, 0) in c_] == [0, 3]


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


# --- several consumers in one group: rebalances ---


def test_a_consumer_taking_a_partition_over_never_emits_a_group_the_first_one_emitted():
    """g completes on partition 0 behind h's records; the first consumer holds it back, so when
    partition 0 moves to a second consumer, that one reads g again from the committed offsets and
    is the only one to emit it."""
    a, b, c, ea, eb, ec = stream()
    d, ed = rollout('d', 1, group_id='h', final_reward=1)
    e, ee = rollout('e', 1, group_id='k', final_reward=1)
    f, ef = rollout('f', 2, group_id='k', final_reward=0)
    log = {(T, 0): enc(c[:1] + a + b), (E, 0): enc([ec, ea, eb]), (T, 1): enc(e + f), (E, 1): enc([ee, ef])}
    committed = {}
    P0, P1 = [(T, 0), (E, 0)], [(T, 1), (E, 1)]
    # Idle polls move the clock 0.3 s: had the first consumer kept h and g, h would time out there
    # and g go out behind it.
    first = FakeConsumer(log, committed, on_idle=[lambda c_: c_.rebalance(P1)], idle_s=0.3)
    events = []
    reader = GroupReader(source(first, max_batch=1), 2, rows='transitions', timeout_ms=1000, idle_exit_ms=5000, poll_s=0, clock=first.clock,
                         on_event=events.append)
    assert [g['uid'] for g in reader] == ['k']
    # The revocation committed below h's records; g was forgotten, so h never timed out here.
    assert committed == {(T, 0): 0, (E, 0): 0, (T, 1): 3, (E, 1): 2}
    assert [ev.kind for ev in events] == ['assigned']
    log[(T, 0)] += enc(c[1:] + d)
    log[(E, 0)] += enc([ed])
    second = FakeConsumer(log, committed, owned=P0)
    assert [g['uid'] for g in GroupReader(source(second), 2, rows='transitions', idle_exit_ms=0, poll_s=0, clock=second.clock)] == ['g', 'h']
    assert committed == {k: len(msgs) for k, msgs in log.items()}


def test_messages_read_before_a_revocation_in_the_same_poll_are_dropped():
    (x, ex), (y, ey) = rollout('x', 1, group_id='gx', final_reward=1), rollout('y', 1, group_id='gy', final_reward=1)
    log = {(T, 0): enc(x), (E, 0): enc([ex]), (T, 1): enc(y), (E, 1): enc([ey])}
    committed = {}
    # Partition 0's two messages are read in the poll that then loses partition 0.
    first = FakeConsumer(log, committed, script={3: lambda c_: c_.rebalance([(T, 1), (E, 1)])})
    assert [g['uid'] for g in GroupReader(source(first), 1, rows='transitions', idle_exit_ms=0, poll_s=0, clock=first.clock)] == ['gy']
    assert first.handed == 4 and committed == {(T, 1): 1, (E, 1): 1}
    second = FakeConsumer(log, committed, owned=[(T, 0), (E, 0)])
    assert [g['uid'] for g in GroupReader(source(second), 1, rows='transitions', idle_exit_ms=0, poll_s=0, clock=second.clock)] == ['gx']


def test_a_rebalance_mid_record_reads_again_from_the_committed_offsets_and_emits_the_group_once():
    a, _, _, ea, _, _ = stream()
    first = chunk(a[0]['transition_id'], json.dumps(a[0]).encode(), 300)
    third = chunk(a[2]['transition_id'], json.dumps(a[2]).encode(), 300)
    log = {(T, 0): first + enc(a[1:2]) + third, (E, 0): enc([ea])}
    # The rebalance comes after a's first transition (whole from its chunks), its second one and
    # the first chunk of its third: all of them are read again, the first one put together again.
    consumer = FakeConsumer(log, script={len(first) + 3: lambda c_: c_.rebalance()})
    src = source(consumer, max_batch=1)
    events = []
    groups = list(GroupReader(src, 1, rows='transitions', idle_exit_ms=0, poll_s=0, clock=consumer.clock, on_event=events.append))
    assert [g['batch']['transition_id'] for g in groups] == [[t['transition_id'] for t in a]]
    assert consumer.handed == len(first) + 2 + len(log[(T, 0)]) + 1
    assert [ev.message for ev in events] == ['joined consumer group trainer: lightning.episodes [0], lightning.transitions [0]']
    assert consumer.committed == {(T, 0): len(log[(T, 0)]), (E, 0): 1}


def test_the_plain_reader_makes_delta_prompts_whole_after_a_rebalance_in_the_middle_of_a_chain():
    a, _, _, ea, _, _ = stream()
    wire = [a[0], as_delta(a[1], a[0]), as_delta(a[2], a[1])]
    log = {(T, 0): enc(wire), (E, 0): enc([ea])}
    consumer = FakeConsumer(log, script={3: lambda c_: c_.rebalance()})  # after the first delta
    events = []
    reader = RecordReader(source(consumer, max_batch=1), idle_exit_ms=0, poll_s=0, clock=consumer.clock, on_event=events.append)
    assert list(reader.transitions()) == a
    assert [ev.kind for ev in events] == ['assigned']
    assert consumer.committed == {(T, 0): 3, (E, 0): 1}


def test_partition_assignment_is_range_unless_set_and_cooperative_assignors_are_refused():
    seen = []
    KafkaSource(['b:1'], 'x', consumer_factory=lambda s: seen.append(s) or FakeConsumer({}))
    KafkaSource(['b:1'], 'x', settings={'partition.assignment.strategy': 'roundrobin'}, consumer_factory=lambda s: seen.append(s) or FakeConsumer({}))
    assert [s['partition.assignment.strategy'] for s in seen] == ['range', 'roundrobin']
    with pytest.raises(ValueError, match='cooperative-sticky is not supported'):
        KafkaSource(['b:1'], 'x', settings={'partition.assignment.strategy': 'cooperative-sticky'}, consumer_factory=lambda s: FakeConsumer({}))


def test_an_assignment_without_the_same_partitions_of_each_topic_is_reported():
    log = {(J, 0): [], (J, 1): [], (E, 0): []}
    consumer = FakeConsumer(log)
    src = source(consumer, 'trajectories')
    consumer.rebalance([(J, 0), (J, 1), (E, 0)])
    _, events = src.poll(0)
    assert [ev.kind for ev in events] == ['assigned', 'not_co_partitioned']
    assert events[0].message == 'joined consumer group trainer: lightning.episodes [0], lightning.trajectories [0,1]'
    assert events[1].message.startswith('kafka: this consumer was assigned lightning.episodes [0], lightning.trajectories [0,1], not the same partitions')
    consumer.rebalance([])
    assert [ev.message for ev in src.poll(0)[1]] == ['joined consumer group trainer: no partitions']
