"""The images of trajectories: their bytes, in order and checked, and their placeholder runs.

A trajectory whose last call had images carries ``images`` (in conversation order, each with its
SHA-256, mime type, size, width and height, and ``start``/``length``: its placeholder run
``token_ids[start:start + length]``, the image pad token repeated), ``images_complete``,
``images_error`` and ``image_processor`` (``image_token_id``, and the Qwen-VL resize settings when
the sidecar was given them). The bytes are not in the record: the sidecar stores each image once,
by content, under ``{data_dir}/images/<sha256[:2]>/<sha256>.<ext>``, and its Kafka exporter sends
each one to the topic ``lightning.images`` (key: the SHA-256 in hex, value: the raw bytes) before
the trajectories that name it.

- ``FileImages(images_dir)`` reads the store, ``KafkaImages(brokers)`` the topic; both have
  ``get(sha256, mime) -> bytes`` (KeyError when the image cannot be had).
- ``trajectory_images(trajectory, store)`` gives a trajectory's images in order with their bytes,
  each checked against its SHA-256, for the trainer's image processor. A trajectory whose
  ``images_complete`` is false must not be trained on as if it were text: by default it raises
  ``ImagesIncomplete``.
- ``image_placeholder_runs(token_ids, image_token_id)`` finds the runs of the pad token, and
  ``check_image_spans(trajectory)`` checks that they are exactly the images' spans.

Pixel values, image grids and position ids (Qwen2-VL's 3-D rotary positions) are the trainer's to
compute, with its own processor, from the bytes in order.
"""
from __future__ import annotations

import hashlib
import logging
import re
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

from .chunks import ChunkAssembler, ChunkError, is_chunk
from .position import Position

DEFAULT_IMAGES_TOPIC = 'lightning.images'

#: The file extension the sidecar's store gives each mime type (anything else is ``bin``).
EXT = {'image/png': 'png', 'image/jpeg': 'jpg', 'image/jpg': 'jpg', 'image/gif': 'gif', 'image/webp': 'webp'}

_SHA256 = re.compile(r'^[0-9a-f]{64}$')

log = logging.getLogger('lightning_sidecar_client.images')


class ImageStore(Protocol):
    """Where image bytes come from: ``FileImages``, ``KafkaImages``, or anything with this ``get``."""

    def get(self, sha256: str, mime: Optional[str] = None) -> bytes: ...


class ImagesIncomplete(ValueError):
    """A trajectory whose images cannot be used as they are.

    ``images_error`` says why: the sidecar's own ``images_error`` when it exported the trajectory
    with ``images_complete`` false (``placeholders_do_not_pair: ...``, ``url_not_stored: ...``,
    ``store_failed: ...``), or what went wrong here, in the same ``code: detail`` form:
    ``image_missing`` (the store does not have the bytes), ``image_hash_mismatch`` (the bytes are
    not the ones the trajectory names), ``image_url`` (an image the agent only named by URL),
    ``spans_do_not_match`` (the placeholder runs in ``token_ids`` are not the images' spans).
    """

    def __init__(self, message: str, *, images_error: Optional[str], trajectory_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.images_error = images_error
        self.trajectory_id = trajectory_id


def image_path(images_dir: Union[str, 'Path'], sha256: str, mime: Optional[str]) -> Path:
    """Where the sidecar's store keeps an image: ``<images_dir>/<sha256[:2]>/<sha256>.<ext>``."""
    return Path(images_dir) / sha256[:2] / f'{sha256}.{EXT.get(mime or "", "bin")}'


class FileImages:
    """The sidecar's image store, ``{data_dir}/images`` (on a shared disk, or copied to the trainer).

    ``get`` reads the file the image's mime type names; when there is none it tries the image's
    hash with the store's other extensions (the same bytes sent once as ``image/png`` and once as
    ``application/octet-stream`` are stored twice, under both names). Nothing is cached.
    """

    def __init__(self, images_dir: Union[str, 'Path']) -> None:
        self.dir = Path(images_dir)

    def get(self, sha256: str, mime: Optional[str] = None) -> bytes:
        """The image's bytes; KeyError when the store does not have them (or ``sha256`` is not a
        lower-case hex SHA-256, which no stored file is named by)."""
        for path in self._paths(sha256, mime):
            try:
                return path.read_bytes()
            except FileNotFoundError:
                continue
        raise KeyError(sha256)

    def __contains__(self, sha256: object) -> bool:
        return any(p.is_file() for p in self._paths(sha256, None))

    def _paths(self, sha256: object, mime: Optional[str]) -> list[Path]:
        """The files the image may be in, the one its mime type names first."""
        if not isinstance(sha256, str) or not _SHA256.match(sha256):
            return []
        first = image_path(self.dir, sha256, mime)
        return list(dict.fromkeys([first, *(image_path(self.dir, sha256, m) for m in (*EXT, None))]))


def _default_consumer(settings: dict[str, Any]) -> Any:
    from .kafka_source import confluent_kafka

    return confluent_kafka().Consumer(settings)


class KafkaImages:
    """The images topic (``lightning.images``), read from its beginning into memory.

    Its own consumer, in a consumer group of its own (a fresh ``lightning-images-<uuid>`` unless
    ``group.id`` is given) that never commits: every instance reads the whole topic from the start,
    as a compacted topic is meant to be read. Each record is an image keyed by its SHA-256 (hex);
    records the exporter split into chunks are put back together first. A record whose bytes do
    not hash to its key is not kept (logged, and named when that image is asked for); an empty
    record (a compaction tombstone) forgets its key.

    Memory is bounded: the images are held in an LRU of at most ``max_bytes`` bytes (default
    512 MiB), least recently used out first; an image larger than that on its own is never held,
    only handed to a ``get`` waiting for it. Chunks of records not yet whole are bounded apart
    (``chunk_max_bytes``, ``chunk_timeout_ms``). An image asked for after it was pushed out is read
    again: the consumer starts over from the beginning of the topic (``rewind``), so a cache too
    small for the trainer's working set costs a rereading of the topic each time; size it to hold
    the images of a few batches.

    ``get(sha256)`` polls the topic until the image has arrived or ``timeout_s`` (default 30 s)
    has passed, then raises KeyError. ``poll(timeout_s)`` reads what has arrived, to fill the cache
    ahead of time. ``settings`` and any keyword arguments not named here are librdkafka properties
    (``security.protocol``, ``sasl.*``: pass dotted names as ``**{'sasl.username': ...}``).
    ``consumer_factory`` builds the consumer from them (tests inject one); ``clock`` is in seconds.
    """

    def __init__(
        self,
        brokers: Union[Sequence[str], str],
        topic: str = DEFAULT_IMAGES_TOPIC,
        *,
        max_bytes: int = 512 * 1024 * 1024,
        timeout_s: float = 30.0,
        settings: Optional[Mapping[str, Any]] = None,
        chunk_timeout_ms: float = 600_000,
        chunk_max_bytes: int = 256 * 1024 * 1024,
        consumer_factory: Callable[[dict[str, Any]], Any] = _default_consumer,
        clock: Callable[[], float] = time.monotonic,
        **confluent_settings: Any,
    ) -> None:
        servers = brokers if isinstance(brokers, str) else ','.join(brokers)
        if not servers:
            raise ValueError('kafka: no brokers for the images topic')
        self.topic = topic
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._clock = clock
        self._factory = consumer_factory
        self._chunk_timeout_ms = chunk_timeout_ms
        self._chunk_max_bytes = chunk_max_bytes
        self._settings = {
            'bootstrap.servers': servers,
            'group.id': f'lightning-images-{uuid.uuid4()}',
            'enable.auto.commit': False,
            'enable.auto.offset.store': False,
            'auto.offset.reset': 'earliest',
            'fetch.wait.max.ms': 250,
            'logger': log,
            **(settings or {}),
            **confluent_settings,
        }
        self._images: OrderedDict[str, bytes] = OrderedDict()
        self._held = 0
        # Hashes pushed out of the cache, and records refused, remembered (boundedly) to tell why an
        # image is not here: the first are read again by a rewind, the second are named in the KeyError.
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._rejected: OrderedDict[str, str] = OrderedDict()
        self._consumer: Any = None
        self._taken = 0
        self._chunks = ChunkAssembler(timeout_ms=chunk_timeout_ms, max_bytes=chunk_max_bytes)
        self._closed = False
        self._open()

    def _open(self) -> None:
        self._consumer = self._factory(dict(self._settings))
        self._consumer.subscribe([self.topic])
        self._chunks = ChunkAssembler(timeout_ms=self._chunk_timeout_ms, max_bytes=self._chunk_max_bytes)

    @property
    def held_bytes(self) -> int:
        """The bytes of the images held now (at most ``max_bytes``)."""
        return self._held

    def __len__(self) -> int:
        return len(self._images)

    def __contains__(self, sha256: object) -> bool:
        return sha256 in self._images

    def get(self, sha256: str, mime: Optional[str] = None, timeout_s: Optional[float] = None) -> bytes:
        """The image's bytes, waiting up to ``timeout_s`` (default: the instance's) for it to arrive;
        KeyError when it has not. ``mime`` is not needed (the topic is keyed by hash alone)."""
        data = self._images.get(sha256)
        if data is not None:
            self._images.move_to_end(sha256)
            return data
        if self._closed:
            raise KeyError(sha256)
        if sha256 in self._evicted:
            self.rewind()
        deadline = self._clock() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            found = self._read(min(0.25, max(0.0, deadline - self._clock())), want=sha256)
            if found is not None:
                return found
            if self._clock() >= deadline:
                why = self._rejected.get(sha256)
                raise KeyError(f'{sha256}: {why}' if why else sha256)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Reads what has arrived within ``timeout_s``; returns how many images were taken in."""
        before = self._taken
        self._read(timeout_s, want=None)
        return self._taken - before

    def rewind(self) -> None:
        """Reads the topic again from its beginning (a new consumer); the images held stay."""
        self._consumer.close()
        self._evicted.clear()
        self._settings['group.id'] = f'lightning-images-{uuid.uuid4()}'
        self._open()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close()

    def __enter__(self) -> 'KafkaImages':
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read(self, timeout_s: float, want: Optional[str]) -> Optional[bytes]:
        """Polls messages until none comes within ``timeout_s`` (then at once), taking images in;
        returns ``want``'s bytes as soon as they come (even when too large to be held)."""
        wait = timeout_s
        found = None
        for _ in range(10_000):
            msg = self._consumer.poll(wait)
            wait = 0
            now_ms = self._clock() * 1000
            for d in self._chunks.tick(now_ms):
                log.warning('images: dropped image %s at %s/%s: %s of %s chunks (%s)', d.record_id, d.topic, d.partition, d.have, d.count, d.reason)
            if msg is None:
                break
            err = msg.error()
            if err is not None:
                if not _is_partition_eof(err):
                    log.warning('images: kafka: %s', err)
                continue
            key, value, headers = msg.key(), msg.value(), msg.headers()
            if is_chunk(headers):
                try:
                    whole, dropped = self._chunks.add(headers, value, Position(msg.topic(), msg.partition(), msg.offset()), now_ms)
                except ChunkError as e:
                    log.warning('images: skipping chunk of %s at %s/%s@%s: %s', e.record_id or '?', msg.topic(), msg.partition(), msg.offset(), e.reason)
                    continue
                for d in dropped:
                    log.warning('images: dropped image %s: %s of %s chunks (chunk buffer full)', d.record_id, d.have, d.count)
                if whole is None:
                    continue
                value, headers = whole.value, whole.headers
            sha = _text(key) or _header(headers, 'image-sha256')
            if sha is None:
                continue
            data = self._take(sha, value)
            if sha == want and data is not None:
                found = data
                break
        return found

    def _take(self, sha: str, value: Optional[bytes]) -> Optional[bytes]:
        if not value:
            self._drop(sha)
            return None
        data = bytes(value)
        if hashlib.sha256(data).hexdigest() != sha:
            log.warning('images: the record keyed %s holds bytes of another SHA-256; not kept', sha)
            self._remember(self._rejected, sha, 'its record holds bytes of another SHA-256')
            return None
        self._rejected.pop(sha, None)
        self._evicted.pop(sha, None)
        self._taken += 1
        self._drop(sha)
        if len(data) <= self.max_bytes:
            self._images[sha] = data
            self._held += len(data)
            while self._held > self.max_bytes:
                old, b = self._images.popitem(last=False)
                self._held -= len(b)
                self._remember(self._evicted, old, None)
        else:
            self._remember(self._evicted, sha, None)
        return data

    def _drop(self, sha: str) -> None:
        old = self._images.pop(sha, None)
        if old is not None:
            self._held -= len(old)

    @staticmethod
    def _remember(d: 'OrderedDict[str, Any]', key: str, value: Any) -> None:
        d[key] = value
        d.move_to_end(key)
        while len(d) > 100_000:
            d.popitem(last=False)


def _text(b: Optional[bytes]) -> Optional[str]:
    if b is None:
        return None
    return b.decode('ascii', 'replace') if isinstance(b, (bytes, bytearray)) else str(b)


def _header(headers: Any, name: str) -> Optional[str]:
    from .records import header

    return header(headers, name)


def _is_partition_eof(err: Any) -> bool:
    try:
        from confluent_kafka import KafkaError
    except ImportError:
        return False
    return err.code() == KafkaError._PARTITION_EOF


def image_placeholder_runs(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """The runs of ``image_token_id`` in ``token_ids``, in order, as ``(start, length)``: where the
    model server expanded each image's placeholder (the k-th run is the k-th image)."""
    runs: list[tuple[int, int]] = []
    n = len(token_ids)
    i = 0
    while i < n:
        if token_ids[i] != image_token_id:
            i += 1
            continue
        start = i
        while i < n and token_ids[i] == image_token_id:
            i += 1
        runs.append((start, i - start))
    return runs


def check_image_spans(trajectory: Mapping[str, Any]) -> list[tuple[int, int]]:
    """Checks a trajectory's image spans against its ids and returns them, ``(start, length)`` per
    image in order: every position of each span holds the image token id, and the runs of that id
    in ``token_ids`` are exactly the spans (no run without an image, no image without its run).
    Raises ``ImagesIncomplete`` (``spans_do_not_match``) otherwise. A trajectory without images has
    no spans, and must have no runs."""
    images = sorted(trajectory.get('images') or [], key=lambda i: i['order'])
    token_ids = trajectory['token_ids']
    tid = trajectory.get('trajectory_id')
    processor = trajectory.get('image_processor')
    if processor is None:
        if images:
            raise ImagesIncomplete(f'trajectory {tid}: images without image_processor', images_error='spans_do_not_match: no image_processor', trajectory_id=tid)
        return []
    pad = processor['image_token_id']

    def fail(detail: str) -> ImagesIncomplete:
        return ImagesIncomplete(f'trajectory {tid}: {detail}', images_error=f'spans_do_not_match: {detail}', trajectory_id=tid)

    spans: list[tuple[int, int]] = []
    for image in images:
        start, length = image.get('start'), image.get('length')
        if start is None or length is None:
            raise fail(f"image {image.get('order')} has no placeholder span")
        if start < 0 or length <= 0 or start + length > len(token_ids):
            raise fail(f"image {image.get('order')}: span [{start}, {start + length}) is outside the {len(token_ids)} ids")
        bad = next((p for p in range(start, start + length) if token_ids[p] != pad), None)
        if bad is not None:
            raise fail(f"image {image.get('order')}: position {bad} holds {token_ids[bad]}, not the image token {pad}")
        spans.append((start, length))
    runs = image_placeholder_runs(token_ids, pad)
    if runs != spans:
        raise fail(f'{len(runs)} run(s) of the image token {pad} at {runs[:8]} for {len(spans)} image span(s) at {spans[:8]}')
    return spans


def trajectory_images(trajectory: Mapping[str, Any], store: ImageStore, *, strict: bool = True) -> list[dict[str, Any]]:
    """A trajectory's images in order (by ``order``), each ``{'order', 'sha256', 'mime', 'width',
    'height', 'start', 'length', 'url', 'data'}``, ``data`` the bytes from ``store`` whose SHA-256
    was checked against ``sha256``. Empty for a trajectory without images.

    ``strict`` (the default) raises ``ImagesIncomplete`` when the trajectory's ``images_complete``
    is not true (carrying its ``images_error``), when an image's bytes cannot be had (a URL image,
    one the store does not have, bytes of another hash), or when the spans are not the placeholder
    runs of ``token_ids`` (``check_image_spans``). With ``strict=False`` it gives what it can:
    ``data`` None where the bytes cannot be had; the caller then decides (a trajectory with
    ``images_complete`` false must not be trained on as if it were text).
    """
    images = trajectory.get('images')
    if images is None:
        return []
    tid = trajectory.get('trajectory_id')
    if strict and trajectory.get('images_complete') is not True:
        error = trajectory.get('images_error')
        raise ImagesIncomplete(f'trajectory {tid}: images_complete is false: {error}', images_error=error, trajectory_id=tid)
    if strict:
        check_image_spans(trajectory)
    out = []
    for image in sorted(images, key=lambda i: i['order']):
        sha, order = image.get('sha256'), image['order']
        data: Optional[bytes] = None
        problem = None
        if sha is None:
            problem = f"image_url: image {order} is named by URL ({image.get('url')}); no bytes were stored"
        else:
            try:
                data = store.get(sha, image.get('mime'))
            except (KeyError, OSError) as e:
                problem = f'image_missing: image {order} ({sha}) cannot be had: {_why(e, sha)}'
            if data is not None and hashlib.sha256(data).hexdigest() != sha:
                data = None
                problem = f'image_hash_mismatch: image {order}: the bytes got for {sha} have another SHA-256'
        if problem is not None and strict:
            raise ImagesIncomplete(f'trajectory {tid}: {problem}', images_error=problem, trajectory_id=tid)
        out.append({
            'order': order, 'sha256': sha, 'mime': image.get('mime'), 'width': image.get('width'), 'height': image.get('height'),
            'start': image.get('start'), 'length': image.get('length'), 'url': image.get('url'), 'data': data,
        })
    return out


def _why(e: BaseException, sha: str) -> str:
    """Why the store had no bytes: a KeyError's reason when it gives one (``'<sha>: why'``)."""
    if isinstance(e, KeyError):
        arg = e.args[0] if e.args else None
        return arg[len(sha) + 2:] if isinstance(arg, str) and arg.startswith(f'{sha}: ') else 'not in the store'
    return str(e)
