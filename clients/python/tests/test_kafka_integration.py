"""Against a Kafka-protocol broker holding streams a real sidecar produced.

The jest test test/python/python-client.test.ts starts the broker and sidecars, drives rollouts
through them and describes what it produced in the JSON file named by $LIGHTNING_TEST_KAFKA_SPEC:

    {"brokers": "host:port,...", "group_size": N,
     "streams": [{"name", "encoding": "json"|"protobuf", "chunked": bool, "delta": bool,
                  "records": "trajectories"|"transitions"|"both",   # exporters.records; absent: transitions
                  "topic", "trajectories_topic", "episodes_topic",   # trajectories_topic when trajectories are exported
                  "groups": {uid: [rollout_id, ...]}, "incomplete": [uid, ...],
                  "calls": {rollout_id: [{"prompt": [...], "response": [...], "logprobs": [...]}, ...]}}]}

``calls`` are the exact token ids of every call (from the model server's answers), in seq order.
Each test runs per stream and per row kind the stream exported (``rows``): trajectory rows are
checked against the segments the calls make (a call continues the previous one when its prompt
starts with that call's prompt and response), per-call rows against the calls themselves.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SPEC_PATH = os.environ.get('LIGHTNING_TEST_KAFKA_SPEC')
pytestmark = pytest.mark.skipif(not SPEC_PATH, reason='LIGHTNING_TEST_KAFKA_SPEC is not set (the jest test test/python sets it)')

if SPEC_PATH:
    from confluent_kafka import Consumer, Producer, TopicPartition

from lightning_sidecar_client import iter_groups, iter_trajectories, iter_transitions, js_json, to_verl_batch
from lightning_sidecar_client.records import decode_episode, decode_trajectory, decode_transition, encoding_of
from factories import as_delta, chunk, encode_episode_pb, encode_trajectory_pb, encode_transition_pb

SPEC = json.loads(Path(SPEC_PATH).read_text()) if SPEC_PATH else {'streams': []}
STREAMS = {s['name']: s for s in SPEC['streams']}
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def rows_of(stream: dict) -> list[str]:
    """The row kinds a stream's records allow: its ``records`` setting (absent: transitions, what older sidecars wrote)."""
    records = stream.get('records', 'transitions')
    return ['trajectories', 'transitions'] if records == 'both' else [records]


CASES = [(name, rows) for name, s in STREAMS.items() for rows in rows_of(s)]


def stream_with(rows: str) -> dict:
    """The first stream exporting ``rows`` records (the json one when it does)."""
    for s in sorted(STREAMS.values(), key=lambda s: s['name'] != 'json'):
        if rows in rows_of(s):
            return s
    pytest.skip(f'no stream exported {rows}')


def record_topics(stream: dict) -> dict[str, str]:
    """Kind ('transitions', 'trajectories', 'episodes') to topic, for what the stream exported."""
    out = {rows: stream['trajectories_topic' if rows == 'trajectories' else 'topic'] for rows in rows_of(stream)}
    out['episodes'] = stream['episodes_topic']
    return out


def read_topic(topic: str) -> list[tuple[int, bytes, list, bytes]]:
    """Every message of ``topic``: (partition, key, headers, value), partition by partition."""
    c = Consumer({'bootstrap.servers': SPEC['brokers'], 'group.id': f'reader-{uuid.uuid4()}', 'enable.auto.commit': False})
    try:
        partitions = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        out = []
        for p in partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            c.assign([TopicPartition(topic, p, low)])
            got = []
            while len(got) < high - low:
                got += [m for m in c.consume(500, 1.0) if m.error() is None]
            out += [(p, m.key(), m.headers() or [], m.value()) for m in got]
        return out
    finally:
        c.close()


def produce(topic: str, messages) -> None:
    p = Producer({'bootstrap.servers': SPEC['brokers'], 'linger.ms': 0})
    for partition, key, headers, value in messages:
        p.produce(topic, value=value, key=key, headers=headers, partition=partition)
    assert p.flush(15) == 0


def copy_stream(stream: dict, transform) -> dict:
    """The stream's topics copied to fresh ones, each kind's message list passed through ``transform(msgs, kind)``."""
    suffix = uuid.uuid4().hex[:8]
    names = {'transitions': 'topic', 'trajectories': 'trajectories_topic', 'episodes': 'episodes_topic'}
    copy = dict(stream)
    for kind, topic in record_topics(stream).items():
        copy[names[kind]] = f'{topic}.{suffix}'
        produce(copy[names[kind]], transform(read_topic(topic), kind))
    return copy


def groups_of(stream: dict, rows: str, **kw) -> list[dict]:
    # Read to the end of the topics and stop (the stream is all there before the test reads it).
    if 'idle_exit_ms' not in kw:
        kw.setdefault('until_end', True)
    return list(iter_groups(SPEC['group_size'], rows=rows, brokers=SPEC['brokers'], consumer_group=f'trainer-{uuid.uuid4()}', topic=stream['topic'],
                            trajectories_topic=stream.get('trajectories_topic'), episodes_topic=stream['episodes_topic'], **kw))


def segments(calls: list[dict]) -> list[list[int]]:
    """The calls' seqs by trajectory segment: a call joins the segment when its prompt continues the previous call."""
    out: list[list[int]] = []
    for seq, c in enumerate(calls):
        if out:
            prev = calls[out[-1][-1]]
            head = prev['prompt'] + prev['response']
            if c['prompt'][:len(head)] == head:
                out[-1].append(seq)
                continue
        out.append([seq])
    return out


def check_trajectory(calls: list[dict], seqs: list[int], token_ids: list[int], prompt_length: int, mask: list[int], logprobs) -> None:
    """A segment's ids, loss mask and logprobs against its calls, token for token (positions from the segment's start)."""
    first, last = calls[seqs[0]], calls[seqs[-1]]
    assert prompt_length == len(first['prompt'])
    assert token_ids == last['prompt'] + last['response']
    sampled = {}
    for s in seqs:
        c = calls[s]
        for k, lp in enumerate(c['logprobs']):
            sampled[len(c['prompt']) + k] = lp
    assert mask == [1 if i in sampled else 0 for i in range(len(token_ids))]
    assert logprobs is not None and logprobs == pytest.approx([sampled.get(i, 0) for i in range(len(token_ids))])


def check_groups(stream: dict, groups: list[dict], rows: str) -> None:
    """The complete groups, once each, with every row's token ids exactly as the model server sent them."""
    assert sorted(g['uid'] for g in groups) == sorted(stream['groups'])
    for g in groups:
        rollouts = sorted(stream['groups'][g['uid']])
        assert [e['rollout_id'] for e in g['episodes']] == rollouts
        b = g['batch']
        if rows == 'transitions':
            assert 'rows' not in g
            expected_rows = [(rid, seq) for rid in rollouts for seq in range(len(stream['calls'][rid]))]
            assert list(zip(b['rollout_id'], b['seq'])) == expected_rows
            for i, (rid, seq) in enumerate(expected_rows):
                call = stream['calls'][rid][seq]
                assert b['prompt_ids'][i] == call['prompt'], (rid, seq)
                assert b['response_ids'][i] == call['response'], (rid, seq)
                assert b['rollout_log_probs'][i] == pytest.approx(call['logprobs'])
            continue
        assert (g['rows'], g['unmerged_calls']) == ('trajectories', 0)
        final = {e['rollout_id']: e['final_reward'] for e in g['episodes']}
        expected_rows = [(rid, n, seqs) for rid in rollouts for n, seqs in enumerate(segments(stream['calls'][rid]))]
        assert list(zip(b['rollout_id'], b['segment'])) == [(rid, n) for rid, n, _ in expected_rows]
        for i, (rid, n, seqs) in enumerate(expected_rows):
            calls, p = stream['calls'][rid], len(stream['calls'][rid][seqs[0]]['prompt'])
            last = n == len(segments(calls)) - 1
            assert (b['trajectory_id'][i], b['turns'][i], b['is_last'][i]) == (f'{rid}/0/s{n}', len(seqs), last)
            check_trajectory(calls, seqs, b['prompt_ids'][i] + b['response_ids'][i], len(b['prompt_ids'][i]),
                             [0] * p + b['response_mask'][i], None if b['rollout_log_probs'][i] is None else [0] * p + b['rollout_log_probs'][i])
            scores = b['token_level_scores'][i]
            assert sum(scores) == pytest.approx(b['reward'][i])
            if last and final[rid] is not None:
                # No tool calls in these rollouts, so no AIR: the final reward alone, on the last sampled token.
                assert scores[-1] == pytest.approx(final[rid]) and sum(scores) == pytest.approx(final[rid])


@pytest.mark.parametrize('name,rows', CASES)
def test_groups_from_the_sidecars_stream_carry_the_model_servers_exact_token_ids(name, rows):
    stream = STREAMS[name]
    events = []
    groups = groups_of(stream, rows, timeout_ms=1000, idle_exit_ms=2500, on_event=events.append)
    check_groups(stream, groups, rows)
    assert sorted(ev.uid for ev in events if ev.kind == 'incomplete') == sorted(stream['incomplete'])
    assert [ev for ev in events if ev.kind not in ('incomplete', 'orphaned', 'assigned')] == []


@pytest.mark.parametrize('name', [n for n, s in STREAMS.items() if 'trajectories' in rows_of(s)])
def test_verl_tensors_of_the_sidecars_trajectory_groups_match_the_model_servers_answers(name):
    """Trains nothing: every tensor to_verl_batch makes of a real group, against the calls behind it."""
    np = pytest.importorskip('numpy')
    stream = STREAMS[name]
    groups = groups_of(stream, 'trajectories', timeout_ms=1000, idle_exit_ms=2500)
    assert groups
    for g in groups:
        t = to_verl_batch(g, pad_token_id=-1)
        rollouts = sorted(stream['groups'][g['uid']])
        rows = [(rid, seqs) for rid in rollouts for seqs in segments(stream['calls'][rid])]
        final = {e['rollout_id']: e['final_reward'] for e in g['episodes']}
        width_p, width_r = t['prompts'].shape[1], t['responses'].shape[1]
        assert t['input_ids'].shape == (len(rows), width_p + width_r)
        for i, (rid, seqs) in enumerate(rows):
            calls = stream['calls'][rid]
            first, last = calls[seqs[0]], calls[seqs[-1]]
            ids = last['prompt'] + last['response']
            p = len(first['prompt'])
            # Prompt left-padded, response right-padded; the real tokens are exactly the last call's prompt and answer.
            real = t['attention_mask'][i] == 1
            assert t['input_ids'][i][real].tolist() == ids
            assert t['input_ids'][i][:width_p - p].tolist() == [-1] * (width_p - p)
            # Sampled positions, relative to the response's start: each call's answer, and nothing else.
            sampled = {len(calls[s]['prompt']) - p + k: lp for s in seqs for k, lp in enumerate(calls[s]['logprobs'])}
            assert int(t['response_mask'][i].sum()) == sum(len(calls[s]['response']) for s in seqs) == len(sampled)
            assert np.flatnonzero(t['response_mask'][i]).tolist() == sorted(sampled)
            assert t['old_log_probs'][i].tolist() == pytest.approx([sampled.get(j, 0.0) for j in range(width_r)], abs=1e-6)
            assert bool(t['has_old_log_probs'][i])
            # The final reward on the segment's last sampled token (no tool calls here, so no AIR).
            scores = np.flatnonzero(t['token_level_scores'][i]).tolist()
            if final[rid]:
                assert scores == [len(ids) - p - 1] == [max(sampled)]
                assert float(t['token_level_scores'][i][scores[0]]) == pytest.approx(final[rid])
            else:
                assert scores == []


@pytest.mark.parametrize('name', [n for n, s in STREAMS.items() if 'transitions' in rows_of(s)])
def test_plain_transitions_arrive_once_each_with_whole_prompts(name):
    stream = STREAMS[name]
    got = list(iter_transitions(brokers=SPEC['brokers'], consumer_group=f'plain-{uuid.uuid4()}', topic=stream['topic'],
                                episodes_topic=stream['episodes_topic'], until_end=True))
    assert sorted(t['transition_id'] for t in got) == sorted(f'{rid}/0/{seq}' for rid, calls in stream['calls'].items() for seq in range(len(calls)))
    for t in got:
        call = stream['calls'][t['rollout_id']][t['seq']]
        assert (t['prompt_token_ids'], t['response_token_ids']) == (call['prompt'], call['response'])
        assert 'prompt_token_ids_delta' not in t


@pytest.mark.parametrize('name', [n for n, s in STREAMS.items() if 'trajectories' in rows_of(s)])
def test_plain_trajectories_arrive_once_each_with_the_calls_merged(name):
    stream = STREAMS[name]
    got = list(iter_trajectories(brokers=SPEC['brokers'], consumer_group=f'plain-{uuid.uuid4()}', trajectories_topic=stream['trajectories_topic'],
                                 episodes_topic=stream['episodes_topic'], until_end=True))
    want = {f'{rid}/0/s{n}': (rid, n, seqs) for rid, calls in stream['calls'].items() for n, seqs in enumerate(segments(calls))}
    assert sorted(t['trajectory_id'] for t in got) == sorted(want)
    for t in got:
        rid, n, seqs = want[t['trajectory_id']]
        calls = stream['calls'][rid]
        assert (t['rollout_id'], t['segment'], t['segments']) == (rid, n, len(segments(calls)))
        assert [turn['seq'] for turn in t['turns']] == seqs
        check_trajectory(calls, seqs, t['token_ids'], t['prompt_length'], t['loss_mask'], t['logprobs'])


@pytest.mark.parametrize('name', [n for n, s in STREAMS.items() if s.get('chunked') or s.get('delta')])
def test_the_sidecar_really_sent_chunks_and_prompt_deltas_on_this_stream(name):
    stream = STREAMS[name]
    topics = record_topics(stream)
    if stream.get('chunked'):
        headers = [dict(h) for kind, topic in topics.items() for _, _, h, _ in read_topic(topic)]
        assert any(h.get('lightning-chunk') == b'v1' for h in headers)
    if stream.get('delta') and 'transitions' in topics:
        assert any(dict(h).get('lightning-prompt-ids') == b'delta' for _, _, h, _ in read_topic(topics['transitions']))


@pytest.mark.parametrize('rows', ['trajectories', 'transitions'])
def test_every_message_delivered_twice_and_the_stream_again_gives_each_group_once(rows):
    stream = stream_with(rows)
    copy = copy_stream(stream, lambda msgs, _kind: [m for m in msgs for _ in (0, 1)] + msgs)
    check_groups(copy, groups_of(copy, rows), rows)


def interleaved(pending: list[list]) -> list:
    """Two records' chunks interleaved, the longer one's rest after."""
    a, b = pending
    return [m for pair in zip(a, b) for m in pair] + a[len(b):] + b[len(a):]


def chunked_pairs(records, size: int, content_type: bytes) -> list:
    """(partition, key, record) in order, each record chunked above ``size`` bytes and the chunks of two
    records at a time interleaved, as a reader may see them."""
    out, pending = [], []
    for partition, key, record in records:
        hs = [('content-type', content_type)]
        pieces = chunk(f'r-{len(pending)}-{len(out)}', record, size, hs) if len(record) > size else [(hs, record)]
        pending.append([(partition, key, h, v) for h, v in pieces])
        if len(pending) == 2:
            out += interleaved(pending)
            pending = []
    return out + [m for p in pending for m in p]


def encoder(encoding: str):
    def encode(kind, record):
        if encoding == 'json':
            return json.dumps(record).encode()
        return {'episodes': encode_episode_pb, 'trajectories': encode_trajectory_pb, 'transitions': encode_transition_pb}[kind](record)
    return encode


@pytest.mark.parametrize('encoding', ['json', 'protobuf'])
def test_prompt_deltas_in_interleaved_chunks_give_the_same_group_lines_as_the_plain_stream(encoding):
    """The sidecar's records rewritten as docs/kafka-records.md describes the wire format."""
    from factories import proto_has_delta

    if encoding == 'protobuf' and not proto_has_delta():
        pytest.skip('records.proto has no prompt_token_ids_delta field yet')
    stream = stream_with('transitions')
    content_type = b'application/json' if encoding == 'json' else b'application/x-protobuf'
    encode = encoder(encoding)
    deltas = []

    def rewrite(msgs, kind):
        if kind == 'trajectories':
            return msgs
        previous: dict = {}

        def records():
            for partition, key, headers, value in msgs:
                if kind == 'episodes':
                    yield partition, key, encode(kind, decode_episode(value, encoding_of(headers)))
                    continue
                t = decode_transition(value, encoding_of(headers))
                prev = previous.get((t['rollout_id'], t['seq'] - 1))
                previous[(t['rollout_id'], t['seq'])] = t
                if t['continues_previous'] and prev:
                    t = as_delta(t, prev)
                    deltas.append(t['transition_id'])
                yield partition, key, encode(kind, t)

        return chunked_pairs(records(), 97, content_type)

    copy = copy_stream(stream, rewrite)
    assert deltas and any(dict(h).get('lightning-chunk') for _, _, h, _ in read_topic(copy['topic']))
    want = sorted(js_json.dumps(g) for g in groups_of(stream, 'transitions'))
    assert sorted(js_json.dumps(g) for g in groups_of(copy, 'transitions')) == want


@pytest.mark.parametrize('encoding', ['json', 'protobuf'])
def test_trajectories_in_interleaved_chunks_give_the_same_group_lines_as_the_plain_stream(encoding):
    stream = stream_with('trajectories')
    content_type = b'application/json' if encoding == 'json' else b'application/x-protobuf'
    encode = encoder(encoding)
    decode = {'episodes': decode_episode, 'trajectories': decode_trajectory}

    def rewrite(msgs, kind):
        if kind == 'transitions':
            return msgs
        return chunked_pairs(((p, k, encode(kind, decode[kind](v, encoding_of(h)))) for p, k, h, v in msgs), 61, content_type)

    copy = copy_stream(stream, rewrite)
    assert any(dict(h).get('lightning-chunk') for _, _, h, _ in read_topic(copy['trajectories_topic']))
    want = sorted(js_json.dumps(g) for g in groups_of(stream, 'trajectories'))
    assert sorted(js_json.dumps(g) for g in groups_of(copy, 'trajectories')) == want


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    return subprocess.run([sys.executable, '-m', 'lightning_sidecar_client', 'groups', *args], env=env, capture_output=True, text=True, timeout=60)


def topic_args(stream: dict, rows: str) -> list[str]:
    records = ['--trajectories-topic', stream['trajectories_topic']] if rows == 'trajectories' else ['--topic', stream['topic']]
    return ['--rows', rows, *records, '--episodes-topic', stream['episodes_topic']]


@pytest.mark.parametrize('rows', ['trajectories', 'transitions'])
def test_the_cli_emits_each_group_once_across_a_restart_with_redelivery_in_between(tmp_path, rows):
    stream = stream_with(rows)
    copy = copy_stream(stream, lambda msgs, _kind: msgs)
    out = tmp_path / 'groups.jsonl'
    common = ['--group-size', str(SPEC['group_size']), '--brokers', SPEC['brokers'], '--group-id', 'cli', '--out', str(out), *topic_args(copy, rows)]
    first = run_cli(*common, '--max-groups', '1')
    assert first.returncode == 0, first.stderr
    assert first.stderr.count('groups: emitted ') == 1
    # The whole stream again (an exporter redelivering) while the consumer is down.
    for kind, topic in record_topics(stream).items():
        produce(record_topics(copy)[kind], read_topic(topic))
    second = run_cli(*common, '--idle-exit-ms', '1500', '--group-timeout-ms', '1000')
    assert second.returncode == 0, second.stderr
    lines = out.read_text().splitlines()
    assert sorted(json.loads(line)['uid'] for line in lines) == sorted(stream['groups'])
    assert sorted(lines) == sorted(js_json.dumps(g) for g in groups_of(stream, rows))
    for uid in stream['incomplete']:
        assert f'groups: gave up on {uid}: 1 of {SPEC["group_size"]} episodes after ' in second.stderr
    assert [json.loads(line)['status'] for line in (tmp_path / 'groups.jsonl.state').read_text().splitlines()] == ['incomplete'] * len(stream['incomplete'])


@pytest.mark.parametrize('rows', ['trajectories', 'transitions'])
def test_the_cli_sends_groups_to_a_topic_and_remembers_them_in_its_state_file(tmp_path, rows):
    stream = stream_with(rows)
    topic = f'groups.{uuid.uuid4().hex[:8]}'
    state = tmp_path / 'state'
    args = ['--group-size', str(SPEC['group_size']), '--brokers', SPEC['brokers'], '--group-id', f'to-topic-{topic}', '--to-topic', topic,
            '--state', str(state), *topic_args(stream, rows), '--until-end']
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    sent = read_topic(topic)
    assert sorted(v.decode() for _, _, _, v in sent) == sorted(js_json.dumps(g) for g in groups_of(stream, rows))
    assert sorted(k.decode() for _, k, _, _ in sent) == sorted(stream['groups'])
    assert sorted(json.loads(line)['uid'] for line in state.read_text().splitlines()) == sorted(stream['groups'])


def test_the_cli_reports_episodes_whose_sidecar_did_not_export_the_rows_asked_for(tmp_path):
    """A stream with one kind of records, read with --rows of the other: each episode reported, nothing emitted."""
    stream = next((s for s in STREAMS.values() if len(rows_of(s)) == 1), None)
    if stream is None:
        pytest.skip('every stream exported both kinds')
    [have] = rows_of(stream)
    other = 'transitions' if have == 'trajectories' else 'trajectories'
    # The other kind's topic does not exist; a fresh name keeps the broker from serving old records.
    missing = dict(stream, topic=f'absent.{uuid.uuid4().hex[:8]}', trajectories_topic=f'absent.{uuid.uuid4().hex[:8]}')
    done = run_cli('--group-size', str(SPEC['group_size']), '--brokers', SPEC['brokers'], '--group-id', f'not-exported-{uuid.uuid4()}',
                   '--out', str(tmp_path / 'out.jsonl'), *topic_args(missing, other), '--idle-exit-ms', '1500', '--group-timeout-ms', '1000')
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / 'out.jsonl').exists() or (tmp_path / 'out.jsonl').read_text() == ''
    for rid in stream['calls']:
        line = (f'groups: episode {rid}/0 has no exported {other} (exporters.records is {have}); use --rows {have} or export {other}\n')
        assert done.stderr.count(line) == 1, done.stderr


@pytest.mark.skipif('scale_out' not in SPEC, reason='the spec has no scale_out object: no several-consumer scenario asked for')
def test_consumers_sharing_a_group_emit_each_group_once_across_a_killed_and_an_added_consumer(tmp_path):
    """scale_out.py's scenario (several `groups` processes in one consumer group, one killed, one added)."""
    import scale_out

    lines: list[str] = []
    assert scale_out.run(SPEC, tmp_path, log=lines.append), '\n'.join(lines)
