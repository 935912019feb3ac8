import os

import pytest

from lightning_sidecar_client.chunks import ChunkAssembler, ChunkError, is_chunk
from lightning_sidecar_client.position import Position
from factories import JSON_HEADERS, chunk

T = 'lightning.transitions'


def feed(a, msgs, start=0, now=0, partition=0):
    out, dropped = [], []
    for i, (h, v) in enumerate(msgs):
        whole, d = a.add(h, v, Position(T, partition, start + i), now)
        dropped += d
        if whole is not None:
            out.append(whole)
    return out, dropped


def test_reassembles_records_interleaved_on_a_partition_and_starts_them_at_their_first_chunk():
    a = ChunkAssembler(timeout_ms=1000)
    x, y = os.urandom(2500), os.urandom(1800)
    cx = chunk('r-1/0/0', x, 1000, JSON_HEADERS + [('rollout-id', b'r-1')])
    cy = chunk('r-2/0/0', y, 1000)
    out, _ = feed(a, [cx[0], cy[0], cx[1], cy[1], cx[2]], start=100)
    assert [r.value for r in out] == [y, x]
    assert [r.position.offset for r in out] == [101, 100]
    # The record keeps its own headers, not the chunk bookkeeping.
    assert out[1].headers == JSON_HEADERS + [('rollout-id', b'r-1')]
    assert a.pending_records == 0 and a.held_bytes == 0


def test_chunks_out_of_index_order_still_make_the_record():
    a = ChunkAssembler()
    v = os.urandom(3001)
    c = chunk('x', v, 1000)
    out, _ = feed(a, [c[3], c[1], c[0], c[2]])
    assert out[0].value == v


def test_a_redelivered_index_is_ignored_and_a_resent_copy_completes_the_record_once():
    a = ChunkAssembler()
    v = os.urandom(2500)
    c = chunk('r/0/1', v, 1000)
    # The producer died after two chunks, then sent the whole record again.
    out, _ = feed(a, [c[0], c[1], c[0], c[1], c[2]])
    assert [r.value for r in out] == [v]
    # Chunks of the finished record arriving again (a later redelivery) do not start a new one.
    again, _ = feed(a, c[:2], start=10)
    assert again == [] and a.pending_records == 0


def test_commits_stay_below_the_first_chunk_of_a_record_still_being_assembled():
    a = ChunkAssembler()
    c = chunk('r/0/0', os.urandom(3000), 1000)
    feed(a, c[:2], start=40)
    a.add(c[0][0], c[0][1], Position(T, 1, 7), 0)
    assert a.lowest_pending() == {(T, 0): 40, (T, 1): 7}
    feed(a, c[2:], start=42)
    assert a.lowest_pending() == {(T, 1): 7}


def test_a_record_missing_chunks_after_the_timeout_is_dropped_and_reported():
    a = ChunkAssembler(timeout_ms=1000)
    c = chunk('r/0/2', os.urandom(3000), 1000)
    feed(a, c[:2], now=0)
    assert a.tick(999) == []
    [d] = a.tick(1000)
    assert (d.reason, d.record_id, d.have, d.count, d.waited_ms) == ('timeout', 'r/0/2', 2, 3, 1000)
    assert a.lowest_pending() == {} and a.held_bytes == 0
    # Sent again later (a producer retry), it is reassembled anew.
    out, _ = feed(a, c, now=2000)
    assert len(out) == 1


def test_the_oldest_unfinished_records_are_evicted_beyond_the_byte_bound():
    a = ChunkAssembler(max_bytes=2500)
    old = chunk('old', os.urandom(3000), 1000)
    new = chunk('new', os.urandom(3000), 1000)
    _, d1 = feed(a, [old[0], old[1]])
    _, d2 = feed(a, [new[0], new[1]], start=2)
    assert d1 == [] and [(d.reason, d.record_id) for d in d2] == [('evicted', 'old')]
    out, _ = feed(a, [new[2]], start=4)
    assert len(out) == 1 and a.held_bytes == 0


def test_a_record_whose_bytes_do_not_match_its_digest_is_refused():
    a = ChunkAssembler()
    c = chunk('r', os.urandom(2000), 1000)
    c[1] = (c[1][0], b'x' * 1000)
    feed(a, c[:1])
    with pytest.raises(ChunkError, match='SHA-256'):
        feed(a, c[1:], start=1)
    assert a.pending_records == 0


@pytest.mark.parametrize('name,value,reason', [
    ('lightning-chunk', b'v9', "unsupported chunk format 'v9'"),
    ('lightning-chunk-count', b'1', 'lightning-chunk-count'),
    ('lightning-chunk-index', b'5', 'lightning-chunk-index'),
    ('lightning-record-bytes', b'-1', 'lightning-record-bytes'),
    ('lightning-record-sha256', b'ABC', 'lightning-record-sha256'),
])
def test_chunks_with_unusable_headers_are_refused_with_the_reason(name, value, reason):
    [(h, v), _] = chunk('r', os.urandom(20), 10)
    h = [(k, value if k == name else x) for k, x in h]
    with pytest.raises(ChunkError) as e:
        ChunkAssembler().add(h, v, Position(T, 0, 0), 0)
    assert reason in e.value.reason and e.value.record_id == 'r'


def test_a_message_without_the_chunk_header_is_not_a_chunk():
    assert not is_chunk(JSON_HEADERS) and not is_chunk(None)
    assert is_chunk(chunk('r', b'abcd', 2)[0][0])
