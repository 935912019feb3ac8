"""``until_end``: a Kafka source read to the end of its assigned partitions, then exhausted."""
import json

import pytest

pytest.importorskip('confluent_kafka')

from confluent_kafka import KafkaError

from lightning_sidecar_client import open_source
from lightning_sidecar_client.kafka_source import KafkaSource
from lightning_sidecar_client.readers import RecordReader
from factories import JSON_HEADERS, rollout
from test_readers import TP, Msg

T, E = 'lightning.transitions', 'lightning.episodes'


class EofMsg(Msg):
    """librdkafka's end-of-partition event: a message whose error is ``_PARTITION_EOF``."""

    def __init__(self, topic, partition, offset):
        super().__init__(topic, partition, offset, None, None)

    def error(self):
        return KafkaError(KafkaError._PARTITION_EOF)


class EofConsumer:
    """Assigns ``assigned`` at the first poll, then hands out each partition's messages and, as
    librdkafka with ``enable.partition.eof`` does, one end-of-partition event each time a partition
    is read to its end. ``log`` may grow between polls."""

    def __init__(self, log, assigned):
        self.log, self.assigned = log, assigned
        self.next, self.eof_sent, self.settings, self.polls = {}, set(), None, 0

    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None):
        self.on_assign, self.on_revoke = on_assign, on_revoke

    def poll(self, timeout):
        self.polls += 1
        if self.polls == 1:
            self.on_assign(self, [TP(t, p) for t, p in self.assigned])
        for key in self.assigned:
            msgs, i = self.log.get(key, []), self.next.get(key, 0)
            if i < len(msgs):
                self.next[key] = i + 1
                self.eof_sent.discard(key)
                return Msg(key[0], key[1], i, *msgs[i])
            if key not in self.eof_sent:
                self.eof_sent.add(key)
                return EofMsg(key[0], key[1], i)
        return None

    def commit(self, offsets, asynchronous):
        pass

    def close(self):
        pass


def enc(records):
    return [(JSON_HEADERS, json.dumps(r).encode()) for r in records]


def source(consumer, **kw):
    def factory(settings):
        consumer.settings = settings
        return consumer
    return KafkaSource(['broker:9092'], 'trainer', records='transitions', consumer_factory=factory, **kw)


def test_a_reader_takes_every_record_there_and_stops_at_the_end():
    ts, ep = rollout('r', 3, group_id='g', final_reward=1)
    consumer = EofConsumer({(T, 0): enc(ts), (E, 0): enc([ep])}, [(T, 0), (E, 0)])
    got = list(RecordReader(source(consumer, until_end=True), poll_s=0).transitions())
    assert [t['transition_id'] for t in got] == [t['transition_id'] for t in ts]
    assert consumer.settings['enable.partition.eof'] is True


def test_exhausted_only_once_every_assigned_partition_is_at_its_end():
    ts, ep = rollout('r', 1, group_id='g', final_reward=1)
    consumer = EofConsumer({(T, 0): enc(ts), (E, 0): enc([ep])}, [(T, 0), (E, 0), (T, 1)])
    src = source(consumer, until_end=True, max_batch=1)
    assert not src.exhausted()  # no assignment yet
    src.poll(0)  # assigned; T/0's transition
    assert not src.exhausted()
    src.poll(0)  # T/0 at its end; E/0's episode
    assert not src.exhausted()
    src.poll(0)  # E/0 and T/1 (empty) at their ends
    assert src.exhausted()


def test_a_partition_with_a_new_message_is_not_at_its_end_until_read_to_it_again():
    ts, _ = rollout('r', 2, group_id='g', final_reward=1)
    consumer = EofConsumer({(T, 0): enc(ts[:1])}, [(T, 0)])
    src = source(consumer, until_end=True, max_batch=1)
    src.poll(0)
    src.poll(0)
    assert src.exhausted()
    consumer.log[(T, 0)] += enc(ts[1:])
    src.poll(0)  # the new message, its end not read yet
    assert not src.exhausted()
    src.poll(0)
    assert src.exhausted()


def test_an_assignment_of_no_partitions_is_at_its_end_and_a_source_without_until_end_never_is():
    empty = source(EofConsumer({}, []), until_end=True)
    empty.poll(0)
    assert empty.exhausted()
    consumer = EofConsumer({(T, 0): []}, [(T, 0)])
    plain = source(consumer)
    plain.poll(0)
    plain.poll(0)
    assert not plain.exhausted()
    assert 'enable.partition.eof' not in consumer.settings


def test_until_end_and_follow_on_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match='until_end and follow'):
        open_source(data_dir=tmp_path, follow=True, until_end=True)
