"""The file exporter's output: ``{data_dir}/trajectories/``, ``transitions/`` and ``episodes/*.ndjson``.

The exporter appends an attempt's trajectories and transitions before the episode line that closes
it, so each poll reads new record lines first (transitions, then trajectories), then new episode
lines. ``records`` picks the record directories read besides ``episodes/``: ``trajectories``
(default), ``transitions`` or ``both``. Only whole lines are read (a line still being written waits
for the next poll); ``follow=False`` reads what is there once and is then exhausted.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from .position import PartitionKey
from .records import DecodeError, decode_episode, decode_trajectory, decode_transition
from .source import EPISODE, TRAJECTORY, TRANSITION, Incoming, SourceEvent, record_kinds

_DIRS = ((TRANSITION, 'transitions', decode_transition), (TRAJECTORY, 'trajectories', decode_trajectory), (EPISODE, 'episodes', decode_episode))


class FileSource:
    def __init__(self, data_dir: str | os.PathLike[str], *, follow: bool = False, records: str = 'trajectories') -> None:
        self.data_dir = Path(data_dir)
        self.records = records
        self._kinds = (*record_kinds(records), EPISODE)
        self._follow = follow
        self._read: dict[Path, int] = {}
        self._lines: dict[Path, int] = {}
        self._polled = False

    def poll(self, timeout_s: float = 0) -> tuple[list[Incoming], list[SourceEvent]]:
        """New whole lines; when following and there are none, waits ``timeout_s`` first."""
        items: list[Incoming] = []
        events: list[SourceEvent] = []
        for kind, sub, decode in _DIRS:
            if kind not in self._kinds:
                continue
            for path in sorted((self.data_dir / sub).glob('*.ndjson')):
                for lineno, line in self._new_lines(path):
                    try:
                        items.append(Incoming(kind, decode(line), None))
                    except DecodeError:
                        events.append(SourceEvent('undecodable', f'an undecodable line at {path}:{lineno}'))
        self._polled = True
        if not items and not events and self._follow and timeout_s > 0:
            time.sleep(timeout_s)
        return items, events

    def _new_lines(self, path: Path) -> list[tuple[int, bytes]]:
        """Whole lines appended since the last poll, with their line numbers."""
        start = self._read.get(path, 0)
        with open(path, 'rb') as f:
            f.seek(start)
            data = f.read()
        end = data.rfind(b'\n') + 1
        if end == 0:
            return []
        self._read[path] = start + end
        first = self._lines.get(path, 0)
        lines = data[:end].split(b'\n')[:-1]
        self._lines[path] = first + len(lines)
        return [(first + i + 1, line) for i, line in enumerate(lines) if line.strip()]

    def processed(self, item: Incoming) -> None:
        pass

    def commit(self, pending: dict[PartitionKey, int]) -> None:
        pass

    def tick(self, now_ms: float) -> list[SourceEvent]:
        return []

    def exhausted(self) -> bool:
        return self._polled and not self._follow

    def close(self) -> None:
        pass
