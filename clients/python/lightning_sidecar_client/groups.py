"""GRPO groups from trajectories (or transitions) and episodes, as the Node ``groups`` command assembles them.

Two row kinds (``rows``): ``'trajectories'`` (the default), one row per trajectory record (a
continuous token segment of a rollout attempt, several calls with a loss mask), and
``'transitions'``, one row per call. Records may arrive in any order and more than once. A group
is yielded when ``group_size`` episodes of one ``group_id`` are closed and all the records they
list (``trajectory_ids`` or ``transition_ids``) are present, shaped as a ``lightning.group.v1``
line; a group already done is never yielded again; groups waiting longer than ``timeout_ms`` are
reported incomplete and dropped; an episode arriving for a done or full group is reported late;
an episode whose sidecar did not export the row kind is reported once and not used. Prompt deltas
(transition rows) are made whole from the previous transition of the episode, held here (same
partition, read first) until the group is done.

A complete group is yielded once no record still needed (by a group being assembled, a stray
record, or ``blockers``: records the source still holds, such as chunks being reassembled) lies
at or before its last record on any topic-partition it has records on; complete groups whose
records interleave go out together, in the order they completed. So offsets committed below what
is still pending are past every record of a yielded group, and a consumer that takes a partition
over in a rebalance never reads one of them again. This is the Node ``GroupAssembler``
(src/trainer/groups.ts), step for step: the same stream gives the same events in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

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
    """Records dropped because their episode never came: ``transitions`` of them, of kind ``records``."""

    transitions: int
    records: str = 'transitions'
    kind: str = 'orphaned'


@dataclass(frozen=True)
class EpisodeNotExported:
    """An episode whose sidecar did not export the ``rows`` records: it cannot complete a group."""

    rollout_id: str
    attempt_id: str
    rows: str
    kind: str = 'not_exported'


@dataclass(frozen=True)
class DeltaUnresolved:
    """A prompt delta that could not be made whole: the transition goes on without prompt ids."""

    transition_id: str
    previous_transition_id: str
    reason: str
    kind: str = 'unresolved_delta'


GroupEvent = Union[GroupReady, GroupIncomplete, EpisodeLate, EpisodeUngrouped, EpisodeNotExported, TransitionsOrphaned, DeltaUnresolved]

ROWS = ('trajectories', 'transitions')


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
    """Holds the records of open groups and builds each group's line once it is complete.

    ``rows='trajectories'`` holds trajectories (``add_trajectory``) and ignores transitions;
    ``rows='transitions'`` the reverse, with lines exactly as before trajectories existed.
    """

    def __init__(self, group_size: int, timeout_ms: float = 600_000, done: Iterable[str] = (), rows: str = 'trajectories',
                 blockers: Optional[Callable[[], dict[PartitionKey, int]]] = None) -> None:
        """``blockers``: per (topic, partition), the lowest offset of records held elsewhere (a record
        still in chunks): a complete group with a record at or after it on that partition waits."""
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError('groups: group_size must be a positive integer')
        if rows not in ROWS:
            raise ValueError(f"groups: rows must be 'trajectories' or 'transitions', not {rows!r}")
        self.group_size = group_size
        self.timeout_ms = timeout_ms
        self.rows = rows
        #: uids already emitted or given up on
        self.done: set[str] = set(done)
        # Trajectories or transitions (per `rows`) by id.
        self._records: dict[str, _Held] = {}
        self._groups: dict[str, _PendingGroup] = {}
        # Groups with every record present, waiting for the records before them on their
        # partitions; in the order they completed (a dict as an ordered set).
        self._complete: dict[str, None] = {}
        self._seen_episodes: set[tuple[str, str]] = set()
        self._blockers = blockers

    def has_transition(self, transition_id: str) -> bool:
        return self.rows == 'transitions' and transition_id in self._records

    def has_trajectory(self, trajectory_id: str) -> bool:
        return self.rows == 'trajectories' and trajectory_id in self._records

    def add_transition(self, t: Record, pos: Position | None, now_ms: float) -> list[GroupEvent]:
        """Holds ``t``; a prompt delta is made whole from the previous transition held here.

        With trajectory rows a transition is not used: nothing happens.
        """
        if self.rows != 'transitions':
            return []
        gid = t.get('group_id')
        if gid is not None and gid in self.done:
            return []
        tid = t['transition_id']
        if tid in self._records:
            return self._check(gid)
        events: list[GroupEvent] = []
        delta = t.get('prompt_token_ids_delta')
        if delta:
            prev_id = delta.get('previous_transition_id') or ''
            held = self._records.get(prev_id)
            prompt, reason = rebuild_prompt(delta, (held.t.get('prompt_token_ids'), held.t.get('response_token_ids')) if held else None)
            if reason is not None:
                events.append(DeltaUnresolved(tid, prev_id, reason))
            t = {k: v for k, v in t.items() if k != 'prompt_token_ids_delta'}
            t['prompt_token_ids'] = prompt
        self._records[tid] = _Held(t, pos, now_ms)
        return events + self._check(gid)

    def add_trajectory(self, t: Record, pos: Position | None, now_ms: float) -> list[GroupEvent]:
        """Holds ``t`` (the first copy of each ``trajectory_id``). With transition rows nothing happens."""
        if self.rows != 'trajectories':
            return []
        gid = t.get('group_id')
        if gid is not None and gid in self.done:
            return []
        tid = t['trajectory_id']
        if tid not in self._records:
            self._records[tid] = _Held(t, pos, now_ms)
        return self._check(gid)

    def add_episode(self, e: Record, pos: Position | None, now_ms: float) -> list[GroupEvent]:
        key = (e['rollout_id'], e['attempt_id'])
        gid = e.get('group_id')
        if gid is None:
            for rid in self._ids(e):
                self._records.pop(rid, None)
            return [EpisodeUngrouped(e['rollout_id'], e['attempt_id'])]
        if gid in self.done:
            return [] if key in self._seen_episodes else [EpisodeLate(gid, e['rollout_id'], e['attempt_id'])]
        if not self._exported(e):
            # Reported once per attempt, however often it is delivered; it does not start its group.
            if key in self._seen_episodes:
                return []
            self._seen_episodes.add(key)
            return [EpisodeNotExported(e['rollout_id'], e['attempt_id'], self.rows)]
        self._seen_episodes.add(key)
        g = self._groups.get(gid)
        if g is None:
            g = self._groups[gid] = _PendingGroup(first_seen=now_ms)
        if key not in g.episodes:
            if len(g.episodes) >= self.group_size:
                return [EpisodeLate(gid, e['rollout_id'], e['attempt_id'])]
            g.episodes[key] = (e, pos)
        return self._check(gid)

    def reset(self) -> None:
        """Forgets everything pending (the done set stays): after a rebalance the consumer reads again
        from the committed offsets, below every record that was pending, and rebuilds what it owns."""
        self._records.clear()
        self._groups.clear()
        self._complete.clear()
        self._seen_episodes.clear()

    def tick(self, now_ms: float) -> list[GroupEvent]:
        """Gives up on groups (and stray records) older than the timeout; yields the complete groups that
        waited for them. A complete group is never given up on."""
        out: list[GroupEvent] = []
        for uid, g in list(self._groups.items()):
            if uid in self._complete or now_ms - g.first_seen < self.timeout_ms:
                continue
            out.append(GroupIncomplete(uid, len(g.episodes), now_ms - g.first_seen))
            self._finish(uid, g)
        orphaned = 0
        for rid, x in list(self._records.items()):
            gid = x.t.get('group_id')
            if now_ms - x.at >= self.timeout_ms and (gid is None or gid not in self._groups):
                del self._records[rid]
                orphaned += 1
        if orphaned > 0:
            out.append(TransitionsOrphaned(orphaned, self.rows))
        out += self._release()
        return out

    def lowest_pending(self) -> dict[PartitionKey, int]:
        """Per (topic, partition), the lowest offset still needed (commit up to it, exclusive)."""
        return lowest(p for _, p in self._positions(lambda uid: True))

    def _positions(self, which: Callable[[Optional[str]], bool]) -> Iterable[tuple[Optional[str], Position]]:
        """The group (or None) and position of every pending record whose group ``which`` accepts."""
        for x in self._records.values():
            gid = x.t.get('group_id')
            if x.pos is not None and which(gid):
                yield gid, x.pos
        for uid, g in self._groups.items():
            if which(uid):
                for _, p in g.episodes.values():
                    if p is not None:
                        yield uid, p

    def _release(self) -> list[GroupEvent]:
        """Yields the complete groups no pending record comes before.

        A complete group is held back while a record of a group still being assembled (or a stray
        record, or a blocker, or a record of a complete group held back itself) lies at or before its
        last record on a partition it has records on. The groups not held back go out in the order
        they completed.
        """
        if not self._complete:
            return []
        last: dict[str, dict[PartitionKey, int]] = {}
        for uid, p in self._positions(lambda u: u in self._complete):
            m = last.setdefault(uid or '', {})
            k = (p.topic, p.partition)
            m[k] = max(m.get(k, -1), p.offset)
        low = dict(self._blockers() if self._blockers is not None else {})
        lowest((p for _, p in self._positions(lambda u: u is None or u not in self._complete)), low)
        held: set[str] = set()
        changed = True
        while changed:
            changed = False
            for uid in self._complete:
                if uid in held:
                    continue
                if not any(k in low and offset >= low[k] for k, offset in last.get(uid, {}).items()):
                    continue
                held.add(uid)
                changed = True
                lowest((p for _, p in self._positions(lambda u, uid=uid: u == uid)), low)
        out: list[GroupEvent] = []
        for uid in list(self._complete):
            if uid in held:
                continue
            g = self._groups[uid]
            batch = self._build(uid, g)
            self._finish(uid, g)
            out.append(GroupReady(batch))
        return out

    @property
    def pending_groups(self) -> int:
        return len(self._groups)

    def pending_group_ids(self) -> list[str]:
        return list(self._groups)

    def _ids(self, e: Record) -> list[str]:
        """The ids of the records (of the ``rows`` kind) the episode lists."""
        return (e.get('trajectory_ids') if self.rows == 'trajectories' else e.get('transition_ids')) or []

    def _exported(self, e: Record) -> bool:
        """Whether the episode's sidecar exported the ``rows`` records.

        An episode without ``exported`` (older sidecars' JSON), or with an empty one (their
        protobuf), comes from a sidecar that wrote transitions only; such an episode has no
        ``trajectory_ids`` in JSON, and an empty list in protobuf.
        """
        exported = e.get('exported')
        if self.rows == 'trajectories':
            return isinstance(e.get('trajectory_ids'), list) and (not isinstance(exported, list) or 'trajectories' in exported)
        return not isinstance(exported, list) or not exported or 'transitions' in exported

    def _check(self, uid: str | None) -> list[GroupEvent]:
        if uid is None:
            return []
        g = self._groups.get(uid)
        if g is None or len(g.episodes) < self.group_size:
            return []
        for e, _ in g.episodes.values():
            for rid in self._ids(e):
                if rid not in self._records:
                    return []
        self._complete[uid] = None
        return self._release()

    def _finish(self, uid: str, g: _PendingGroup) -> None:
        self._complete.pop(uid, None)
        for e, _ in g.episodes.values():
            for rid in self._ids(e):
                self._records.pop(rid, None)
        for rid in [rid for rid, x in self._records.items() if x.t.get('group_id') == uid]:
            del self._records[rid]
        del self._groups[uid]
        self.done.add(uid)

    def _build(self, uid: str, g: _PendingGroup) -> GroupBatch:
        episodes = sorted((e for e, _ in g.episodes.values()), key=lambda e: (_js_order(e['rollout_id']), _js_order(e['attempt_id'])))
        if self.rows == 'trajectories':
            return self._build_trajectories(uid, episodes)
        names = ('uid', 'rollout_id', 'attempt_id', 'transition_id', 'seq', 'prompt_ids', 'response_ids', 'response_mask',
                 'token_level_scores', 'rollout_log_probs', 'reward', 'is_last', 'policy_version')
        batch: dict[str, list[Any]] = {n: [] for n in names}
        skipped = 0
        for e in episodes:
            for tid in e.get('transition_ids') or []:
                t = self._records[tid].t
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

    def _build_trajectories(self, uid: str, episodes: list[Record]) -> GroupBatch:
        """One row per trajectory: the first call's prompt, then everything after it as the response.

        ``response_mask`` is the loss mask past the prompt (1 on sampled tokens only, 0 on tool
        outputs and the prompt text added between turns); ``token_level_scores`` holds each token
        reward at its position (AIR on a turn's last token, the final reward on the last sampled
        one) and 0 elsewhere.

        When a trajectory of the group has ``routed_experts`` (MoE routing replay), the batch also
        has ``routed_experts`` (each row's trajectory member as it is, rows over the whole
        ``token_ids``; None for a trajectory without) and ``routing_complete`` (its flag; False
        without); ``tensors.to_verl_batch`` aligns them with the ids. Without routing the batch is
        as before. Likewise ``sampling_mask`` (each row's recorded mask, rows over the whole
        ``token_ids``, or None) and ``sampling_mask_complete`` (False without), after them, only
        when a trajectory of the group has ``sampling_mask``.
        """
        names = ('uid', 'rollout_id', 'attempt_id', 'trajectory_id', 'segment', 'turns', 'prompt_ids', 'response_ids', 'response_mask',
                 'token_level_scores', 'rollout_log_probs', 'reward', 'is_last', 'policy_versions')
        batch: dict[str, list[Any]] = {n: [] for n in names}
        routing: list[tuple[Any, bool]] = []
        masks: list[tuple[Any, bool]] = []
        for e in episodes:
            for tid in e['trajectory_ids']:
                t = self._records[tid].t
                p = t['prompt_length']
                ids = t['token_ids']
                scores: list[Any] = [0] * len(ids[p:])
                for r in t.get('token_rewards') or []:
                    # Token rewards sit on sampled tokens, all past the prompt; a position outside
                    # the response (a malformed record) is skipped.
                    i = r['position'] - p
                    if 0 <= i < len(scores):
                        scores[i] = r['value']
                logprobs = t.get('logprobs')
                batch['uid'].append(uid)
                batch['rollout_id'].append(t.get('rollout_id'))
                batch['attempt_id'].append(t.get('attempt_id'))
                batch['trajectory_id'].append(tid)
                batch['segment'].append(t.get('segment'))
                batch['turns'].append(len(t.get('turns') or []))
                batch['prompt_ids'].append(ids[:p])
                batch['response_ids'].append(ids[p:])
                batch['response_mask'].append(t['loss_mask'][p:])
                batch['token_level_scores'].append(scores)
                batch['rollout_log_probs'].append(logprobs[p:] if logprobs is not None else None)
                batch['reward'].append(t.get('reward'))
                batch['is_last'].append(t['segment'] == t['segments'] - 1)
                batch['policy_versions'].append(t.get('policy_versions'))
                routing.append((t.get('routed_experts'), bool(t.get('routing_complete'))))
                masks.append((t.get('sampling_mask'), t.get('sampling_mask_complete') is True))
        if any(r is not None for r, _ in routing):
            batch['routed_experts'] = [r for r, _ in routing]
            batch['routing_complete'] = [r is not None and c for r, c in routing]
        if any(m is not None for m, _ in masks):
            batch['sampling_mask'] = [m for m, _ in masks]
            batch['sampling_mask_complete'] = [m is not None and c for m, c in masks]
        return {
            'schema': 'lightning.group.v1',
            'uid': uid,
            'group_size': self.group_size,
            'rows': 'trajectories',
            'episodes': [_episode_entry(e) for e in episodes],
            'batch': batch,
            'unmerged_calls': sum(len(e.get('unmerged_calls') or []) for e in episodes),
        }


def _episode_entry(e: Record) -> dict[str, Any]:
    # Keys a record lacks are left out, as JSON.stringify leaves out undefined members.
    out = {k: e[k] for k in ('rollout_id', 'attempt_id', 'final_reward', 'episode_status', 'transitions') if k in e}
    out['policy_version_lag'] = e.get('policy_version_lag')
    return out
