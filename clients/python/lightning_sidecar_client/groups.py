"""GRPO groups from transitions and episodes, as the Node ``groups`` command assembles them.

Records may arrive in any order and more than once. A group is yielded when ``group_size``
episodes of one ``group_id`` are closed and all their transitions are present, shaped as a
``lightning.group.v1`` line; a group already done is never yielded again; groups waiting longer
than ``timeout_ms`` are reported incomplete and dropped; an episode arriving for a done or full
group is reported late. Prompt deltas are made whole from the previous transition of the episode, held
here (same partition, read first) until the group is done.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Union

from .deltas import rebuild_prompt
from .position import PartitionKey, Position, lowest

Record = dict[str, Any]
GroupBatch = dict[str, Any]


@dataclass(frozen=True)
class GroupReady:
    batch: GroupBatch
    kind: str = 'group'


@dataclass(frozen=True)
class GroupIncomplete:
    uid: str
    episodes: int
    waited_ms: float
    kind: str = 'incomplete'


@dataclass(frozen=True)
class EpisodeLate:
    uid: str
    rollout_id: str
    attempt_id: str
    kind: str = 'late'


@dataclass(frozen=True)
class EpisodeUngrouped:
    rollout_id: str
    attempt_id: str
    kind: str = 'ungrouped'


@dataclass(frozen=True)
class TransitionsOrphaned:
    transitions: int
    kind: str = 'orphaned'


@dataclass(frozen=True)
class DeltaUnresolved:
    """A prompt delta that could not be made whole: the transition goes on without prompt ids."""

    transition_id: str
    previous_transition_id: str
    reason: str
    kind: str = 'unresolved_delta'


GroupEvent = Union[GroupReady, GroupIncomplete, EpisodeLate, EpisodeUngrouped, TransitionsOrphaned, DeltaUnresolved]


@dataclass
class _Held:
    t: Record
    pos: Position | None
    at: float


@dataclass
class _PendingGroup:
    first_seen: float
    episodes: dict[tuple[str, str], tuple[Record, Position | None]] = field(default_factory=dict)


def _js_order(s: str) -> bytes:
    """Sort key ordering strings as JavaScript's `<` does (by UTF-16 code units)."""
    return s.encode('utf-16-be', 'surrogatepass')


class GroupAssembler:
    def __init__(self, group_size: int, timeout_ms: float = 600_000, done: Iterable[str] = ()) -> None:
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError('groups: group_size must be a positive integer')
        self.group_size = group_size
        self.timeout_ms = timeout_ms
        #: uids already emitted or given up on
        self.done: set[str] = set(done)
        self._transitions: dict[str, _Held] = {}
        self._groups: dict[str, _PendingGroup] = {}
        self._seen_episodes: set[tuple[str, str]] = set()

    def has_transition(self, transition_id: str) -> bool:
        return transition_id in self._transitions

    def add_transition(self, t: Record, pos: Position | None, now_ms: float) -> list[GroupEvent]:
        """Holds ``t``; a prompt delta is made whole from the previous transition held here."""
        gid = t.get('group_id')
        if gid is not None and gid in self.done:
            return []
        tid = t['transition_id']
        if tid in self._transitions:
            return self._check(gid)
        events: list[GroupEvent] = []
        delta = t.get('prompt_token_ids_delta')
        if delta:
            prev_id = delta.get('previous_transition_id') or ''
            held = self._transitions.get(prev_id)
            prompt, reason = rebuild_prompt(delta, (held.t.get('prompt_token_ids'), held.t.get('response_token_ids')) if held else None)
            if reason is not None:
                events.append(DeltaUnresolved(tid, prev_id, reason))
            t = {k: v for k, v in t.items() if k != 'prompt_token_ids_delta'}
            t['prompt_token_ids'] = prompt
        self._transitions[tid] = _Held(t, pos, now_ms)
        return events + self._check(gid)

    def add_episode(self, e: Record, pos: Position | None, now_ms: float) -> list[GroupEvent]:
        key = (e['rollout_id'], e['attempt_id'])
        gid = e.get('group_id')
        if gid is None:
            for tid in e.get('transition_ids') or []:
                self._transitions.pop(tid, None)
            return [EpisodeUngrouped(e['rollout_id'], e['attempt_id'])]
        if gid in self.done:
            return [] if key in self._seen_episodes else [EpisodeLate(gid, e['rollout_id'], e['attempt_id'])]
        self._seen_episodes.add(key)
        g = self._groups.get(gid)
        if g is None:
            g = self._groups[gid] = _PendingGroup(first_seen=now_ms)
        if key not in g.episodes:
            if len(g.episodes) >= self.group_size:
                return [EpisodeLate(gid, e['rollout_id'], e['attempt_id'])]
            g.episodes[key] = (e, pos)
        return self._check(gid)

    def tick(self, now_ms: float) -> list[GroupEvent]:
        """Gives up on groups (and stray transitions) older than the timeout."""
        out: list[GroupEvent] = []
        for uid, g in list(self._groups.items()):
            if now_ms - g.first_seen < self.timeout_ms:
                continue
            out.append(GroupIncomplete(uid, len(g.episodes), now_ms - g.first_seen))
            self._finish(uid, g)
        orphaned = 0
        for tid, x in list(self._transitions.items()):
            gid = x.t.get('group_id')
            if now_ms - x.at >= self.timeout_ms and (gid is None or gid not in self._groups):
                del self._transitions[tid]
                orphaned += 1
        if orphaned > 0:
            out.append(TransitionsOrphaned(orphaned))
        return out

    def lowest_pending(self) -> dict[PartitionKey, int]:
        """Per (topic, partition), the lowest offset still needed (commit up to it, exclusive)."""
        low = lowest(x.pos for x in self._transitions.values() if x.pos is not None)
        return lowest((p for g in self._groups.values() for _, p in g.episodes.values() if p is not None), low)

    @property
    def pending_groups(self) -> int:
        return len(self._groups)

    def pending_group_ids(self) -> list[str]:
        return list(self._groups)

    def _check(self, uid: str | None) -> list[GroupEvent]:
        if uid is None:
            return []
        g = self._groups.get(uid)
        if g is None or len(g.episodes) < self.group_size:
            return []
        for e, _ in g.episodes.values():
            for tid in e.get('transition_ids') or []:
                if tid not in self._transitions:
                    return []
        batch = self._build(uid, g)
        self._finish(uid, g)
        return [GroupReady(batch)]

    def _finish(self, uid: str, g: _PendingGroup) -> None:
        for e, _ in g.episodes.values():
            for tid in e.get('transition_ids') or []:
                self._transitions.pop(tid, None)
        for tid in [tid for tid, x in self._transitions.items() if x.t.get('group_id') == uid]:
            del self._transitions[tid]
        del self._groups[uid]
        self.done.add(uid)

    def _build(self, uid: str, g: _PendingGroup) -> GroupBatch:
        episodes = sorted((e for e, _ in g.episodes.values()), key=lambda e: (_js_order(e['rollout_id']), _js_order(e['attempt_id'])))
        names = ('uid', 'rollout_id', 'attempt_id', 'transition_id', 'seq', 'prompt_ids', 'response_ids', 'response_mask',
                 'token_level_scores', 'rollout_log_probs', 'reward', 'is_last', 'policy_version')
        batch: dict[str, list[Any]] = {n: [] for n in names}
        skipped = 0
        for e in episodes:
            for tid in e.get('transition_ids') or []:
                t = self._transitions[tid].t
                prompt, response = t.get('prompt_token_ids'), t.get('response_token_ids')
                if prompt is None or response is None:
                    skipped += 1
                    continue
                n = len(response)
                reward = t.get('reward')
                batch['uid'].append(uid)
                batch['rollout_id'].append(t.get('rollout_id'))
                batch['attempt_id'].append(t.get('attempt_id'))
                batch['transition_id'].append(t.get('transition_id'))
                batch['seq'].append(t.get('seq'))
                batch['prompt_ids'].append(prompt)
                batch['response_ids'].append(response)
                batch['response_mask'].append([1] * n)
                # The whole (credited + AIR) reward sits on the last response token, as veRL expects.
                batch['token_level_scores'].append([reward if i == n - 1 else 0 for i in range(n)])
                batch['rollout_log_probs'].append(t.get('response_logprobs'))
                batch['reward'].append(reward)
                batch['is_last'].append(t.get('is_last'))
                batch['policy_version'].append(t.get('policy_version'))
        return {
            'schema': 'lightning.group.v1',
            'uid': uid,
            'group_size': self.group_size,
            'episodes': [_episode_entry(e) for e in episodes],
            'batch': batch,
            'skipped_no_token_ids': skipped,
        }


def _episode_entry(e: Record) -> dict[str, Any]:
    # Keys a record lacks are left out, as JSON.stringify leaves out undefined members.
    out = {k: e[k] for k in ('rollout_id', 'attempt_id', 'final_reward', 'episode_status', 'transitions') if k in e}
    out['policy_version_lag'] = e.get('policy_version_lag')
    return out
