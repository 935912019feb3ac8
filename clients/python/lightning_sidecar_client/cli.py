"""``python3 -m lightning_sidecar_client groups``: the Node ``lightning-sidecar groups`` command in Python.

Same options, same output lines (``lightning.group.v1`` JSON, byte for byte; one row per
trajectory, or per call with ``--rows transitions``), same state handling:
with ``--out FILE`` the output file itself is the record of emitted groups (each line fsync'd
before offsets move), otherwise ``--state``; groups given up on are noted in the state file.

As the Node command: every error is one line on stderr; exit 2 for a command line that cannot run
(here also a missing extra: the kafka or protobuf one), 1 for a failure while running, 0 done. An
unexpected exception is one line too, unless ``LIGHTNING_DEBUG=1`` asks for its traceback.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any, Optional, TextIO

from . import js_json
from .groups import ROWS, DeltaUnresolved, EpisodeLate, EpisodeNotExported, EpisodeUngrouped, GroupIncomplete, GroupReady, TransitionsOrphaned
from .kafka_source import (DEFAULT_EPISODES_TOPIC, DEFAULT_TOPIC, DEFAULT_TRAJECTORIES_TOPIC, KAFKA_EXTRA, KafkaSource, KafkaUnavailableError,
                           brokers_from_env, confluent_kafka)
from .proto import ProtoUnavailableError
from .readers import GroupReader
from .source import EPISODE, Incoming, SourceEvent
from .state import append_line, load_listed, remember

USAGE = """usage: python3 -m lightning_sidecar_client groups --group-size N [--rows trajectories|transitions] [--brokers H:P,...]
           [--group-id ID] [--out FILE | --to-topic T] [--state FILE] [--group-timeout-ms MS] [--max-groups N]
           [--idle-exit-ms MS] [--until-end] [--trajectories-topic T] [--topic T] [--episodes-topic T] [-X librdkafka.property=value ...]
           [--data-dir DIR [--follow]]
  (installed: lightning-sidecar-client groups ...)
  emit complete GRPO groups (lightning.group.v1) from the trajectories (--rows transitions: transitions)
  and episodes topics, in a Kafka consumer group (or from the file exporter's data directory with --data-dir)
  Groups emitted or given up on are listed in the state file (--state; default OUT.state with --out OUT,
  else ./lightning-groups.state; with --out, OUT lists the emitted ones) and never emitted again.
  --until-end: stop once every assigned partition is read to its end (what --data-dir without --follow does)
  exit codes: 0 done, 1 failed while running, 2 bad command line or a missing extra (kafka, protobuf);
  LIGHTNING_DEBUG=1 prints the traceback of an unexpected error
"""

_VALUED = {'--group-size', '--rows', '--brokers', '--group-id', '--out', '--to-topic', '--state', '--group-timeout-ms', '--max-groups',
           '--idle-exit-ms', '--trajectories-topic', '--topic', '--episodes-topic', '-X', '--data-dir'}
_FLAGS = {'--follow', '--until-end', '--help', '-h'}


class CommandError(Exception):
    """Ends the command with one line on stderr and ``exit_code``."""

    exit_code = 1


class UsageError(CommandError):
    """A command line (or installation) that cannot run: exit 2, nothing read or written."""

    exit_code = 2


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
            raise UsageError(f'groups: unknown option {a!r} (groups --help lists the options)')
    return opts


def _number(opts: dict[str, Any], name: str, default: float) -> float:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f'groups: {name} must be a number, not {raw!r}') from None
    if value < 0:
        raise UsageError(f'groups: {name} must not be negative, not {raw!r}')
    return value


def run_groups(args: list[str], out: TextIO, err: TextIO, env: Optional[dict[str, str]] = None) -> int:
    env = dict(os.environ) if env is None else env
    try:
        return _groups(args, out, err, env)
    except CommandError as e:
        err.write(f'{e}\n')
        return e.exit_code
    except ProtoUnavailableError as e:
        err.write(f'groups: {e}\n')
        return 2
    except BrokenPipeError:
        # The reader of stdout went away (`... | head -1`): not an error of ours, as in the Node CLI.
        return 0
    except Exception as e:
        if env.get('LIGHTNING_DEBUG', '') not in ('', '0'):
            raise
        if isinstance(e, OSError) and e.filename is not None:
            err.write(f'groups: {e.filename}: {e.strerror}\n')
        else:
            err.write(f'groups: unexpected error: {type(e).__name__}: {e} (LIGHTNING_DEBUG=1 prints the traceback)\n')
        return 1


class _Tally:
    """The source, counting the episodes it hands out: what a run that emits nothing says."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.episodes: set[tuple[Any, Any]] = set()
        self.groups: set[str] = set()

    def poll(self, timeout_s: float) -> tuple[list[Incoming], list[SourceEvent]]:
        items, events = self._source.poll(timeout_s)
        for item in items:
            if item.kind == EPISODE and item.record is not None:
                self.episodes.add((item.record.get('rollout_id'), item.record.get('attempt_id')))
                if isinstance(item.record.get('group_id'), str):
                    self.groups.add(item.record['group_id'])
        return items, events

    def __getattr__(self, name: str) -> Any:
        # Everything else (held, bind, records, ...) is the source's, present or absent alike.
        return getattr(self._source, name)


def _groups(args: list[str], out: TextIO, err: TextIO, env: dict[str, str]) -> int:
    if '--help' in args or '-h' in args:  # help wins over any other problem on the line, as in the Node CLI
        out.write(USAGE)
        return 0
    opts = parse(args)
    raw_size = opts.get('--group-size', '')
    if not raw_size.isdigit() or int(raw_size) < 1:
        got = f', not {raw_size!r}' if raw_size else ''
        raise UsageError(f'groups: --group-size N is required (a positive integer){got}')
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

    out_path: Optional[str] = opts.get('--out')
    to_topic: Optional[str] = opts.get('--to-topic')
    if out_path is not None and to_topic is not None:
        raise UsageError('groups: --out and --to-topic exclude each other')
    state_path = opts.get('--state') or (f'{out_path}.state' if out_path else 'lightning-groups.state')
    data_dir = opts.get('--data-dir')
    brokers = opts['--brokers'].split(',') if opts.get('--brokers') else brokers_from_env(env)
    if not brokers and (data_dir is None or to_topic):
        raise UsageError('groups: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS)')
    if data_dir is not None and opts.get('--follow') and opts.get('--until-end'):
        raise UsageError('groups: --until-end and --follow exclude each other (--data-dir without --follow is read to its end)')
    if data_dir is not None and not opts.get('--follow') and not os.path.isdir(data_dir):
        raise UsageError(f"groups: --data-dir {data_dir} is not a directory (give the file exporter's data directory, or --follow to wait for it)")
    if data_dir is None or to_topic:
        try:
            confluent_kafka()
        except KafkaUnavailableError:
            needs = '--to-topic' if data_dir is not None else '--brokers' if opts.get('--brokers') else 'reading Kafka (LIGHTNING_KAFKA_BROKERS is set)'
            raise UsageError(f'groups: {needs} needs the Kafka extra (confluent-kafka): {KAFKA_EXTRA}') from None

    listed = load_listed(state_path)
    emitted_before = {uid for uid, status in listed.items() if status == 'emitted'}
    in_out = set(load_listed(out_path)) if out_path is not None else set()
    if data_dir is not None:
        from .files import FileSource

        source: Any = FileSource(data_dir, follow=bool(opts.get('--follow')), records=rows)
    else:
        try:
            source = _kafka_source(opts, env, brokers, rows, settings, timeout_ms)
        except ValueError as e:  # two kinds of record on one topic, a cooperative assignor
            raise UsageError(f'groups: {e}') from None
    # What earlier runs left, said at the start: a run that then emits nothing is no surprise.
    if listed:
        err.write(f'groups: state file {state_path} lists {len(emitted_before)} groups already emitted and {len(listed) - len(emitted_before)} '
                  'given up on; they are not emitted again (delete it or pass --state FILE to start over)\n')
    tally = _Tally(source)
    kafka_log = logging.getLogger('lightning_sidecar_client.kafka')
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter('groups: kafka: %(message)s'))
    kafka_log.addHandler(handler)
    kafka_log.propagate = False
    previous: dict[Any, Any] = {}
    producer = None
    emitted = 0
    try:
        reader = GroupReader(tally, group_size, rows=rows, timeout_ms=timeout_ms, done=set(listed) | in_out, idle_exit_ms=idle_exit_ms)
        previous = {s: signal.signal(s, lambda *_: reader.stop()) for s in (signal.SIGINT, signal.SIGTERM)}
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
                raise CommandError(f'groups: {ev.message}')
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
    if emitted == 0:
        err.write(f'groups: emitted no group: {_why_none(tally, emitted_before | in_out, in_out, out_path, state_path, group_size)}\n')
    return 0


def _why_none(tally: _Tally, emitted_before: set[str], in_out: set[str], out_path: Optional[str], state_path: str, group_size: int) -> str:
    """Why a run emitted no group, the first reason that applies."""
    again = tally.groups & emitted_before
    if again:
        # Named where they are listed: the output file with --out, else the state file.
        where = out_path if out_path is not None and again & in_out else state_path
        return f'{len(again)} complete groups were already emitted (listed in {where})'
    if tally.episodes:
        return f'{len(tally.episodes)} episodes read in {len(tally.groups)} groups, none complete (--group-size {group_size})'
    return 'no episodes read'


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
        until_end=bool(opts.get('--until-end')),
    )


def _producer(brokers: list[str], settings: dict[str, str]) -> Any:
    return confluent_kafka().Producer({'bootstrap.servers': ','.join(brokers), 'enable.idempotence': True, 'acks': 'all', **settings})


def _send(producer: Any, topic: str, key: str, value: str) -> None:
    failures: list[Any] = []
    producer.produce(topic, key=key.encode('utf-8'), value=value.encode('utf-8'), on_delivery=lambda e, _m: e and failures.append(e))
    if producer.flush(30) != 0 or failures:
        raise CommandError(f'groups: could not send group {key} to {topic}: {failures[0] if failures else "timed out"}')


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ('-h', '--help'):
        sys.stdout.write(USAGE)
        return 0
    if not argv or argv[0] != 'groups':
        what = f'unknown command {argv[0]!r}' if argv else 'no command given'
        sys.stderr.write(f'lightning-sidecar-client: {what} (the command is groups; --help lists its options)\n')
        return 2
    code = run_groups(argv[1:], sys.stdout, sys.stderr)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # Nothing more can reach the reader; keep the interpreter's own flush at exit quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code
