"""Full prompt ids for transitions the exporter sent as prompt deltas (``prompt_ids: delta``).

A delta transition names the previous transition of its episode; its full prompt is that
transition's full prompt, then its response ids, then the delta's suffix (``prefix_length`` checks
the first two parts). Per open episode the resolver keeps the two latest calls' transitions (what
the next delta can refer to) and the position of the first transition of the current delta chain
(what a restarted reader must read again to rebuild them), so offsets are not committed past it;
``forget`` (on the episode summary) and the timeout release both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .position import PartitionKey, Position, lowest

Record = dict[str, Any]


class UnresolvedDeltaError(ValueError):
    """The delta's previous transition is unknown, has no token ids, or does not match its length."""

    code = 'UNRESOLVED_DELTA'

    def __init__(self, transition_id: str, previous_transition_id: str, reason: str) -> None:
        super().__init__(f'prompt delta of {transition_id}: {reason}')
        self.transition_id = transition_id
        self.previous_transition_id = previous_transition_id
        self.reason = reason


@dataclass
class _Episode:
    # Where re-reading must start to rebuild `calls`: the first transition of the delta chain.
    anchor: Optional[Position]
    # seq -> transition_id -> (full prompt ids, response ids), for the two latest calls: choices
    # of one call arrive one after another, each naming the previous call.
    calls: dict[int, dict[str, tuple[Optional[list[int]], Optional[list[int]]]]] = field(default_factory=dict)
    last_seen_ms: float = 0


def is_delta(t: Record) -> bool:
    return isinstance(t.get('prompt_token_ids_delta'), dict)


def rebuild_prompt(delta: dict[str, Any], previous: Optional[tuple[Optional[list[int]], Optional[list[int]]]]) -> tuple[Optional[list[int]], Optional[str]]:
    """The full prompt from the previous transition's (prompt ids, response ids), or why not."""
    prev_id = delta.get('previous_transition_id')
    if previous is None:
        return None, f'previous transition {prev_id} is not held'
    prompt, response = previous
    if prompt is None or response is None:
        return None, f'previous transition {prev_id} has no token ids'
    prefix = len(prompt) + len(response)
    if prefix != delta.get('prefix_length'):
        return None, f"prefix_length {delta.get('prefix_length')} but the previous prompt and response hold {prefix} ids"
    return list(prompt) + list(response) + list(delta.get('suffix') or []), None


class PromptResolver:
    def __init__(self, timeout_ms: float = 600_000) -> None:
        self.timeout_ms = timeout_ms
        self._episodes: dict[tuple[str, str], _Episode] = {}

    def resolve(self, t: Record, pos: Position | None, now_ms: float) -> tuple[Record, UnresolvedDeltaError | None]:
        """Returns ``t`` with full ``prompt_token_ids`` (and no delta), remembered for the next call.

        A delta that cannot be rebuilt gives ``prompt_token_ids: None`` and the error; the
        transition is still remembered, so later deltas of the chain fail the same way.
        """
        key = (t.get('rollout_id'), t.get('attempt_id'))
        ep = self._episodes.get(key)
        seq = t.get('seq') or 0
        was_delta = is_delta(t)
        error: UnresolvedDeltaError | None = None
        if 'prompt_token_ids_delta' in t:
            delta = t['prompt_token_ids_delta']
            t = {k: v for k, v in t.items() if k != 'prompt_token_ids_delta'}
            if was_delta:
                prev_id = delta.get('previous_transition_id') or ''
                prev = next((c[prev_id] for c in ep.calls.values() if prev_id in c), None) if ep else None
                t['prompt_token_ids'], reason = rebuild_prompt(delta, prev)
                if reason is not None:
                    error = UnresolvedDeltaError(t.get('transition_id', ''), prev_id, reason)
        if ep is None:
            ep = self._episodes[key] = _Episode(anchor=pos)
        elif not was_delta and seq > max(ep.calls, default=-1):
            ep.anchor = pos
        ep.calls.setdefault(seq, {})[t['transition_id']] = (t.get('prompt_token_ids'), t.get('response_token_ids'))
        while len(ep.calls) > 2:
            del ep.calls[min(ep.calls)]
        ep.last_seen_ms = now_ms
        return t, error

    def holds(self, t: Record) -> bool:
        """Whether ``t`` (by ``transition_id``) is among the calls kept for its episode."""
        ep = self._episodes.get((t.get('rollout_id'), t.get('attempt_id')))
        return ep is not None and any(t.get('transition_id') in c for c in ep.calls.values())

    def forget(self, rollout_id: str, attempt_id: str) -> None:
        """The episode is closed: no later delta refers to its transitions."""
        self._episodes.pop((rollout_id, attempt_id), None)

    def tick(self, now_ms: float) -> int:
        """Forgets episodes idle longer than the timeout; returns how many."""
        stale = [k for k, e in self._episodes.items() if now_ms - e.last_seen_ms >= self.timeout_ms]
        for k in stale:
            del self._episodes[k]
        return len(stale)

    def lowest_pending(self) -> dict[PartitionKey, int]:
        return lowest(e.anchor for e in self._episodes.values() if e.anchor is not None)

    @property
    def open_episodes(self) -> int:
        return len(self._episodes)

