"""Images: a trajectory's four image keys decode to the same dict from JSON and protobuf (here and
in Node), its images' bytes come back in order and checked from the sidecar's file store or the
images topic, and its placeholder runs are checked against its spans."""
import base64
import hashlib
import json
import struct
import subprocess
import zlib

import pytest

import lightning_sidecar_client
from lightning_sidecar_client import (FileImages, ImagesIncomplete, KafkaImages, check_image_spans, image_placeholder_runs, js_json,
                                      trajectory_images)
from lightning_sidecar_client.images import image_path
from lightning_sidecar_client.records import JSON, PROTOBUF, decode_trajectory
from factories import (NODE_DECODE_TRAJECTORIES, built_node_encoding, chunk, encode_trajectory_pb, node, node_encode_trajectory, trajectory,
                       transition)

VISION_START, VISION_END, PAD = 151652, 151653, 151655


def png(width, height, seed=0):
    """A real PNG of ``width`` × ``height`` grey pixels (``seed`` changes the bytes)."""
    def part(kind, data):
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xFFFFFFFF)
    rows = b''.join(b'\x00' + bytes([seed % 256]) * width for _ in range(height))
    return (b'\x89PNG\r\n\x1a\n' + part(b'IHDR', struct.pack('>IIBBBBB', width, height, 8, 0, 0, 0, 0)) + part(b'IDAT', zlib.compress(rows))
            + part(b'IEND', b''))


def sha(b):
    return hashlib.sha256(b).hexdigest()


SCREENS = [png(56, 28, 1), png(28, 84, 2)]


def image(order, data, start, length, **extra):
    """One entry of ``images`` as the sidecar writes it."""
    out = {'order': order, 'sha256': sha(data), 'mime': 'image/png', 'bytes': len(data), 'width': None, 'height': None, 'url': None,
           'start': start, 'length': length}
    width, height = struct.unpack('>II', data[16:24])
    out.update(width=width, height=height)
    out.update(extra)
    return out


def with_images(t, images, *, complete=True, error=None, processor=None):
    """``t`` with the four image keys where the sidecar puts them: right before ``turns``."""
    out = {}
    for k, v in t.items():
        if k == 'turns':
            out.update(images=images, images_complete=complete, images_error=error,
                       image_processor=processor if processor is not None else {'image_token_id': PAD, 'factor': 28, 'min_pixels': 3136, 'max_pixels': 12845056})
        out[k] = v
    return out


def screenshot_trajectory(screens=SCREENS, **kw):
    """Two calls, a screenshot in each prompt: its placeholder run between the vision markers.

    token_ids  1 VS PAD×2 VE 2 | 10 11 | 4 VS PAD×3 VE | 12      (prompt_length 6)
    """
    first = [1, VISION_START, PAD, PAD, VISION_END, 2]
    second = first + [10, 11, 4, VISION_START, PAD, PAD, PAD, VISION_END]
    ts = [transition('r', 0, group_id='g', prompt=first, response=[10, 11]), transition('r', 1, group_id='g', prompt=second, response=[12])]
    t = trajectory(ts, final_reward=1)
    return with_images(t, [image(0, screens[0], 2, 2), image(1, screens[1], 10, 3)], **kw)


def store(tmp_path, screens=SCREENS):
    """The sidecar's store layout holding ``screens``."""
    root = tmp_path / 'images'
    for data in screens:
        path = image_path(root, sha(data), 'image/png')
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


# --- the file store ---

def test_file_images_reads_the_stores_layout_back_and_misses_with_key_error(tmp_path):
    root = store(tmp_path)
    h = sha(SCREENS[0])
    assert (root / h[:2] / f'{h}.png').read_bytes() == SCREENS[0]
    images = FileImages(root)
    assert images.get(h, 'image/png') == SCREENS[0]
    # Found whatever mime type the caller names (the same bytes under another name are the same image).
    assert images.get(h, None) == SCREENS[0]
    assert images.get(h, 'image/jpeg') == SCREENS[0]
    assert h in images and sha(b'other') not in images
    with pytest.raises(KeyError):
        images.get(sha(b'other'), 'image/png')
    # Not a hash: no file is named by it, and no path is built from it.
    for bad in ('../../etc/passwd', h.upper(), h[:10], None):
        with pytest.raises(KeyError):
            images.get(bad, 'image/png')


def test_image_path_follows_the_sidecars_extensions():
    h = 'ab' * 32
    assert str(image_path('/d', h, 'image/png')) == f'/d/ab/{h}.png'
    assert str(image_path('/d', h, 'image/jpeg')) == f'/d/ab/{h}.jpg'
    assert str(image_path('/d', h, 'image/jpg')) == f'/d/ab/{h}.jpg'
    assert str(image_path('/d', h, 'image/gif')) == f'/d/ab/{h}.gif'
    assert str(image_path('/d', h, 'image/webp')) == f'/d/ab/{h}.webp'
    assert str(image_path('/d', h, 'image/bmp')) == f'/d/ab/{h}.bin'
    assert str(image_path('/d', h, None)) == f'/d/ab/{h}.bin'


# --- trajectory_images ---

def test_trajectory_images_gives_the_images_in_order_with_their_checked_bytes(tmp_path):
    t = screenshot_trajectory()
    got = trajectory_images(t, FileImages(store(tmp_path)))
    assert [i['data'] for i in got] == SCREENS
    assert got[0] == {'order': 0, 'sha256': sha(SCREENS[0]), 'mime': 'image/png', 'width': 56, 'height': 28, 'start': 2, 'length': 2, 'url': None,
                      'data': SCREENS[0]}
    assert [(i['order'], i['start'], i['length'], i['width'], i['height']) for i in got] == [(0, 2, 2, 56, 28), (1, 10, 3, 28, 84)]
    # By `order`, whatever order the list is in.
    t['images'] = t['images'][::-1]
    assert [i['data'] for i in trajectory_images(t, FileImages(store(tmp_path)))] == SCREENS


def test_a_trajectory_without_images_has_none():
    t = trajectory([transition('r', 0)], final_reward=1)
    assert trajectory_images(t, FileImages('/nonexistent')) == []
    assert check_image_spans(t) == []


def test_strict_refuses_a_trajectory_whose_images_are_not_complete_and_says_why(tmp_path):
    why = 'placeholder_length: image 1 (28x84) has 4 placeholders, the processor gives 3'
    t = screenshot_trajectory(complete=False, error=why)
    with pytest.raises(ImagesIncomplete) as e:
        trajectory_images(t, FileImages(store(tmp_path)))
    assert isinstance(e.value, ValueError)
    assert e.value.images_error == why
    assert e.value.trajectory_id == t['trajectory_id']
    assert why in str(e.value)
    # Not strict: what can be had, for a caller that decides itself.
    assert [i['data'] for i in trajectory_images(t, FileImages(store(tmp_path)), strict=False)] == SCREENS


def test_strict_refuses_an_image_missing_from_the_store(tmp_path):
    t = screenshot_trajectory()
    root = store(tmp_path, SCREENS[:1])
    with pytest.raises(ImagesIncomplete) as e:
        trajectory_images(t, FileImages(root))
    assert e.value.images_error.startswith(f'image_missing: image 1 ({sha(SCREENS[1])}) cannot be had: not in the store')
    got = trajectory_images(t, FileImages(root), strict=False)
    assert [i['data'] for i in got] == [SCREENS[0], None]


def test_strict_refuses_bytes_of_another_hash(tmp_path):
    t = screenshot_trajectory()
    root = store(tmp_path)
    image_path(root, sha(SCREENS[0]), 'image/png').write_bytes(SCREENS[0] + b'x')
    with pytest.raises(ImagesIncomplete) as e:
        trajectory_images(t, FileImages(root))
    assert e.value.images_error.startswith('image_hash_mismatch: image 0')
    assert [i['data'] for i in trajectory_images(t, FileImages(root), strict=False)] == [None, SCREENS[1]]


def test_an_image_named_by_url_has_no_bytes(tmp_path):
    t = screenshot_trajectory(complete=False, error='url_not_stored: image 1 is named by URL; the sidecar keeps no bytes of it')
    t['images'][1].update(sha256=None, mime=None, bytes=None, width=None, height=None, url='https://example.test/s.png')
    got = trajectory_images(t, FileImages(store(tmp_path)), strict=False)
    assert [i['data'] for i in got] == [SCREENS[0], None] and got[1]['url'] == 'https://example.test/s.png'
    t['images_complete'], t['images_error'] = True, None  # as if the sidecar had called it complete
    with pytest.raises(ImagesIncomplete, match='image_url: image 1'):
        trajectory_images(t, FileImages(store(tmp_path)))


def test_strict_checks_the_spans_against_the_ids(tmp_path):
    t = screenshot_trajectory()
    t['images'][1]['start'] = 13
    t['images'][1]['length'] = 2
    with pytest.raises(ImagesIncomplete) as e:
        trajectory_images(t, FileImages(store(tmp_path)))
    assert e.value.images_error.startswith('spans_do_not_match: ')


# --- placeholder runs ---

def test_image_placeholder_runs_finds_every_run_in_order():
    P = PAD
    assert image_placeholder_runs([], P) == []
    assert image_placeholder_runs([1, 2, 3], P) == []
    assert image_placeholder_runs([P], P) == [(0, 1)]
    assert image_placeholder_runs([P, P, 1, P, 2, P, P, P], P) == [(0, 2), (3, 1), (5, 3)]
    assert image_placeholder_runs([1, VISION_START, P, P, VISION_END, VISION_START, P, VISION_END], P) == [(2, 2), (6, 1)]
    assert image_placeholder_runs(screenshot_trajectory()['token_ids'], P) == [(2, 2), (10, 3)]


def test_check_image_spans_accepts_exactly_the_runs():
    t = screenshot_trajectory()
    assert check_image_spans(t) == [(2, 2), (10, 3)]


@pytest.mark.parametrize('spoil, message', [
    (lambda t: t['images'][0].update(start=1), 'position 1 holds 151652, not the image token 151655'),
    (lambda t: t['images'][0].update(length=1), r'2 run\(s\) of the image token 151655 at \[\(2, 2\), \(10, 3\)\] for 2 image span\(s\) at \[\(2, 1\), \(10, 3\)\]'),
    (lambda t: t['images'].pop(), r'2 run\(s\) .* for 1 image span\(s\)'),
    (lambda t: t['token_ids'].__setitem__(8, PAD), r'3 run\(s\)'),
    (lambda t: t['images'][1].update(start=None, length=None), 'image 1 has no placeholder span'),
    (lambda t: t['images'][1].update(start=14, length=9), r'image 1: span \[14, 23\) is outside the 15 ids'),
])
def test_check_image_spans_refuses_spans_that_are_not_the_runs(spoil, message):
    t = screenshot_trajectory()
    spoil(t)
    with pytest.raises(ImagesIncomplete, match=message) as e:
        check_image_spans(t)
    assert e.value.images_error.startswith('spans_do_not_match: ')


def test_the_helpers_are_exported_from_the_package():
    for name in ('FileImages', 'KafkaImages', 'ImagesIncomplete', 'trajectory_images', 'image_placeholder_runs', 'check_image_spans'):
        assert name in lightning_sidecar_client.__all__
    assert lightning_sidecar_client.trajectory_images is trajectory_images


# --- the protobuf encoding ---

def same(got, want):
    """Equal, keys in the same order at every level (the same line as JavaScript prints it)."""
    assert got == want
    assert js_json.dumps(got) == js_json.dumps(want)


def image_trajectories():
    """Complete; incomplete with a URL image and no spans; the processor without resize settings; none."""
    complete = screenshot_trajectory()
    url = screenshot_trajectory(complete=False, error='placeholders_do_not_pair: 1 placeholder run(s) for 2 image(s)')
    url['images'][0].update(start=None, length=None)
    url['images'][1].update(sha256=None, mime=None, bytes=None, width=None, height=None, start=None, length=None, url='https://example.test/a.png')
    bare = screenshot_trajectory(processor={'image_token_id': PAD})
    return [complete, url, bare, trajectory([transition('r', 0)], final_reward=1)]


@pytest.mark.parametrize('which', range(4))
def test_protobuf_written_here_decodes_to_the_json_dict(which):
    tr = image_trajectories()[which]
    same(decode_trajectory(encode_trajectory_pb(tr), PROTOBUF), tr)
    same(decode_trajectory(json.dumps(tr).encode(), JSON), tr)


def _node_encoding():
    return built_node_encoding('has_images', 'images')


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node encoder')
@pytest.mark.parametrize('which', range(4))
def test_trajectories_the_node_exporter_encodes_decode_here_to_the_same_dict_in_json_and_protobuf(which):
    tr = image_trajectories()[which]
    as_json, as_pb = node_encode_trajectory(tr, _node_encoding())
    # The JSON line is JavaScript's text of the dict, byte for byte (no image keys without images).
    assert as_json.decode() == js_json.dumps(tr)
    same(decode_trajectory(as_json, JSON), tr)
    same(decode_trajectory(as_pb, PROTOBUF), tr)
    # The two encodings carry the same images, so the same bytes come out of the store.
    assert ('images' in decode_trajectory(as_pb, PROTOBUF)) == ('images' in tr)


@pytest.mark.skipif(node() is None, reason='node or dist/ not available: no cross-check with the Node decoder')
def test_protobuf_with_images_written_here_decodes_in_node_to_the_same_json():
    trs = image_trajectories()
    done = subprocess.run([node(), '-e', NODE_DECODE_TRAJECTORIES, str(_node_encoding())], capture_output=True,
                          input=json.dumps([base64.b64encode(encode_trajectory_pb(t)).decode() for t in trs]).encode())
    assert done.returncode == 0, done.stderr.decode()
    for got, want in zip(json.loads(done.stdout), trs):
        same(got, want)


# --- the images topic ---

class Msg:
    def __init__(self, offset, key, headers, value, topic='lightning.images'):
        self._o, self._k, self._h, self._v, self._t = offset, key, headers, value, topic

    def error(self):
        return None

    def topic(self):
        return self._t

    def partition(self):
        return 0

    def offset(self):
        return self._o

    def key(self):
        return self._k

    def headers(self):
        return self._h

    def value(self):
        return self._v


class FakeTopic:
    """One partition of the images topic; each consumer made reads it from the start, one message
    per poll, and a poll with nothing to hand out moves the clock by its timeout."""

    def __init__(self, messages=()):
        self.messages = list(messages)
        self.now = 0.0
        self.consumers = []

    def clock(self):
        return self.now

    def consumer(self, settings):
        c = FakeImagesConsumer(self, settings)
        self.consumers.append(c)
        return c


class FakeImagesConsumer:
    def __init__(self, topic, settings):
        self.topic, self.settings, self.next, self.closed, self.topics = topic, settings, 0, False, None

    def subscribe(self, topics, **_):
        self.topics = topics

    def poll(self, timeout):
        assert not self.closed
        if self.next < len(self.topic.messages):
            key, headers, value = self.topic.messages[self.next]
            self.next += 1
            return Msg(self.next - 1, key, headers, value)
        self.topic.now += max(timeout, 0.01)
        return None

    def commit(self, *a, **kw):
        raise AssertionError('the images reader never commits')

    def close(self):
        self.closed = True


def image_record(data, key=None):
    """An image as the Kafka exporter sends it: keyed by its hash, the raw bytes, its headers."""
    h = sha(data)
    return ((key or h).encode(), [('content-type', b'image/png'), ('lightning-schema', b'lightning.image.v1'), ('image-sha256', h.encode())], data)


def chunked_image_record(data, size):
    """An image larger than max_message_bytes: chunks with the record's headers and key."""
    key, headers, _ = image_record(data)
    return [(key, h, v) for h, v in chunk(f'image:{sha(data)}', data, size, headers)]


def kafka_images(topic, **kw):
    return KafkaImages('broker:9092', consumer_factory=topic.consumer, clock=topic.clock, **kw)


def test_kafka_images_reads_plain_and_chunked_records_from_the_beginning_without_committing():
    big = png(300, 200, 7)
    topic = FakeTopic([image_record(SCREENS[0]), *chunked_image_record(big, 100), image_record(SCREENS[1])])
    images = kafka_images(topic, **{'security.protocol': 'PLAINTEXT'})
    c = topic.consumers[0]
    assert c.topics == ['lightning.images']
    assert c.settings['auto.offset.reset'] == 'earliest' and c.settings['enable.auto.commit'] is False
    assert c.settings['group.id'].startswith('lightning-images-') and c.settings['security.protocol'] == 'PLAINTEXT'
    assert len(chunked_image_record(big, 100)) > 2
    assert images.get(sha(SCREENS[1]), 'image/png') == SCREENS[1]
    assert images.get(sha(big)) == big
    assert images.get(sha(SCREENS[0])) == SCREENS[0]
    assert len(images) == 3 and images.held_bytes == len(big) + sum(map(len, SCREENS))
    images.close()
    assert c.closed


def test_kafka_images_waits_for_an_image_then_gives_up_with_key_error():
    topic = FakeTopic([image_record(SCREENS[0])])
    images = kafka_images(topic, timeout_s=2)
    with pytest.raises(KeyError):
        images.get(sha(SCREENS[1]))
    assert 2 <= topic.now < 3
    # It arrives later: the next get finds it.
    topic.messages.append(image_record(SCREENS[1]))
    assert images.get(sha(SCREENS[1])) == SCREENS[1]


def test_kafka_images_does_not_keep_bytes_of_another_hash_and_says_so():
    topic = FakeTopic([image_record(SCREENS[0] + b'x', key=sha(SCREENS[0]))])
    images = kafka_images(topic, timeout_s=1)
    with pytest.raises(KeyError, match='bytes of another SHA-256'):
        images.get(sha(SCREENS[0]))
    # The right bytes under that key later: the newest record is the image.
    topic.messages.append(image_record(SCREENS[0]))
    assert images.get(sha(SCREENS[0])) == SCREENS[0]


def test_kafka_images_holds_at_most_max_bytes_and_reads_again_what_it_pushed_out():
    size = 1000
    screens = [bytes([i]) * size for i in range(6)]
    topic = FakeTopic([image_record(s) for s in screens])
    images = kafka_images(topic, max_bytes=2 * size, timeout_s=1)
    assert images.poll() == 6
    assert images.held_bytes <= 2 * size and len(images) == 2
    assert sha(screens[5]) in images and sha(screens[0]) not in images
    # The first one was pushed out: asking for it reads the topic again, from a new consumer.
    assert images.get(sha(screens[0])) == screens[0]
    assert len(topic.consumers) == 2 and topic.consumers[0].closed
    assert images.held_bytes <= 2 * size


def test_kafka_images_hands_an_image_larger_than_the_cache_to_its_get_without_holding_it():
    big = png(300, 200, 9)
    topic = FakeTopic([*chunked_image_record(big, 100), image_record(SCREENS[0])])
    images = kafka_images(topic, max_bytes=len(big) - 1)
    assert images.get(sha(big)) == big
    assert sha(big) not in images and images.held_bytes == 0


def test_kafka_images_forgets_an_image_at_its_tombstone():
    topic = FakeTopic([image_record(SCREENS[0]), (sha(SCREENS[0]).encode(), [], None)])
    images = kafka_images(topic)
    images.poll()
    assert sha(SCREENS[0]) not in images and images.held_bytes == 0


def test_trajectory_images_from_the_images_topic():
    topic = FakeTopic([*chunked_image_record(SCREENS[1], 50), image_record(SCREENS[0])])
    got = trajectory_images(screenshot_trajectory(), kafka_images(topic, timeout_s=1))
    assert [i['data'] for i in got] == SCREENS
    with pytest.raises(ImagesIncomplete, match='image_missing: image 1'):
        trajectory_images(screenshot_trajectory(), kafka_images(FakeTopic([image_record(SCREENS[0])]), timeout_s=1))
