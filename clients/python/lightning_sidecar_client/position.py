from __future__ import annotations

from typing import Iterable, NamedTuple


class Position(NamedTuple):
    """Where a record came from: commit a partition only below what is still pending."""

    topic: str
    partition: int
    offset: int


PartitionKey = tuple[str, int]


def lowest(positions: Iterable[Position], into: dict[PartitionKey, int] | None = None) -> dict[PartitionKey, int]:
    """Per (topic, partition), the lowest offset among ``positions`` (merged into ``into``)."""
    low = {} if into is None else into
    for p in positions:
        k = (p.topic, p.partition)
        if k not in low or p.offset < low[k]:
            low[k] = p.offset
    return low
