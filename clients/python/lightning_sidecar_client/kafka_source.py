"""The trajectories (or transitions) and episodes topics, read in a Kafka consumer group with confluent-kafka.

Offsets are committed by hand and only below what is still pending (records of open groups,
chunks of unfinished records, records handed out but not yet processed, the start of an open
episode's prompt-delta chain), so a restarted consumer reads again everything it had not finished
with.

Several consumers in one consumer group: the sidecar keys all of a group's records by its group
id, so they share a partition number in each topic (the topics must have as many partitions each),
and librdkafka's ``range`` assignor (the default here) gives partition ``p`` of every subscribed
topic to the same member. A rebalance (eager: every partition is revoked, then the new assignment
given) commits what is safe, forgets everything pending here and in the reader, and reads again
from the committed offsets.
"""
from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Callable, Optional, Sequence

from .chunks import ChunkAssembler, ChunkError, DroppedRecord, is_chunk
from .position import PartitionKey, Position, lowest
from .records import DecodeError, decode_episode, decode_trajectory, decode_transition, encoding_of
from .source import EPISODE, TRAJECTORY, TRANSITION, Incoming, SourceEvent, record_kinds

DEFAULT_TOPIC = 'lightning.transitions'
DEFAULT_EPISODES_TOPIC = 'lightning.episodes'
DEFAULT_TRAJECTORIES_TOPIC = 'lightning.trajectories'

_DECODERS = {TRANSITION: decode_transition, TRAJECTORY: decode_trajectory, EPISODE: decode_episode}

log = logging.getLogger('lightning_sidecar_client.kafka')


#: The install command that brings confluent-kafka, for messages.
KAFKA_EXTRA = "pip install './clients/python[kafka]'"


class KafkaUnavailableError(RuntimeError):
    code = 'KAFKA_CLIENT_MISSING'


def confluent_kafka() -> Any:
    """The confluent_kafka module: the ``kafka`` extra, imported only when Kafka is read or written."""
    try:
        import confluent_kafka as ck
    except ImportError:
        raise KafkaUnavailableError(f'Kafka needs the Kafka extra (confluent-kafka): {KAFKA_EXTRA}') from None
    return ck


#: librdkafka's assignor giving partition p of every subscribed topic (of equal partition counts)
#: to the same member. Node's ``groups`` uses an assignor of its own: the two must not share a group.
DEFAULT_ASSIGNMENT_STRATEGY = 'range'


def brokers_from_env(env: Optional[dict[str, str]] = None) -> list[str]:
    raw = (env if env is not None else os.environ).get('LIGHTNING_KAFKA_BROKERS', '')
    return [b.strip() for b in raw.split(',') if b.strip()]


def _default_consumer(settings: dict[str, Any]) -> Any:
    return confluent_kafka().Consumer(settings)


class KafkaSource:
    """Reads the episodes topic and, per ``records``, the trajectories topic (``'trajectories'``,
    the default), the transitions topic ``topic`` (``'transitions'``) or both, as consumer group
    ``group_id``. Chunked records are put back together whichever topic they are on.

    ``settings`` are extra librdkafka properties (security.protocol, sasl.*, ssl.*, ...; they
    override the defaults, ``partition.assignment.strategy=range`` among them, but a cooperative
    assignor is refused: a rebalance must read every partition again from its committed offset);
    ``consumer_factory`` builds the consumer from the full settings (tests inject one).

    ``until_end``: the source is exhausted (its reader stops) once every partition assigned to it
    has been read to its end (librdkafka's ``enable.partition.eof``), as a files source without
    ``follow`` stops at the end of its files: a job that takes what is there and exits. What is
    still pending then (a group not complete yet, a chunked record not whole) stays uncommitted,
    for the next reader. An assignment of no partitions counts as read to its end.

    Readers call ``bind``: at a revocation the source commits below what the reader still needs,
    then has the reader forget everything pending.
    """

    def __init__(
        self,
        brokers: Sequence[str] | str,
        group_id: str,
        *,
        topic: str = DEFAULT_TOPIC,
        episodes_topic: str = DEFAULT_EPISODES_TOPIC,
        trajectories_topic: str = DEFAULT_TRAJECTORIES_TOPIC,
        records: str = 'trajectories',
        settings: Optional[dict[str, Any]] = None,
        chunk_timeout_ms: float = 600_000,
        chunk_max_bytes: int = 256 * 1024 * 1024,
        max_batch: int = 500,
        consumer_factory: Callable[[dict[str, Any]], Any] = _default_consumer,
        clock: Callable[[], float] = time.monotonic,
        give_up_s: Optional[float] = None,
        until_end: bool = False,
    ) -> None:
        servers = brokers if isinstance(brokers, str) else ','.join(brokers)
        if not servers:
            raise ValueError('kafka: no brokers (pass brokers or set LIGHTNING_KAFKA_BROKERS)')
        kinds = record_kinds(records)
        self.topic = topic
        self.episodes_topic = episodes_topic
        self.trajectories_topic = trajectories_topic
        self.records = records
        # Which kind of record each subscribed topic carries.
        read = [(t, k) for k, t in ((TRANSITION, topic), (TRAJECTORY, trajectories_topic), (EPISODE, episodes_topic)) if k in kinds or k == EPISODE]
        self._kinds = dict(read)
        if len(self._kinds) != len(read):
            names = {TRANSITION: 'transitions', TRAJECTORY: 'trajectories', EPISODE: 'episodes'}
            raise ValueError(f'kafka: each kind of record needs its own topic ({", ".join(f"{names[k]}: {t}" for t, k in read)})')
        self._max_batch = max_batch
        self._clock = clock
        self._chunks = ChunkAssembler(timeout_ms=chunk_timeout_ms, max_bytes=chunk_max_bytes)
        # Giving up on brokers never reached (as the Node consumers do): after `give_up_s` with
        # broker errors and no message, poll reports `kafka_unreachable`.
        self._servers = servers
        self._group_id = group_id
        self._give_up_s = give_up_s
        self._started = clock()
        self._reached = False
        self._broker_error: Optional[str] = None
        self._gave_up = False
        self._last: dict[PartitionKey, int] = {}
        self._committed: dict[PartitionKey, int] = {}
        # Items handed out by poll and not yet processed, in order: what they hold is still needed.
        self._handed: deque[Incoming] = deque()
        # The reader's pending offsets and its reset, once bound; a rebalance during poll.
        self._pending: Optional[Callable[[], dict[PartitionKey, int]]] = None
        self._reset: Optional[Callable[[], None]] = None
        self._rebalanced = False
        self._rebalance_events: list[SourceEvent] = []
        # Read to the end: the partitions assigned, and those read to their end since their last message.
        self._until_end = until_end
        self._assignment: Optional[set[PartitionKey]] = None
        self._at_end: set[PartitionKey] = set()
        full = {
            'bootstrap.servers': servers,
            'group.id': group_id,
            'enable.auto.commit': False,
            'enable.auto.offset.store': False,
            'auto.offset.reset': 'earliest',
            'fetch.wait.max.ms': 250,
            'partition.assignment.strategy': DEFAULT_ASSIGNMENT_STRATEGY,
            'logger': log,
            'error_cb': self._on_error,
            **({'enable.partition.eof': True} if until_end else {}),
            **(settings or {}),
        }
        if 'cooperative' in str(full['partition.assignment.strategy']):
            raise ValueError(f"kafka: partition.assignment.strategy {full['partition.assignment.strategy']} is not supported: a rebalance must "
                             'read every partition again from its committed offset, as the eager assignors do (use range, the default)')
        self._consumer = consumer_factory(full)
        self._consumer.subscribe(list(self._kinds), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        self._closed = False

    def bind(self, pending: Callable[[], dict[PartitionKey, int]], reset: Callable[[], None]) -> None:
        """The reader's side of a rebalance: ``pending()`` (per partition, the lowest offset it still
        needs) bounds the commit made at a revocation; ``reset()`` then forgets what it holds."""
        self._pending, self._reset = pending, reset

    def poll(self, timeout_s: float) -> tuple[list[Incoming], list[SourceEvent]]:
        """What arrived within ``timeout_s``, up to ``max_batch`` messages.

        One message per ``Consumer.poll`` call, so a rebalance callback (served inside it) falls
        between two messages: the items read before a revocation are dropped (the partitions are
        read again from their committed offsets, or now belong to another consumer); a message
        returned after the callback is from the new assignment, librdkafka discarding the ones
        fetched before it (their fetch version is outdated).
        """
        items: list[Incoming] = []
        events: list[SourceEvent] = []
        wait = timeout_s
        while len(items) < self._max_batch:
            msg = self._consumer.poll(wait)
            wait = 0
            if self._rebalanced:
                self._rebalanced = False
                items = []
            events += self._rebalance_events
            self._rebalance_events = []
            if msg is None:
                break
            err = msg.error()
            if err is not None:
                if err.code() != _partition_eof():
                    events.append(SourceEvent('kafka_error', f'kafka: {err}'))
                else:
                    self._reached = True
                    self._at_end.add((msg.topic(), msg.partition()))
                continue
            self._reached = True
            self._at_end.discard((msg.topic(), msg.partition()))
            pos = Position(msg.topic(), msg.partition(), msg.offset())
            kind = self._kinds[pos.topic]
            headers, value, record_pos = msg.headers(), msg.value() or b'', pos
            if is_chunk(headers):
                try:
                    whole, dropped = self._chunks.add(headers, value, pos, self._clock() * 1000)
                except ChunkError as e:
                    events.append(SourceEvent('invalid_chunk', f"skipping record {e.record_id or '?'} at {_where(pos)}: {e.reason}", pos))
                    items.append(Incoming(kind, None, pos))
                    continue
                events += [_dropped(d) for d in dropped]
                if whole is None:
                    items.append(Incoming(kind, None, pos))
                    continue
                headers, value, record_pos = whole.headers, whole.value, whole.position
            try:
                record = _DECODERS[kind](value, encoding_of(headers))
            except DecodeError:
                events.append(SourceEvent('undecodable', f'skipping an undecodable record at {_where(record_pos)}', record_pos))
                items.append(Incoming(kind, None, pos))
                continue
            # The record counts from its first chunk, so commits stay below all of it until done.
            items.append(Incoming(kind, record, record_pos, pos))
        self._handed.extend(items)
        if not self._reached and self._consumer_assigned():
            self._reached = True
        waited = self._clock() - self._started
        if not self._reached and not self._gave_up and self._give_up_s is not None and self._broker_error is not None and waited >= self._give_up_s:
            self._gave_up = True
            events.append(SourceEvent('kafka_unreachable', f'gave up on Kafka at {self._servers} after {round(waited)} s: {self._broker_error}'))
        return items, events

    def _on_error(self, err: Any) -> None:
        # librdkafka's client-level errors: brokers down, name resolution, transport.
        self._broker_error = err.str() if hasattr(err, 'str') else str(err)

    def _consumer_assigned(self) -> bool:
        try:
            return len(self._consumer.assignment()) > 0
        except Exception:
            return False

    def _on_revoke(self, consumer: Any, partitions: list) -> None:
        """Commits below what is still pending, then forgets everything read (an eager rebalance
        revokes every partition; the new assignment is read again from the committed offsets)."""
        if self._pending is not None:
            self.commit(self._pending())
        self._forget(partitions)

    def _on_lost(self, consumer: Any, partitions: list) -> None:
        """As a revocation, without the commit: the partitions already belong to another member."""
        self._forget(partitions)

    def _on_assign(self, consumer: Any, partitions: list) -> None:
        # librdkafka starts each assigned partition at its committed offset (the assignment's
        # offsets are OFFSET_INVALID, read as "stored"): nothing read before is kept.
        self._forget([])
        self._assignment = {(tp.topic, tp.partition) for tp in partitions}
        # Read again from the committed offsets: no partition is at its end yet.
        self._at_end = set()
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        numbers = {t: sorted(ps) for t, ps in by_topic.items()}
        owned = ', '.join(f'{t} [{",".join(map(str, ps))}]' for t, ps in sorted(numbers.items()))
        self._rebalance_events.append(SourceEvent('assigned', f'joined consumer group {self._group_id}: {owned or "no partitions"}'))
        # Each subscribed topic with the same partition numbers, or none at all.
        same = not numbers or (len(numbers) == len(self._kinds) and len({tuple(ps) for ps in numbers.values()}) == 1)
        if not same:
            self._rebalance_events.append(SourceEvent(
                'not_co_partitioned',
                f'kafka: this consumer was assigned {owned}, not the same partitions of {", ".join(sorted(self._kinds))}: a group whose '
                'records are split between consumers is never complete (give the topics as many partitions each, and every consumer '
                'of the group the same topics and assignor)'))

    def _forget(self, partitions: list) -> None:
        """Drops what was read and not finished with, in this source and (``reset``) in the reader."""
        self._rebalanced = True
        self._chunks = ChunkAssembler(timeout_ms=self._chunks.timeout_ms, max_bytes=self._chunks.max_bytes)
        self._handed.clear()
        for tp in partitions:
            self._last.pop((tp.topic, tp.partition), None)
            self._committed.pop((tp.topic, tp.partition), None)
            self._at_end.discard((tp.topic, tp.partition))
            if self._assignment is not None:
                self._assignment.discard((tp.topic, tp.partition))
        if self._reset is not None:
            self._reset()

    def held(self) -> dict[PartitionKey, int]:
        """Per partition, the lowest offset of what this source holds that the reader has not
        processed: records still in chunks, and items handed out by ``poll`` not yet processed."""
        return lowest((p for p in (x.position or x.read_at for x in self._handed) if p is not None), self._chunks.lowest_pending())

    def processed(self, item: Incoming) -> None:
        """``item`` is taken over by the reader (no longer held here): offsets may move past it."""
        if self._handed and self._handed[0] is item:
            self._handed.popleft()
        else:
            for i, x in enumerate(self._handed):
                if x is item:
                    del self._handed[i]
                    break
        pos = item.read_at or item.position
        if pos is not None:
            self._last[(pos.topic, pos.partition)] = pos.offset

    def commit(self, pending: dict[PartitionKey, int]) -> None:
        held = self.held()
        offsets = {}
        for k, last in self._last.items():
            offsets[k] = min(last + 1, pending.get(k, last + 1), held.get(k, last + 1))
        changed = {k: o for k, o in offsets.items() if self._committed.get(k) != o}
        if not changed:
            return
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in changed.items()], asynchronous=False)
            self._committed.update(changed)
        except KafkaException as e:
            # A rebalance or a broker hiccup: the next commit carries the same offsets.
            log.warning('kafka: offset commit failed: %s', e)

    def committed(self) -> dict[PartitionKey, int]:
        """What this source last committed, per partition."""
        return dict(self._committed)

    def tick(self, now_ms: float) -> list[SourceEvent]:
        return [_dropped(d) for d in self._chunks.tick(now_ms)]

    def exhausted(self) -> bool:
        """With ``until_end``: every assigned partition read to its end (after an assignment came)."""
        return self._until_end and self._assignment is not None and self._assignment <= self._at_end

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._consumer.close()


def _dropped(d: DroppedRecord) -> SourceEvent:
    why = f'after {round(d.waited_ms)} ms' if d.reason == 'timeout' else 'chunk buffer full'
    return SourceEvent('chunks_dropped', f'dropped record {d.record_id} at {d.topic}/{d.partition}: {d.have} of {d.count} chunks ({why})')


def _where(pos: Position) -> str:
    return f'{pos.topic}/{pos.partition}@{pos.offset}'


def _partition_eof() -> int:
    from confluent_kafka import KafkaError

    return KafkaError._PARTITION_EOF
