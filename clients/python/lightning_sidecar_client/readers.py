"""Loops that drive a source through a pipeline: complete groups, or plain records.

Both are generators: progress (the state file, Kafka offsets) is stored when the caller comes back
for the next item, so nothing is committed past what the caller has been handed. Ticks (group and
chunk timeouts) run every ``min(1 s, max(50 ms, timeout / 4))``, as in the Node command.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Iterator, Optional, Union

from .groups import GroupBatch, GroupIncomplete, GroupReady
from .pipeline import GroupPipeline, PipelineEvent, RecordPipeline
from .source import TRAJECTORY, TRANSITION, Incoming, Source, SourceEvent, record_kinds
from .state import load_done, remember

Event = Union[PipelineEvent, SourceEvent]


class _Loop:
    def __init__(self, source: Source, timeout_ms: float, idle_exit_ms: Optional[float], poll_s: float, clock: Callable[[], float]) -> None:
        self.source = source
        self._timeout_ms = timeout_ms
        self._idle_exit_ms = idle_exit_ms
        self._poll_s = poll_s
        self._clock = clock
        self._stopped = False

    def stop(self) -> None:
        """Ends the iteration after the current item (safe from a signal handler)."""
        self._stopped = True

    def now_ms(self) -> float:
        return self._clock() * 1000

    @property
    def tick_ms(self) -> float:
        return min(1000.0, max(50.0, self._timeout_ms / 4))


class GroupReader(_Loop):
    """Complete GRPO groups (``lightning.group.v1`` dicts), each once.

    ``rows``: ``'trajectories'`` (default: one row per trajectory record) or ``'transitions'``
    (one row per call); the source must read that kind of record. ``state_path``: a file of done
    group ids (emitted or given up on), appended and fsync'd as they happen and read back at start,
    so a restarted reader never yields a group twice. ``done``: more ids to skip. Iterating yields
    groups; ``on_event`` sees everything else (incomplete, late, ungrouped, not exported, orphaned,
    unresolved deltas, skipped messages). ``events()`` yields all of it.
    """

    def __init__(
        self,
        source: Source,
        group_size: int,
        *,
        rows: str = 'trajectories',
        timeout_ms: float = 600_000,
        state_path: Union[str, os.PathLike[str], None] = None,
        done: Iterable[str] = (),
        on_event: Optional[Callable[[Event], None]] = None,
        idle_exit_ms: Optional[float] = None,
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(source, timeout_ms, idle_exit_ms, poll_s, clock)
        # Complete groups wait for what the source still holds before them: records in chunks, or
        # read and not yet processed (KafkaSource.held).
        self.pipeline = GroupPipeline(group_size, timeout_ms, set(done) | load_done([state_path]), rows=rows, blockers=getattr(source, 'held', None))
        _check_reads(source, TRAJECTORY if rows == 'trajectories' else TRANSITION, f'GroupReader(rows={rows!r})')
        _bind(source, self.pipeline)
        self.state_path = state_path
        self._on_event = on_event

    def __iter__(self) -> Iterator[GroupBatch]:
        for ev in self.events():
            if isinstance(ev, GroupReady):
                yield ev.batch
            elif self._on_event is not None:
                self._on_event(ev)

    def events(self) -> Iterator[Event]:
        src, pipe = self.source, self.pipeline
        last_tick = last_activity = self.now_ms()
        try:
            while not self._stopped:
                items, src_events = src.poll(self._poll_s)
                yield from src_events
                now = self.now_ms()
                if items:
                    last_activity = now
                for item in items:
                    # Taken before it is added: the source no longer holds it, so it does not hold
                    # back the groups it completes.
                    src.processed(item)
                    emitted = False
                    for ev in pipe.add(item, now):
                        yield from self._note(ev)
                        emitted = emitted or isinstance(ev, GroupReady)
                    if emitted:
                        src.commit(pipe.lowest_pending())
                    if self._stopped:
                        break
                src.commit(pipe.lowest_pending())
                now = self.now_ms()
                if now - last_tick >= self.tick_ms:
                    last_tick = now
                    for ev in [*src.tick(now), *pipe.tick(now)]:
                        yield from self._note(ev)
                    src.commit(pipe.lowest_pending())
                if src.exhausted() or (self._idle_exit_ms is not None and now - last_activity > self._idle_exit_ms):
                    break
        finally:
            src.commit(pipe.lowest_pending())

    def _note(self, ev: Event) -> Iterator[Event]:
        if self.state_path is not None:
            if isinstance(ev, GroupReady):
                remember(self.state_path, ev.batch['uid'], 'emitted')
            elif isinstance(ev, GroupIncomplete):
                remember(self.state_path, ev.uid, 'incomplete')
        yield ev


class RecordReader(_Loop):
    """Transitions (full prompt ids, each once), trajectories (each once) and episode summaries,
    in arrival order, as the source reads them.

    Iterating yields ``Incoming`` items (``kind`` is ``'transition'``, ``'trajectory'`` or
    ``'episode'``); ``transitions()`` and ``trajectories()`` yield just those dicts. ``on_event``
    sees skipped messages and unresolved deltas.
    """

    def __init__(
        self,
        source: Source,
        *,
        timeout_ms: float = 600_000,
        on_event: Optional[Callable[[Event], None]] = None,
        idle_exit_ms: Optional[float] = None,
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(source, timeout_ms, idle_exit_ms, poll_s, clock)
        self.pipeline = RecordPipeline(timeout_ms)
        self._on_event = on_event
        _bind(source, self.pipeline)

    def __iter__(self) -> Iterator[Incoming]:
        src, pipe = self.source, self.pipeline
        last_tick = last_activity = self.now_ms()
        try:
            while not self._stopped:
                items, events = src.poll(self._poll_s)
                self._report(events)
                now = self.now_ms()
                if items:
                    last_activity = now
                for item in items:
                    out, events = pipe.add(item, now)
                    self._report(events)
                    if out is not None:
                        yield out
                    src.processed(item)
                    if self._stopped:
                        break
                src.commit(pipe.lowest_pending())
                now = self.now_ms()
                if now - last_tick >= self.tick_ms:
                    last_tick = now
                    self._report([*src.tick(now), *pipe.tick(now)])
                if src.exhausted() or (self._idle_exit_ms is not None and now - last_activity > self._idle_exit_ms):
                    break
        finally:
            src.commit(pipe.lowest_pending())

    def transitions(self) -> Iterator[dict]:
        _check_reads(self.source, TRANSITION, 'RecordReader.transitions()')
        for item in self:
            if item.kind == TRANSITION:
                yield item.record  # type: ignore[misc]

    def trajectories(self) -> Iterator[dict]:
        _check_reads(self.source, TRAJECTORY, 'RecordReader.trajectories()')
        for item in self:
            if item.kind == TRAJECTORY:
                yield item.record  # type: ignore[misc]

    def _report(self, events: list) -> None:
        if self._on_event is not None:
            for ev in events:
                self._on_event(ev)


def _bind(source: Source, pipeline: Union[GroupPipeline, RecordPipeline]) -> None:
    """Lets a source that rebalances (Kafka) commit below what the pipeline needs and then reset it."""
    bind = getattr(source, 'bind', None)
    if bind is not None:
        bind(pipeline.lowest_pending, pipeline.reset)


def _check_reads(source: Source, kind: str, what: str) -> None:
    """Refuses a source that does not read the ``kind`` records ``what`` needs (it would wait forever)."""
    records = getattr(source, 'records', None)
    if records is not None and kind not in record_kinds(records):
        raise ValueError(f'{what}: the source does not read {kind} records (records={records!r})')
