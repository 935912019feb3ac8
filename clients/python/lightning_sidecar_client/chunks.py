"""Reassembly of records the exporter split into chunks (``lightning-chunk: v1`` messages).

Chunks are collected per partition under (record id, SHA-256), in any interleaving with other
records; an index already held is a redelivery and ignored; the record is whole when every index
is present and the concatenation has the announced size and digest. Records still missing
chunks ``timeout_ms`` after their first one are dropped and reported, as are the oldest ones when
the bytes held pass ``max_bytes``. Chunks of a record completed recently are ignored (a resent
copy), so they do not wait out the timeout.
"""
from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

from .position import PartitionKey, Position, lowest
from .records import header

Headers = Union[Sequence[tuple[str, Optional[bytes]]], Mapping[str, Optional[bytes]], None]

CHUNK_HEADERS = ('lightning-chunk', 'lightning-record-id', 'lightning-chunk-index', 'lightning-chunk-count', 'lightning-record-bytes', 'lightning-record-sha256')
_DECIMAL = re.compile(r'^\d{1,15}$')
_SHA256 = re.compile(r'^[0-9a-f]{64}$')


class ChunkError(ValueError):
    """A chunk that cannot be used (unknown format, bad headers, disagreeing with its siblings)."""

    code = 'BAD_CHUNK'

    def __init__(self, record_id: Optional[str], reason: str) -> None:
        super().__init__(reason)
        self.record_id = record_id
        self.reason = reason


@dataclass(frozen=True)
class ChunkedRecord:
    """A record put back together: its value, its own headers, and where its first chunk is."""

    value: bytes
    headers: list[tuple[str, Optional[bytes]]]
    position: Position
    record_id: str
    chunks: int


@dataclass(frozen=True)
class DroppedRecord:
    """A record given up on: ``timeout`` (chunks missing) or ``evicted`` (over the byte bound)."""

    reason: str
    record_id: str
    topic: str
    partition: int
    have: int
    count: int
    waited_ms: float = 0


@dataclass
class _Assembly:
    record_id: str
    sha256: str
    count: int
    size: int
    first: Position
    first_seen_ms: float
    headers: Headers = None
    parts: dict[int, bytes] = field(default_factory=dict)
    held: int = 0


def is_chunk(headers: Headers) -> bool:
    return header(headers, 'lightning-chunk') is not None


def _decimal(s: Optional[str]) -> Optional[int]:
    return int(s) if s is not None and _DECIMAL.match(s) else None


def _items(headers: Headers) -> list[tuple[str, Optional[bytes]]]:
    if not headers:
        return []
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers)


class ChunkAssembler:
    def __init__(self, timeout_ms: float = 600_000, max_bytes: int = 256 * 1024 * 1024, remember_completed: int = 10_000) -> None:
        self.timeout_ms = timeout_ms
        self.max_bytes = max_bytes
        self._remember = remember_completed
        self._pending: OrderedDict[tuple[str, int, str, str], _Assembly] = OrderedDict()
        self._completed: OrderedDict[tuple[str, int, str, str], None] = OrderedDict()
        self._held = 0

    def add(self, headers: Headers, value: Optional[bytes], pos: Position, now_ms: float) -> tuple[Optional[ChunkedRecord], list[DroppedRecord]]:
        """Takes one chunk; returns the whole record once its last chunk is in, and records dropped.

        Raises ChunkError for a chunk that cannot be used, or a record whose size or digest is wrong.
        """
        version = header(headers, 'lightning-chunk')
        record_id = header(headers, 'lightning-record-id')
        if version != 'v1':
            raise ChunkError(record_id, f"unsupported chunk format '{version}'")
        index = _decimal(header(headers, 'lightning-chunk-index'))
        count = _decimal(header(headers, 'lightning-chunk-count'))
        size = _decimal(header(headers, 'lightning-record-bytes'))
        sha = header(headers, 'lightning-record-sha256') or ''
        if not record_id:
            raise ChunkError(record_id, 'no lightning-record-id header')
        if count is None or count < 2:
            raise ChunkError(record_id, 'lightning-chunk-count must be a whole number ≥ 2')
        if index is None or index >= count:
            raise ChunkError(record_id, f'lightning-chunk-index must be 0…{count - 1}')
        if size is None:
            raise ChunkError(record_id, 'lightning-record-bytes must be a whole number')
        if not _SHA256.match(sha):
            raise ChunkError(record_id, 'lightning-record-sha256 must be 64 lower-case hex digits')
        key = (pos.topic, pos.partition, record_id, sha)
        if key in self._completed:
            return None, []
        a = self._pending.get(key)
        if a is not None and (a.count != count or a.size != size):
            raise ChunkError(record_id, 'chunk count or record size differs from earlier chunks of the same record')
        if a is None:
            a = self._pending[key] = _Assembly(record_id, sha, count, size, pos, now_ms)
        if index in a.parts:
            return None, []
        data = bytes(value or b'')
        a.parts[index] = data
        a.held += len(data)
        self._held += len(data)
        if pos.offset < a.first.offset:
            a.first = pos
        if index == 0:
            a.headers = headers
        if len(a.parts) < a.count:
            return None, self._evict_beyond_cap(keep=key, now_ms=now_ms)
        self._remove(key)
        whole = b''.join(a.parts[i] for i in range(a.count))
        if len(whole) != a.size:
            raise ChunkError(record_id, f'reassembled {len(whole)} bytes, lightning-record-bytes says {a.size}')
        if hashlib.sha256(whole).hexdigest() != a.sha256:
            raise ChunkError(record_id, 'reassembled bytes do not match their SHA-256')
        self._completed[key] = None
        while len(self._completed) > self._remember:
            self._completed.popitem(last=False)
        own = [(k, v) for k, v in _items(a.headers) if k not in CHUNK_HEADERS]
        return ChunkedRecord(whole, own, a.first, record_id, a.count), []

    def tick(self, now_ms: float) -> list[DroppedRecord]:
        """Drops records whose first chunk came ``timeout_ms`` or more ago."""
        out = []
        for key, a in list(self._pending.items()):
            if now_ms - a.first_seen_ms >= self.timeout_ms:
                self._remove(key)
                out.append(self._describe(a, 'timeout', now_ms))
        return out

    def lowest_pending(self) -> dict[PartitionKey, int]:
        """Per partition, the first chunk of a record still being assembled."""
        return lowest(a.first for a in self._pending.values())

    @property
    def pending_records(self) -> int:
        return len(self._pending)

    @property
    def held_bytes(self) -> int:
        return self._held

    def _evict_beyond_cap(self, keep: tuple[str, int, str, str], now_ms: float) -> list[DroppedRecord]:
        out = []
        for key, a in list(self._pending.items()):
            if self._held <= self.max_bytes:
                break
            if key == keep:
                continue
            self._remove(key)
            out.append(self._describe(a, 'evicted', now_ms))
        return out

    def _remove(self, key: tuple[str, int, str, str]) -> None:
        a = self._pending.pop(key)
        self._held -= a.held

    @staticmethod
    def _describe(a: _Assembly, reason: str, now_ms: float) -> DroppedRecord:
        return DroppedRecord(reason, a.record_id, a.first.topic, a.first.partition, len(a.parts), a.count, now_ms - a.first_seen_ms)
