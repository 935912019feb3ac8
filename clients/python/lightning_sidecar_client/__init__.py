"""Trainer-side client for lightning-sidecar: trajectories, transitions and complete GRPO groups.

Reads the ``lightning.trajectories`` (or ``lightning.transitions``) and ``lightning.episodes``
Kafka topics (JSON or protobuf, chunked records, prompt deltas) or the file exporter's NDJSON
directory, and yields

- ``iter_groups``: complete groups as ``lightning.group.v1`` dicts (the Node ``groups`` command's
  lines), each once, with duplicates ignored and incomplete groups given up on after a timeout;
  one row per trajectory by default, one per call with ``rows='transitions'``;
- ``iter_trajectories``: every trajectory once;
- ``iter_transitions``: every transition once, with its full prompt ids.

``to_verl_batch`` turns a group into padded id, mask, score and log-prob tensors (and routed
experts, aligned with the ids, when the trajectories have them). ``routed_experts_array`` and
``routing_missing_mask`` give one trajectory's routed experts (MoE routing replay) as numpy arrays;
``weight_version_per_token`` the weight version that sampled each of its ids; ``sampling_mask_rows``,
``sampling_mask_row``, ``sampling_mask_missing`` and ``sampling_mask_dense`` the ids its sampler
kept at each position (its sampling masks, which ``to_verl_batch`` also carries when present).
``trajectory_images`` gives a trajectory's images in order with their bytes, checked against their
SHA-256, from the sidecar's image store (``FileImages``) or the images topic (``KafkaImages``);
``image_placeholder_runs`` and ``check_image_spans`` find and check their placeholder runs.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from .files import FileSource
from .groups import GroupAssembler, GroupBatch
from .images import DEFAULT_IMAGES_TOPIC, FileImages, ImagesIncomplete, KafkaImages, check_image_spans, image_placeholder_runs, trajectory_images
from .kafka_source import DEFAULT_EPISODES_TOPIC, DEFAULT_TOPIC, DEFAULT_TRAJECTORIES_TOPIC, KafkaSource, brokers_from_env
from .position import Position
from .readers import Event, GroupReader, RecordReader
from .records import decode_episode, decode_trajectory, decode_transition, weight_version_per_token
from .routing import routed_experts_array, routing_missing_mask
from .sampling_mask import sampling_mask_dense, sampling_mask_missing, sampling_mask_row, sampling_mask_rows
from .source import Incoming, Source, SourceEvent
from .tensors import to_verl_batch

__all__ = [
    'DEFAULT_EPISODES_TOPIC', 'DEFAULT_IMAGES_TOPIC', 'DEFAULT_TOPIC', 'DEFAULT_TRAJECTORIES_TOPIC', 'Event', 'FileImages', 'FileSource',
    'GroupAssembler', 'GroupBatch', 'GroupReader', 'ImagesIncomplete', 'Incoming', 'KafkaImages', 'KafkaSource', 'Position', 'RecordReader',
    'Source', 'SourceEvent', 'check_image_spans', 'decode_episode', 'decode_trajectory', 'decode_transition', 'image_placeholder_runs',
    'iter_groups', 'iter_trajectories', 'iter_transitions', 'open_source', 'routed_experts_array', 'routing_missing_mask',
    'sampling_mask_dense', 'sampling_mask_missing', 'sampling_mask_row', 'sampling_mask_rows', 'to_verl_batch', 'trajectory_images',
    'weight_version_per_token',
]

__version__ = '0.1.0'

PathLike = Union[str, 'os.PathLike[str]']


def open_source(
    *,
    brokers: Union[Sequence[str], str, None] = None,
    consumer_group: str = 'lightning-groups',
    topic: Optional[str] = None,
    episodes_topic: Optional[str] = None,
    trajectories_topic: Optional[str] = None,
    records: str = 'trajectories',
    data_dir: Optional[PathLike] = None,
    follow: bool = False,
    settings: Optional[dict[str, Any]] = None,
    chunk_timeout_ms: float = 600_000,
    until_end: bool = False,
) -> Source:
    """Kafka (``brokers``, default ``$LIGHTNING_KAFKA_BROKERS``) or a file exporter's ``data_dir``.

    ``records`` picks what is read besides episodes: ``'trajectories'`` (``trajectories_topic``,
    default ``$LIGHTNING_KAFKA_TRAJECTORIES_TOPIC``, then ``lightning.trajectories``; or
    ``{data_dir}/trajectories/``), ``'transitions'`` (``topic``; ``{data_dir}/transitions/``) or
    ``'both'``. ``until_end`` (Kafka): stop once every assigned partition is read to its end, as a
    ``data_dir`` without ``follow`` stops at the end of its files.
    """
    if data_dir is not None:
        if until_end and follow:
            raise ValueError('until_end and follow contradict each other: a data_dir without follow is read to its end')
        return FileSource(data_dir, follow=follow, records=records)
    env = os.environ
    return KafkaSource(
        brokers if brokers else brokers_from_env(),
        consumer_group,
        topic=topic or env.get('LIGHTNING_KAFKA_TOPIC') or DEFAULT_TOPIC,
        episodes_topic=episodes_topic or env.get('LIGHTNING_KAFKA_EPISODES_TOPIC') or DEFAULT_EPISODES_TOPIC,
        trajectories_topic=trajectories_topic or env.get('LIGHTNING_KAFKA_TRAJECTORIES_TOPIC') or DEFAULT_TRAJECTORIES_TOPIC,
        records=records,
        settings=settings,
        chunk_timeout_ms=chunk_timeout_ms,
        until_end=until_end,
    )


def iter_groups(
    group_size: int,
    *,
    rows: str = 'trajectories',
    state_path: Optional[PathLike] = None,
    timeout_ms: float = 600_000,
    idle_exit_ms: Optional[float] = None,
    on_event: Optional[Callable[[Event], None]] = None,
    **source: Any,
) -> Iterator[GroupBatch]:
    """Complete groups of ``group_size`` episodes, each once (across restarts with ``state_path``).

    ``rows``: ``'trajectories'`` (one row per trajectory) or ``'transitions'`` (one per call).
    ``source`` arguments go to ``open_source`` (which reads the records ``rows`` needs unless
    ``records`` says otherwise). A group counts as done when it is handed out. Readers sharing a
    ``consumer_group`` split the partitions and each group goes to one of them
    (docs/trainer-python.md, several consumers in one consumer group).
    """
    src = open_source(**{'chunk_timeout_ms': timeout_ms, 'records': rows, **source})
    try:
        yield from GroupReader(src, group_size, rows=rows, timeout_ms=timeout_ms, state_path=state_path, idle_exit_ms=idle_exit_ms, on_event=on_event)
    finally:
        src.close()


def iter_transitions(
    *,
    timeout_ms: float = 600_000,
    idle_exit_ms: Optional[float] = None,
    on_event: Optional[Callable[[Event], None]] = None,
    **source: Any,
) -> Iterator[dict[str, Any]]:
    """Every transition once, with full ``prompt_token_ids``, in arrival order.

    Offsets move past a transition when the next one is asked for (at least once across restarts).
    """
    src = open_source(**{'chunk_timeout_ms': timeout_ms, **source, 'records': 'transitions'})
    try:
        yield from RecordReader(src, timeout_ms=timeout_ms, idle_exit_ms=idle_exit_ms, on_event=on_event).transitions()
    finally:
        src.close()


def iter_trajectories(
    *,
    timeout_ms: float = 600_000,
    idle_exit_ms: Optional[float] = None,
    on_event: Optional[Callable[[Event], None]] = None,
    **source: Any,
) -> Iterator[dict[str, Any]]:
    """Every trajectory once (``lightning.trajectory.v1`` dicts), in arrival order.

    Offsets move past a trajectory when the next one is asked for (at least once across restarts).
    """
    src = open_source(**{'chunk_timeout_ms': timeout_ms, **source, 'records': 'trajectories'})
    try:
        yield from RecordReader(src, timeout_ms=timeout_ms, idle_exit_ms=idle_exit_ms, on_event=on_event).trajectories()
    finally:
        src.close()
