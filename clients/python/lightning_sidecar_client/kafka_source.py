"""The trajectories (or transitions) and episodes topics, read in a Kafka consumer group with confluent-kafka.

Offsets are committed by hand and only below what is still pending (records of open groups,
chunks of unfinished records, the start of an open episode's prompt-delta chain), so a restarted
consumer reads again everything it had not finished with.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional, Sequence

from .chunks import ChunkAssembler, ChunkError, DroppedRecord, is_chunk
from .position import PartitionKey, Position
from .records import DecodeError, decode_episode, decode_trajectory, decode_transition, encoding_of
from .source import EPISODE, TRAJECTORY, TRANSITION, Incoming, SourceEvent, record_kinds

DEFAULT_TOPIC = 'lightning.transitions'
DEFAULT_EPISODES_TOPIC = 'lightning.episodes'
DEFAULT_TRAJECTORIES_TOPIC = 'lightning.trajectories'

_DECODERS = {TRANSITION: decode_transition, TRAJECTORY: decode_trajectory, EPISODE: decode_episode}

log = logging.getLogger('lightning_sidecar_client.kafka')


class KafkaUnavailableError(RuntimeError):
    code = 'KAFKA_CLIENT_MISSING'


def brokers_from_env(env: Optional[dict[str, str]] = None) -> list[str]:
    raw = (env if env is not None else os.environ).get('LIGHTNING_KAFKA_BROKERS', '')
    return [b.strip() for b in raw.split(',') if b.strip()]


def _default_consumer(settings: dict[str, Any]) -> Any:
    try:
        from confluent_kafka import Consumer
    except ImportError as e:
        raise KafkaUnavailableError('kafka: confluent-kafka is not installed (Debian: python3-confluent-kafka; PyPI: confluent-kafka)') from e
    return Consumer(settings)


class KafkaSource:
    """Reads the episodes topic and, per ``records``, the trajectories topic (``'trajectories'``,
    the default), the transitions topic ``topic`` (``'transitions'``) or both, as consumer group
    ``group_id``. Chunked records are put back together whichever topic they are on.

    ``settings`` are extra librdkafka properties (security.protocol, sasl.*, ssl.*, ...);
    ``consumer_factory`` builds the consumer from the full settings (tests inject one).
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
        self._give_up_s = give_up_s
        self._started = clock()
        self._reached = False
        self._broker_error: Optional[str] = None
        self._gave_up = False
        self._last: dict[PartitionKey, int] = {}
        self._committed: dict[PartitionKey, int] = {}
        full = {
            'bootstrap.servers': servers,
            'group.id': group_id,
            'enable.auto.commit': False,
            'enable.auto.offset.store': False,
            'auto.offset.reset': 'earliest',
            'fetch.wait.max.ms': 250,
            'logger': log,
            'error_cb': self._on_error,
            **(settings or {}),
        }
        self._consumer = consumer_factory(full)
        self._consumer.subscribe(list(self._kinds))
        self._closed = False

    def poll(self, timeout_s: float) -> tuple[list[Incoming], list[SourceEvent]]:
        items: list[Incoming] = []
        events: list[SourceEvent] = []
        for msg in self._consumer.consume(num_messages=self._max_batch, timeout=timeout_s):
            err = msg.error()
            if err is not None:
                if err.code() != _partition_eof():
                    events.append(SourceEvent('kafka_error', f'kafka: {err}'))
                else:
                    self._reached = True
                continue
            self._reached = True
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

    def processed(self, item: Incoming) -> None:
        pos = item.read_at or item.position
        if pos is not None:
            self._last[(pos.topic, pos.partition)] = pos.offset

    def commit(self, pending: dict[PartitionKey, int]) -> None:
        chunks = self._chunks.lowest_pending()
        offsets = {}
        for k, last in self._last.items():
            offsets[k] = min(last + 1, pending.get(k, last + 1), chunks.get(k, last + 1))
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
        return False

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
