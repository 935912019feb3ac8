"""What a source (Kafka topics or the file exporter's directory) hands to the pipelines."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

from .position import PartitionKey, Position

TRANSITION = 'transition'
TRAJECTORY = 'trajectory'
EPISODE = 'episode'

#: What a source reads besides episodes, as ``exporters.records`` names what the sidecar writes.
RECORDS = ('trajectories', 'transitions', 'both')


def record_kinds(records: str) -> tuple[str, ...]:
    """The record kinds (``TRANSITION``, ``TRAJECTORY``) a source set to ``records`` reads besides episodes."""
    if records == 'trajectories':
        return (TRAJECTORY,)
    if records == 'transitions':
        return (TRANSITION,)
    if records == 'both':
        return (TRANSITION, TRAJECTORY)
    raise ValueError(f"records must be 'trajectories', 'transitions' or 'both', not {records!r}")


@dataclass(frozen=True)
class Incoming:
    """One message read: a whole decoded record, or None (a chunk of a record not yet complete).

    ``kind`` is ``TRANSITION``, ``TRAJECTORY`` or ``EPISODE``. ``position`` is where the record
    begins (its first chunk), ``read_at`` the message just read.
    """

    kind: str
    record: Optional[dict[str, Any]]
    position: Optional[Position]
    read_at: Optional[Position] = None


@dataclass(frozen=True)
class SourceEvent:
    """Something a source skipped or gave up on; ``message`` says what, for a log line.

    ``undecodable`` (a message that is not a record), ``invalid_chunk`` (a chunk that cannot be
    used, or a reassembled record of the wrong size or digest), ``chunks_dropped`` (a chunked
    record timed out or evicted by the byte bound), ``kafka_error``, ``kafka_unreachable``;
    ``assigned`` (the partitions this consumer owns after a rebalance) and ``not_co_partitioned``
    (they are not the same partition numbers of each topic).
    """

    kind: str
    message: str
    position: Optional[Position] = None


class Source(Protocol):
    #: ``'trajectories'``, ``'transitions'`` or ``'both'``: what is read besides episodes.
    records: str

    def poll(self, timeout_s: float) -> tuple[list[Incoming], list[SourceEvent]]:
        """What arrived within ``timeout_s`` (possibly nothing)."""

    def processed(self, item: Incoming) -> None:
        """``item`` has been taken over by the pipeline: offsets may move past it (subject to
        ``commit``'s bound). Items are processed in the order ``poll`` returned them."""

    def commit(self, pending: dict[PartitionKey, int]) -> None:
        """Stores progress: per partition, up to the lowest offset still ``pending`` (exclusive)."""

    def tick(self, now_ms: float) -> list[SourceEvent]:
        """Gives up on what waited too long (unfinished chunked records)."""

    def exhausted(self) -> bool:
        """True when nothing more can arrive (a finished file read); Kafka never is."""

    def close(self) -> None: ...

    # Optional (KafkaSource has them; readers use them when present):
    #   held() -> dict[PartitionKey, int]: per partition, the lowest offset of what the source holds
    #     and the pipeline has not taken (records in chunks, items polled and not yet processed);
    #     complete groups wait for it.
    #   bind(pending, reset): at a rebalance the source commits below ``pending()`` and calls
    #     ``reset()`` so the pipeline forgets what it holds.
