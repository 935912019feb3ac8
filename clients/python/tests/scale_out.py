"""Several ``groups`` consumers in one Kafka consumer group, one killed and one added midway: every
complete group is emitted exactly once across their outputs, and no incomplete one is.

Run by pytest (test_kafka_integration.py, when the spec has a ``scale_out`` object) or on its own:

    python3 clients/python/tests/scale_out.py [SPEC]      # SPEC: default $LIGHTNING_TEST_KAFKA_SPEC

It exits 0 when every group was emitted once, 1 otherwise, and prints what each consumer did.
The spec's ``scale_out`` object (every key optional):

    brokers           host:port,... (default: the spec's ``brokers``)
    partitions        of each topic this script creates (default 6)
    consumers         started first (default 3); then one is killed (SIGKILL) and one added
    group_size        episodes per group (default: the spec's ``group_size``, else 2)
    rows              trajectories (default) or transitions
    group_timeout_ms  the consumers' --group-timeout-ms (default 10000)
    source            what real sidecars wrote: {"records_topic", "episodes_topic", "groups": [uid, ...],
                      "incomplete": [uid, ...]}, the topics with ``partitions`` partitions each. Their
                      messages (key, headers and partition kept) are copied into fresh topics in two
                      waves. Each group's messages must share one partition number (the sidecar keys
                      them by group id); the script checks that first.
    synthetic_groups  without ``source``: how many complete groups of records the script makes
                      itself (default 24; plus 2 incomplete ones when group_size > 1), keyed by group id

The scenario: the consumers start and share the partitions (librdkafka's range assignor); the first
wave goes out (a third of the groups whole, a third without their episodes, the incomplete groups);
once the consumers are quiet the first one is killed and a new one started; once the group is
rebalanced the second wave goes out (the missing episodes, the last third). Then the script waits
for every group (those behind an incomplete group on their partition come out when it times out),
stops the consumers (SIGTERM) and counts each group across all outputs, the killed one's included.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
PACKAGE_ROOT = HERE.parent
JOINED = re.compile(r'^groups: joined consumer group \S+: (.*)$')
JSON_HEADERS = [('content-type', b'application/json')]

Message = tuple[int, Optional[bytes], list, bytes]  # partition, key, headers, value


def read_topic(brokers: str, topic: str) -> list[Message]:
    """Every message of ``topic``, partition by partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({'bootstrap.servers': brokers, 'group.id': f'scale-reader-{uuid.uuid4()}', 'enable.auto.commit': False})
    try:
        out: list[Message] = []
        for p in sorted(c.list_topics(topic, timeout=10).topics[topic].partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            c.assign([TopicPartition(topic, p, low)])
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < high - low and time.monotonic() < deadline:
                got += [m for m in c.consume(500, 0.5) if m.error() is None]
            if len(got) < high - low:
                raise RuntimeError(f'read {len(got)} of {high - low} messages of {topic} [{p}]')
            out += [(p, m.key(), m.headers() or [], m.value()) for m in got]
        return out
    finally:
        c.close()


def create_topics(brokers: str, names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({'bootstrap.servers': brokers})  # kept until the results are in
    for f in admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=10).values():
        f.result(timeout=15)


def produce(brokers: str, topic: str, messages: list[Message]) -> None:
    from confluent_kafka import Producer

    p = Producer({'bootstrap.servers': brokers, 'linger.ms': 5})
    for partition, key, headers, value in messages:
        p.produce(topic, value=value, key=key, headers=headers, partition=partition)
    if p.flush(30) != 0:
        raise RuntimeError(f'could not produce to {topic}')


def synthetic(rows: str, group_size: int, groups: int, partitions: int) -> tuple[dict[str, list[Message]], list[str], list[str]]:
    """Records of ``groups`` complete groups (and 2 incomplete ones), keyed and partitioned by group id."""
    sys.path[:0] = [str(HERE), str(PACKAGE_ROOT)]
    from factories import trajectory_rollout

    run = uuid.uuid4().hex[:6]
    complete = [f'sg{i}-{run}' for i in range(groups)]
    incomplete = [f'si{i}-{run}' for i in range(2)] if group_size > 1 else []
    msgs: dict[str, list[Message]] = {'records': [], 'episodes': []}
    n = 0
    for gid in complete + incomplete:
        part = zlib.crc32(gid.encode()) % partitions
        for k in range(group_size if gid in complete else group_size - 1):
            n += 1
            ts, trs, e = trajectory_rollout(f'{gid}-r{k}', 1 + n % 3, group_id=gid, final_reward=k / group_size, base=100 + n * 100)
            for r in (trs if rows == 'trajectories' else ts):
                msgs['records'].append((part, gid.encode(), JSON_HEADERS, json.dumps(r).encode()))
            msgs['episodes'].append((part, gid.encode(), JSON_HEADERS, json.dumps(e).encode()))
    return msgs, complete, incomplete


def split_partitions(msgs: dict[str, list[Message]], groups: list[str]) -> list[str]:
    """Groups whose messages are on more than one partition number (a group's records must share one)."""
    seen: dict[str, set[int]] = {}
    for kind in msgs.values():
        for partition, key, _, _ in kind:
            if key is not None:
                seen.setdefault(key.decode(), set()).add(partition)
    return [f'{g}: {sorted(seen.get(g, ()))}' for g in groups if len(seen.get(g, ())) != 1]


def waves(msgs: dict[str, list[Message]], complete: list[str]) -> tuple[dict[str, list[Message]], dict[str, list[Message]]]:
    """The first wave: a third of the groups whole, a third without episodes, and everything else;
    the second: those episodes and the last third. Each key's messages keep their order."""
    later_all = {g.encode() for g in complete[2::3]}
    later_episodes = {g.encode() for g in complete[1::3]}
    first: dict[str, list[Message]] = {}
    second: dict[str, list[Message]] = {}
    for kind, ms in msgs.items():
        late = later_all | (later_episodes if kind == 'episodes' else set())
        first[kind] = [m for m in ms if m[1] not in late]
        second[kind] = [m for m in ms if m[1] in late]
    return first, second


class Consumer:
    """One ``python3 -m lightning_sidecar_client groups`` process of the consumer group."""

    def __init__(self, name: str, args: list[str], workdir: Path) -> None:
        self.name = name
        self.out = workdir / f'{name}.jsonl'
        self.err_path = workdir / f'{name}.err'
        env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
        with open(self.err_path, 'w') as err:
            self.proc = subprocess.Popen([sys.executable, '-m', 'lightning_sidecar_client', 'groups', *args, '--out', str(self.out),
                                          '--state', str(workdir / f'{name}.state')],
                                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)

    def stderr(self) -> str:
        return self.err_path.read_text(errors='replace')

    def assignment(self) -> Optional[dict[str, set[int]]]:
        """What its last 'joined consumer group' line says it owns (None before the first)."""
        lines = [m.group(1) for m in map(JOINED.match, self.stderr().splitlines()) if m]
        if not lines:
            return None
        owned: dict[str, set[int]] = {}
        for topic, parts in re.findall(r'(\S+) \[([\d,]*)\]', lines[-1]):
            owned[topic] = {int(p) for p in parts.split(',') if p}
        return owned

    def emitted(self) -> list[str]:
        if not self.out.exists():
            return []
        uids = []
        for line in self.out.read_text().splitlines():
            try:
                uids.append(json.loads(line)['uid'])
            except (ValueError, KeyError):
                uids.append(f'<torn line in {self.out.name}>')
        return uids

    def alive(self) -> bool:
        return self.proc.poll() is None


def wait_for(what: str, cond, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise TimeoutError(f'scale-out: {what} within {timeout_s} s')


def balanced(consumers: list[Consumer], topics: list[str], partitions: int) -> bool:
    """Every live consumer has joined, and their last assignments cover each topic's partitions once."""
    live = [c for c in consumers if c.alive()]
    owned = [c.assignment() for c in live]
    if not live or any(o is None for o in owned):
        return False
    for t in topics:
        parts = [p for o in owned for p in (o or {}).get(t, ())]
        if sorted(parts) != list(range(partitions)):
            return False
    return True


def run(spec: dict[str, Any], workdir: Path, log=print) -> bool:
    cfg = spec.get('scale_out') or {}
    brokers = cfg.get('brokers') or spec['brokers']
    partitions = int(cfg.get('partitions', 6))
    n = int(cfg.get('consumers', 3))
    group_size = int(cfg.get('group_size', spec.get('group_size', 2)))
    rows = cfg.get('rows', 'trajectories')
    timeout_ms = int(cfg.get('group_timeout_ms', 10_000))
    source = cfg.get('source')
    if source:
        msgs = {'records': read_topic(brokers, source['records_topic']), 'episodes': read_topic(brokers, source['episodes_topic'])}
        complete, incomplete = sorted(source['groups']), sorted(source.get('incomplete', []))
    else:
        msgs, complete, incomplete = synthetic(rows, group_size, int(cfg.get('synthetic_groups', 24)), partitions)
    split = split_partitions(msgs, complete + incomplete)
    if split:
        log(f'scale-out: groups whose records are on several partitions (keyed by something else than the group id?): {split}')
        return False

    suffix = uuid.uuid4().hex[:8]
    topics = {'records': f'scale.{suffix}.{rows}', 'episodes': f'scale.{suffix}.episodes'}
    create_topics(brokers, list(topics.values()), partitions)
    first, second = waves(msgs, complete)
    args = ['--group-size', str(group_size), '--rows', rows, '--brokers', brokers, '--group-id', f'scale-{suffix}',
            '--group-timeout-ms', str(timeout_ms), '--trajectories-topic' if rows == 'trajectories' else '--topic', topics['records'],
            '--episodes-topic', topics['episodes'],
            # A killed consumer's partitions move once its session expires.
            '-X', 'session.timeout.ms=6000', '-X', 'heartbeat.interval.ms=500']
    consumers = [Consumer(f'c{i}', args, workdir) for i in range(n)]
    victim: Optional[Consumer] = None
    failed = False
    try:
        wait_for(f'{n} consumers joined and shared the partitions', lambda: balanced(consumers, list(topics.values()), partitions), 60)
        for kind, topic in topics.items():
            produce(brokers, topic, first[kind])
        log(f'scale-out: first wave out ({sum(map(len, first.values()))} messages)')
        emitted = lambda: sum(len(c.emitted()) for c in consumers)  # noqa: E731
        try:
            wait_for('a first group emitted', lambda: emitted() > 0, 15)
        except TimeoutError as e:  # every group of the first wave may be behind one not complete yet
            log(str(e))
        # Killed while quiet: a consumer killed between writing a group and committing past it
        # leaves that group to the next owner (docs/trainer-python.md), which is not what this checks.
        last, since, start = emitted(), time.monotonic(), time.monotonic()
        while time.monotonic() - since < 2 and time.monotonic() - start < 30:
            time.sleep(0.2)
            if emitted() != last:
                last, since = emitted(), time.monotonic()
        victim = max(consumers, key=lambda c: sum(map(len, (c.assignment() or {}).values())))
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        log(f'scale-out: killed {victim.name} after it emitted {len(victim.emitted())} groups; {emitted()} emitted in all')
        consumers.append(Consumer(f'c{n}', args, workdir))
        wait_for('the group rebalanced after the kill and the new consumer', lambda: balanced(consumers, list(topics.values()), partitions), 60)
        for kind, topic in topics.items():
            produce(brokers, topic, second[kind])
        log(f'scale-out: second wave out ({sum(map(len, second.values()))} messages)')
        everyone = lambda: set(complete) <= {u for c in consumers for u in c.emitted()}  # noqa: E731
        try:
            wait_for('every complete group emitted', everyone, timeout_ms / 1000 + 60)
        except TimeoutError as e:
            log(str(e))
        time.sleep(2)  # a group emitted twice would likely show by now
    except TimeoutError as e:
        log(str(e))
        failed = True
    finally:
        for c in consumers:
            if c.alive():
                c.proc.send_signal(signal.SIGTERM)
        for c in consumers:
            try:
                c.proc.wait(20)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait(5)
    counts = Counter(u for c in consumers for u in c.emitted())
    for c in consumers:
        log(f'scale-out: {c.name} (exit {c.proc.returncode}) emitted {len(c.emitted())}: {sorted(c.emitted())}')
    twice = sorted(u for u, k in counts.items() if k > 1)
    missing = sorted(set(complete) - set(counts))
    wrong = sorted(set(counts) - set(complete))
    crashed = [c.name for c in consumers if c is not victim and c.proc.returncode != 0]
    ok = not (failed or crashed or twice or missing or wrong)
    log(f'scale-out: {len(complete)} groups, {len(counts)} emitted; twice: {twice}; missing: {missing}; not expected: {wrong}; '
        f'exited with an error: {crashed}')
    if not ok:
        for c in consumers:
            log(f'--- {c.name} stderr ---\n{c.stderr()[-4000:]}')
    return ok


def main(argv: list[str]) -> int:
    path = argv[0] if argv else os.environ.get('LIGHTNING_TEST_KAFKA_SPEC')
    if not path:
        sys.stderr.write('usage: scale_out.py SPEC (or $LIGHTNING_TEST_KAFKA_SPEC)\n')
        return 2
    spec = json.loads(Path(path).read_text())
    with tempfile.TemporaryDirectory(prefix='lightning-scale-out-') as d:
        return 0 if run(spec, Path(d)) else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
