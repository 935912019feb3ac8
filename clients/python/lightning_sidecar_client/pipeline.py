"""What happens to each decoded record: groups built, or prompts made whole and duplicates dropped.

Pure (no I/O, time passed in), so it is tested without Kafka.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable, Optional

from .deltas import PromptResolver
from .groups import DeltaUnresolved, GroupAssembler, GroupEvent
from .position import PartitionKey
from .source import EPISODE, TRAJECTORY, Incoming

PipelineEvent = GroupEvent


class GroupPipeline:
    """Records into a GroupAssembler (which also makes prompt deltas whole).

    ``rows``: ``'trajectories'`` (one row per trajectory, the default) or ``'transitions'`` (one
    per call); records of the other kind are not used. ``blockers``: per partition, the lowest
    offset of what the source still holds (a record in chunks): complete groups wait for it.
    """

    def __init__(self, group_size: int, timeout_ms: float = 600_000, done: Iterable[str] = (), rows: str = 'trajectories',
                 blockers: Optional[Callable[[], dict[PartitionKey, int]]] = None) -> None:
        self.groups = GroupAssembler(group_size, timeout_ms, done, rows=rows, blockers=blockers)

    @property
    def done(self) -> set[str]:
        return self.groups.done

    def add(self, item: Incoming, now_ms: float) -> list[PipelineEvent]:
        r = item.record
        if r is None:
            return []
        if item.kind == EPISODE:
            return self.groups.add_episode(r, item.position, now_ms)
        if item.kind == TRAJECTORY:
            return self.groups.add_trajectory(r, item.position, now_ms)
        return self.groups.add_transition(r, item.position, now_ms)

    def tick(self, now_ms: float) -> list[PipelineEvent]:
        return self.groups.tick(now_ms)

    def lowest_pending(self) -> dict[PartitionKey, int]:
        return self.groups.lowest_pending()

    def reset(self) -> None:
        """Forgets everything pending (after a rebalance); the done set stays."""
        self.groups.reset()


class _Seen:
    """A bounded set: the oldest keys are forgotten first."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._keys: OrderedDict[object, None] = OrderedDict()

    def add(self, key: object) -> bool:
        """True when ``key`` is new."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._limit:
            self._keys.popitem(last=False)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class RecordPipeline:
    """Plain records for trainers that batch their own way: whole prompts, each record once.

    Duplicates are recognised among the last ``remember`` transition ids, trajectory ids and
    episode keys. Trajectories pass as they are (they carry their whole token ids).
    """

    def __init__(self, timeout_ms: float = 600_000, remember: int = 200_000) -> None:
        self.prompts = PromptResolver(timeout_ms)
        self._seen = _Seen(remember)

    def add(self, item: Incoming, now_ms: float) -> tuple[Optional[Incoming], list[PipelineEvent]]:
        r = item.record
        if r is None:
            return None, []
        if item.kind == EPISODE:
            if not self._seen.add(('episode', r.get('rollout_id'), r.get('attempt_id'))):
                return None, []
            self.prompts.forget(r.get('rollout_id'), r.get('attempt_id'))
            return item, []
        if item.kind == TRAJECTORY:
            return (item if self._seen.add(('trajectory', r.get('trajectory_id'))) else None), []
        if not self._seen.add(r.get('transition_id')):
            # Not handed out again. After a rebalance the resolver starts empty and an open episode's
            # delta chain is read again from its first transition: the resolver takes it back.
            episode = ('episode', r.get('rollout_id'), r.get('attempt_id'))
            if episode not in self._seen and not self.prompts.holds(r):
                self.prompts.resolve(r, item.position, now_ms)
            return None, []
        t, error = self.prompts.resolve(r, item.position, now_ms)
        events: list[PipelineEvent] = []
        if error is not None:
            events.append(DeltaUnresolved(error.transition_id, error.previous_transition_id, error.reason))
        return Incoming(item.kind, t, item.position, item.read_at), events

    def tick(self, now_ms: float) -> list[PipelineEvent]:
        self.prompts.tick(now_ms)
        return []

    def lowest_pending(self) -> dict[PartitionKey, int]:
        return self.prompts.lowest_pending()

    def reset(self) -> None:
        """Forgets the open prompt-delta chains (after a rebalance); the records already handed out
        stay known, so the ones read again are not handed out twice."""
        self.prompts = PromptResolver(self.prompts.timeout_ms)
