"""``python3 -m lightning_sidecar_client groups``: the Node ``lightning-sidecar groups`` command in Python.

Same options, same output lines (``lightning.group.v1`` JSON, byte for byte; one row per
trajectory, or per call with ``--rows transitions``), same state handling:
with ``--out FILE`` the output file itself is the record of emitted groups (each line fsync'd
before offsets move), otherwise ``--state``; groups given up on are noted in the state file.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any, Optional, TextIO

from . import js_json
from .groups import ROWS, EpisodeLate, EpisodeNotExported, EpisodeUngrouped, GroupIncomplete, GroupReady, TransitionsOrphaned
from .kafka_source import DEFAULT_EPISODES_TOPIC, DEFAULT_TOPIC, DEFAULT_TRAJECTORIES_TOPIC, KafkaSource, brokers_from_env
from .groups import DeltaUnresolved
from .readers import GroupReader
from .source import SourceEvent
from .state import append_line, load_done, remember

USAGE = """usage: python3 -m lightning_sidecar_client groups --group-size N [--rows trajectories|transitions] [--brokers H:P,...]
           [--group-id ID] [--out FILE | --to-topic T] [--state FILE] [--group-timeout-ms MS] [--max-groups N]
           [--idle-exit-ms MS] [--trajectories-topic T] [--topic T] [--episodes-topic T] [-X librdkafka.property=value ...]
           [--data-dir DIR [--follow]]
  emit complete GRPO groups (lightning.group.v1) from the trajectories (--rows transitions: transitions)
  and episodes topics, in a Kafka consumer group (or from the file exporter's data directory with --data-dir)
"""

_VALUED = {'--group-size', '--rows', '--brokers', '--group-id', '--out', '--to-topic', '--state', '--group-timeout-ms', '--max-groups',
           '--idle-exit-ms', '--trajectories-topic', '--topic', '--episodes-topic', '-X', '--data-dir'}
_FLAGS = {'--follow', '--help', '-h'}


class UsageError(Exception):
    pass


def parse(args: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {'-X': []}
    i = 0
    while i < len(args):
        a = args[i]
        if a in _FLAGS:
            opts[a] = True
            i += 1
        elif a in _VALUED:
            if i + 1 >= len(args):
                raise UsageError(f'groups: {a} needs a value')
            if a == '-X':
                opts['-X'].append(args[i + 1])
            else:
                opts[a] = args[i + 1]
            i += 2
        else:
            raise UsageError(f'groups: unknown option {a!r}')
    return opts


def _number(opts: dict[str, Any], name: str, default: float) -> float:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f'groups: {name} must be a number') from None
    if value < 0:
        raise UsageError(f'groups: {name} must not be negative')
    return value


def run_groups(args: list[str], out: TextIO, err: TextIO, env: Optional[dict[str, str]] = None) -> int:
    env = dict(os.environ) if env is None else env
    try:
        opts = parse(args)
        if opts.get('--help') or opts.get('-h'):
            out.write(USAGE)
            return 0
        raw_size = opts.get('--group-size', '')
        if not raw_size.isdigit() or int(raw_size) < 1:
            err.write(f'groups: --group-size N is required (a positive integer)\n{USAGE}')
            return 2
        group_size = int(raw_size)
        rows = opts.get('--rows', 'trajectories')
        if rows not in ROWS:
            raise UsageError(f'groups: --rows must be trajectories or transitions, not {rows!r}')
        timeout_ms = _number(opts, '--group-timeout-ms', 600_000)
        max_groups = _number(opts, '--max-groups', float('inf'))
        idle_exit = opts.get('--idle-exit-ms')
        idle_exit_ms = _number(opts, '--idle-exit-ms', 0) if idle_exit is not None else None
        settings = {}
        for kv in opts['-X']:
            k, sep, v = kv.partition('=')
            if not sep or not k:
                raise UsageError(f'groups: -X takes property=value, got {kv!r}')
            settings[k] = v
    except UsageError as e:
        err.write(f'{e}\n{USAGE}')
        return 2

    out_path: Optional[str] = opts.get('--out')
    to_topic: Optional[str] = opts.get('--to-topic')
    state_path = opts.get('--state') or (f'{out_path}.state' if out_path else 'lightning-groups.state')
    data_dir = opts.get('--data-dir')
    brokers = opts['--brokers'].split(',') if opts.get('--brokers') else brokers_from_env(env)
    if not brokers and (data_dir is None or to_topic):
        err.write('groups: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS)\n')
        return 2
    if data_dir is not None:
        from .files import FileSource

        source: Any = FileSource(data_dir, follow=bool(opts.get('--follow')), records=rows)
    else:
        try:
            source = _kafka_source(opts, env, brokers, rows, settings, timeout_ms)
        except ValueError as e:  # two kinds of record on one topic
            err.write(f'groups: {e}\n')
            return 2

    kafka_log = logging.getLogger('lightning_sidecar_client.kafka')
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter('groups: kafka: %(message)s'))
    kafka_log.addHandler(handler)
    kafka_log.propagate = False
    reader = GroupReader(source, group_size, rows=rows, timeout_ms=timeout_ms, done=load_done([out_path, state_path]), idle_exit_ms=idle_exit_ms)
    previous = {s: signal.signal(s, lambda *_: reader.stop()) for s in (signal.SIGINT, signal.SIGTERM)}
    producer = None
    emitted = 0
    try:
        producer = _producer(brokers, settings) if to_topic else None
        for ev in reader.events():
            if isinstance(ev, GroupReady):
                batch = ev.batch
                line = js_json.dumps(batch)
                if out_path is not None:
                    append_line(out_path, line)
                elif producer is not None:
                    _send(producer, to_topic or '', batch['uid'], line)
                    remember(state_path, batch['uid'], 'emitted')
                else:
                    out.write(line + '\n')
                    out.flush()
                    remember(state_path, batch['uid'], 'emitted')
                emitted += 1
                err.write(f'groups: emitted {batch["uid"]} ({len(batch["episodes"])} episodes, {len(batch["batch"]["uid"])} rows)\n')
                if emitted >= max_groups:
                    reader.stop()
            elif isinstance(ev, GroupIncomplete):
                remember(state_path, ev.uid, 'incomplete')
                err.write(f'groups: gave up on {ev.uid}: {ev.episodes} of {group_size} episodes after {round(ev.waited_ms)} ms\n')
            elif isinstance(ev, EpisodeLate):
                err.write(f'groups: ignored episode {ev.rollout_id}/{ev.attempt_id}: group {ev.uid} is already emitted or full\n')
            elif isinstance(ev, EpisodeUngrouped):
                err.write(f'groups: episode {ev.rollout_id}/{ev.attempt_id} has no group_id; skipped\n')
            elif isinstance(ev, EpisodeNotExported):
                other = 'transitions' if ev.rows == 'trajectories' else 'trajectories'
                err.write(f'groups: episode {ev.rollout_id}/{ev.attempt_id} has no exported {ev.rows} (exporters.records is {other}); '
                          f'use --rows {other} or export {ev.rows}\n')
            elif isinstance(ev, TransitionsOrphaned):
                err.write(f'groups: dropped {ev.transitions} {ev.records} whose episode never arrived\n')
            elif isinstance(ev, DeltaUnresolved):
                err.write(f'groups: transition {ev.transition_id} has a prompt delta that cannot be made whole ({ev.reason}); its row is left out\n')
            elif isinstance(ev, SourceEvent) and ev.kind == 'kafka_unreachable':
                err.write(f'groups: {ev.message}\n')
                err.flush()
                return 1
            elif isinstance(ev, SourceEvent):
                err.write(f'groups: {ev.message}\n')
            err.flush()
        pending = reader.pipeline.groups.pending_groups
        if source.exhausted() and pending:
            err.write(f'groups: {pending} groups still incomplete at the end of {data_dir}\n')
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        source.close()
        kafka_log.removeHandler(handler)
        kafka_log.propagate = True
        if producer is not None:
            producer.flush(30)
    return 0


def _kafka_source(opts: dict[str, Any], env: dict[str, str], brokers: list[str], rows: str, settings: dict[str, str], timeout_ms: float) -> KafkaSource:
    return KafkaSource(
        brokers,
        opts.get('--group-id', 'lightning-groups'),
        topic=opts.get('--topic') or env.get('LIGHTNING_KAFKA_TOPIC') or DEFAULT_TOPIC,
        episodes_topic=opts.get('--episodes-topic') or env.get('LIGHTNING_KAFKA_EPISODES_TOPIC') or DEFAULT_EPISODES_TOPIC,
        trajectories_topic=opts.get('--trajectories-topic') or env.get('LIGHTNING_KAFKA_TRAJECTORIES_TOPIC') or DEFAULT_TRAJECTORIES_TOPIC,
        records=rows,
        settings=settings,
        chunk_timeout_ms=timeout_ms,
        # Brokers that cannot be reached end the command (exit 1), as the Node `groups` does.
        give_up_s=float(env.get('LIGHTNING_KAFKA_GIVE_UP_MS', '30000')) / 1000,
    )


def _producer(brokers: list[str], settings: dict[str, str]) -> Any:
    from confluent_kafka import Producer

    return Producer({'bootstrap.servers': ','.join(brokers), 'enable.idempotence': True, 'acks': 'all', **settings})


def _send(producer: Any, topic: str, key: str, value: str) -> None:
    failures: list[Any] = []
    producer.produce(topic, key=key.encode('utf-8'), value=value.encode('utf-8'), on_delivery=lambda e, _m: e and failures.append(e))
    if producer.flush(30) != 0 or failures:
        raise RuntimeError(f'groups: could not send group {key} to {topic}: {failures[0] if failures else "timed out"}')


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ('-h', '--help'):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] != 'groups':
        sys.stderr.write(f'unknown command {argv[0]!r}\n{USAGE}')
        return 2
    return run_groups(argv[1:], sys.stdout, sys.stderr)
