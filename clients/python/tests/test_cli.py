import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_sidecar_client import js_json
from lightning_sidecar_client.cli import run_groups
from lightning_sidecar_client.files import FileSource
from lightning_sidecar_client.readers import GroupReader
from factories import JSON_HEADERS, rollout, trajectory_rollout

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def data_dir(tmp_path, rollouts):
    (tmp_path / 'transitions').mkdir(parents=True, exist_ok=True)
    (tmp_path / 'episodes').mkdir(parents=True, exist_ok=True)
    with open(tmp_path / 'transitions' / 't.ndjson', 'a') as ft, open(tmp_path / 'episodes' / 'e.ndjson', 'a') as fe:
        for ts, e in rollouts:
            ft.write(''.join(json.dumps(t) + '\n' for t in ts))
            fe.write(json.dumps(e) + '\n')
    return tmp_path


def trajectories_dir(tmp_path, rollouts):
    """A data directory from a sidecar exporting trajectories only (``trajectory_rollout`` results)."""
    for sub in ('trajectories', 'episodes'):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    with open(tmp_path / 'trajectories' / 't.ndjson', 'a') as fj, open(tmp_path / 'episodes' / 'e.ndjson', 'a') as fe:
        for _, trs, e in rollouts:
            fj.write(''.join(json.dumps(t) + '\n' for t in trs))
            fe.write(json.dumps(dict(e, exported=['trajectories'])) + '\n')
    return tmp_path


def run(args, env=None):
    out, err = io.StringIO(), io.StringIO()
    code = run_groups(args, out, err, env or {})
    return code, out.getvalue(), err.getvalue()


def test_group_lines_are_the_json_of_the_groups_byte_for_byte_and_each_is_written_once(tmp_path):
    d = data_dir(tmp_path / 'data', [rollout('a', 2, group_id='g', final_reward=1), rollout('b', 1, group_id='g', final_reward=0.5),
                                      rollout('c', 1, group_id='h', final_reward=1)])
    out = tmp_path / 'groups.jsonl'
    code, stdout, err = run(['--group-size', '2', '--rows', 'transitions', '--data-dir', str(d), '--out', str(out)])
    assert (code, stdout) == (0, '')
    assert err == 'groups: emitted g (2 episodes, 3 rows)\ngroups: 1 groups still incomplete at the end of ' + str(d) + '\n'
    [line] = out.read_text().splitlines()
    [g] = list(GroupReader(FileSource(d, records='transitions'), 2, rows='transitions'))
    assert line == js_json.dumps(g)
    # h completes later; a second run reads everything again but writes only h.
    with open(d / 'transitions' / 't.ndjson', 'a') as f, open(d / 'episodes' / 'e.ndjson', 'a') as fe:
        ts, e = rollout('d', 1, group_id='h', final_reward=0)
        f.write(json.dumps(ts[0]) + '\n')
        fe.write(json.dumps(e) + '\n')
    code, _, err = run(['--group-size', '2', '--rows', 'transitions', '--data-dir', str(d), '--out', str(out)])
    assert code == 0 and err == 'groups: ignored episode a/0: group g is already emitted or full\ngroups: ignored episode b/0: group g is already emitted or full\ngroups: emitted h (2 episodes, 2 rows)\n'
    assert [json.loads(line)['uid'] for line in out.read_text().splitlines()] == ['g', 'h']


def test_without_out_lines_go_to_stdout_and_emitted_groups_to_the_state_file(tmp_path):
    d = data_dir(tmp_path / 'data', [rollout('a', 1, group_id='g', final_reward=1)])
    state = tmp_path / 'state'
    code, stdout, _ = run(['--group-size', '1', '--rows', 'transitions', '--data-dir', str(d), '--state', str(state)])
    assert code == 0 and json.loads(stdout)['uid'] == 'g'
    assert [(o['uid'], o['status']) for o in map(json.loads, state.read_text().splitlines())] == [('g', 'emitted')]
    assert run(['--group-size', '1', '--rows', 'transitions', '--data-dir', str(d), '--state', str(state)])[1] == ''


def test_usage_errors_exit_2_with_the_reason():
    assert run([])[0] == 2 and 'groups: --group-size N is required (a positive integer)' in run([])[2]
    assert run(['--group-size', '0', '--brokers', 'b:1'])[0] == 2
    code, _, err = run(['--group-size', '2'])
    assert code == 2 and err == 'groups: no brokers (use --brokers host:port or LIGHTNING_KAFKA_BROKERS)\n'
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '--bogus'])
    assert code == 2 and err.startswith("groups: unknown option '--bogus'")
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '-X', 'novalue'])
    assert code == 2 and err.startswith("groups: -X takes property=value")


def test_the_module_runs_as_a_command():
    done = subprocess.run([sys.executable, '-m', 'lightning_sidecar_client', 'groups', '--help'], cwd=PACKAGE_ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith('usage: python3 -m lightning_sidecar_client groups')
    done = subprocess.run([sys.executable, '-m', 'lightning_sidecar_client', 'nope'], cwd=PACKAGE_ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "unknown command 'nope'" in done.stderr


def test_brokers_that_cannot_be_reached_end_the_command_with_one_clear_line_and_exit_1():
    import socket

    # A port nothing listens on: bound, then closed.
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    code, _, err = run(['--group-size', '2', '--brokers', f'127.0.0.1:{port}', '--group-id', 'gone'], {'LIGHTNING_KAFKA_GIVE_UP_MS': '1500'})
    assert code == 1
    assert f'groups: gave up on Kafka at 127.0.0.1:{port} after ' in err
    assert 'Connection refused' in err


def test_trajectory_rows_are_the_default_and_written_as_the_reader_builds_them(tmp_path):
    d = trajectories_dir(tmp_path / 'data', [trajectory_rollout('a', 3, group_id='g', final_reward=1),
                                             trajectory_rollout('b', 2, group_id='g', final_reward=0, base=300)])
    out = tmp_path / 'groups.jsonl'
    code, stdout, err = run(['--group-size', '2', '--data-dir', str(d), '--out', str(out)])
    assert (code, stdout, err) == (0, '', 'groups: emitted g (2 episodes, 2 rows)\n')
    [line] = out.read_text().splitlines()
    [g] = list(GroupReader(FileSource(d), 2))
    assert line == js_json.dumps(g) and g['rows'] == 'trajectories'
    assert run(['--group-size', '2', '--rows', 'trajectories', '--data-dir', str(d), '--out', str(tmp_path / 'again.jsonl')])[2] == err
    assert (tmp_path / 'again.jsonl').read_text() == out.read_text()


def test_episodes_without_the_rows_kind_are_reported_once_each_with_the_way_out(tmp_path):
    old = data_dir(tmp_path / 'old', [rollout('a', 1, group_id='g', final_reward=1), rollout('b', 1, group_id='g', final_reward=0)])
    code, stdout, err = run(['--group-size', '2', '--data-dir', str(old)])
    assert (code, stdout) == (0, '')
    assert err == ('groups: episode a/0 has no exported trajectories (exporters.records is transitions); use --rows transitions or export trajectories\n'
                   'groups: episode b/0 has no exported trajectories (exporters.records is transitions); use --rows transitions or export trajectories\n'
                   'groups: emitted no group: 2 episodes read in 1 groups, none complete (--group-size 2)\n')
    new = trajectories_dir(tmp_path / 'new', [trajectory_rollout('c', 1, group_id='h', final_reward=1)])
    code, _, err = run(['--group-size', '1', '--rows', 'transitions', '--data-dir', str(new), '--state', str(tmp_path / 'state')])
    assert code == 0
    assert err == ('groups: episode c/0 has no exported transitions (exporters.records is trajectories); use --rows trajectories or export transitions\n'
                   'groups: emitted no group: 1 episodes read in 1 groups, none complete (--group-size 1)\n')


def test_trajectories_whose_episode_never_arrives_are_reported_as_trajectories(tmp_path):
    d = trajectories_dir(tmp_path / 'data', [trajectory_rollout('a', 1, group_id='g', final_reward=1)])
    (d / 'episodes' / 'e.ndjson').write_text('')
    code, _, err = run(['--group-size', '1', '--data-dir', str(d), '--follow', '--idle-exit-ms', '400', '--group-timeout-ms', '100',
                        '--state', str(tmp_path / 'state')])
    assert code == 0 and err == 'groups: dropped 1 trajectories whose episode never arrived\ngroups: emitted no group: no episodes read\n'


def test_rows_and_topic_options_are_checked():
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '--rows', 'calls'])
    assert code == 2 and err.startswith("groups: --rows must be trajectories or transitions, not 'calls'")
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '--trajectories-topic', 'lightning.episodes'])
    assert code == 2 and err == 'groups: kafka: each kind of record needs its own topic (trajectories: lightning.episodes, episodes: lightning.episodes)\n'
    # Several consumers in one group need an eager assignor (range by default).
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '-X', 'partition.assignment.strategy=cooperative-sticky'])
    assert code == 2 and err.startswith('groups: kafka: partition.assignment.strategy cooperative-sticky is not supported: a rebalance must read')


# --- What a run says about its state file, and why it emitted nothing -------------------------

STATE_LINE = ('groups: state file {path} lists {n} groups already emitted and {m} given up on; they are not emitted again '
              '(delete it or pass --state FILE to start over)\n')


def two_groups(tmp_path):
    """Group g complete (2 episodes), group h with 1 of 2."""
    return trajectories_dir(tmp_path / 'data', [trajectory_rollout('a', 2, group_id='g', final_reward=1),
                                                trajectory_rollout('b', 1, group_id='g', final_reward=0, base=300),
                                                trajectory_rollout('c', 1, group_id='h', final_reward=1, base=500)])


def test_a_second_run_says_what_the_state_file_lists_and_why_it_emitted_nothing(tmp_path):
    d = two_groups(tmp_path)
    state = str(tmp_path / 'groups.state')
    code, stdout, err = run(['--group-size', '2', '--data-dir', str(d), '--state', state])
    assert code == 0 and json.loads(stdout)['uid'] == 'g'
    assert err == f'groups: emitted g (2 episodes, 2 rows)\ngroups: 1 groups still incomplete at the end of {d}\n'
    code, stdout, err = run(['--group-size', '2', '--data-dir', str(d), '--state', state])
    assert (code, stdout) == (0, '')
    assert err.splitlines(keepends=True) == [
        STATE_LINE.format(path=state, n=1, m=0),
        'groups: ignored episode a/0: group g is already emitted or full\n',
        'groups: ignored episode b/0: group g is already emitted or full\n',
        f'groups: 1 groups still incomplete at the end of {d}\n',
        f'groups: emitted no group: 1 complete groups were already emitted (listed in {state})\n',
    ]


def test_groups_given_up_on_are_counted_apart_and_a_group_listed_twice_once(tmp_path):
    d = two_groups(tmp_path)
    state = tmp_path / 'groups.state'
    state.write_text('{"uid":"g","status":"emitted","at":"x"}\n{"uid":"g","status":"emitted","at":"y"}\n'
                     '{"uid":"h","status":"incomplete","at":"x"}\n{"uid":"k","status":"incomplete","at":"x"}\n{"uid":"torn')
    code, _, err = run(['--group-size', '2', '--data-dir', str(d), '--state', str(state)])
    assert code == 0
    assert err.startswith(STATE_LINE.format(path=state, n=1, m=2))
    assert err.endswith(f'groups: emitted no group: 1 complete groups were already emitted (listed in {state})\n')


def test_the_default_state_file_is_lightning_groups_state_in_the_working_directory(tmp_path, monkeypatch):
    d = two_groups(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert run(['--group-size', '2', '--data-dir', str(d)])[0] == 0
    assert [json.loads(line)['uid'] for line in (tmp_path / 'lightning-groups.state').read_text().splitlines()] == ['g']
    code, _, err = run(['--group-size', '2', '--data-dir', str(d)])
    assert code == 0 and err.startswith(STATE_LINE.format(path='lightning-groups.state', n=1, m=0))
    assert err.endswith('groups: emitted no group: 1 complete groups were already emitted (listed in lightning-groups.state)\n')


def test_with_out_the_groups_are_listed_in_the_output_file_and_given_up_ones_in_out_state(tmp_path):
    d = two_groups(tmp_path)
    out = str(tmp_path / 'groups.jsonl')
    args = ['--group-size', '2', '--data-dir', str(d), '--out', out, '--follow', '--idle-exit-ms', '300', '--group-timeout-ms', '100']
    code, _, err = run(args)
    assert code == 0 and 'groups: emitted g (2 episodes, 2 rows)\n' in err and 'groups: gave up on h: 1 of 2 episodes' in err
    code, _, err = run(args)
    assert code == 0
    assert err.startswith(STATE_LINE.format(path=f'{out}.state', n=0, m=1))
    assert err.endswith(f'groups: emitted no group: 1 complete groups were already emitted (listed in {out})\n')
    assert len((tmp_path / 'groups.jsonl').read_text().splitlines()) == 1


def test_a_run_without_a_complete_group_says_how_many_episodes_it_read(tmp_path):
    d = trajectories_dir(tmp_path / 'data', [trajectory_rollout('a', 1, group_id='g', final_reward=1),
                                             trajectory_rollout('b', 1, group_id='h', final_reward=1, base=300),
                                             trajectory_rollout('c', 1, group_id='h', final_reward=1, base=500)])
    code, stdout, err = run(['--group-size', '3', '--data-dir', str(d), '--state', str(tmp_path / 'state')])
    assert (code, stdout) == (0, '')
    assert err == f'groups: 2 groups still incomplete at the end of {d}\ngroups: emitted no group: 3 episodes read in 2 groups, none complete (--group-size 3)\n'
    assert not (tmp_path / 'state').exists()


def test_a_run_that_reads_no_episode_says_so(tmp_path):
    (tmp_path / 'data').mkdir()
    code, stdout, err = run(['--group-size', '2', '--data-dir', str(tmp_path / 'data'), '--state', str(tmp_path / 'state')])
    assert (code, stdout, err) == (0, '', 'groups: emitted no group: no episodes read\n')


# --- Errors: one line, an exit code ------------------------------------------------------------

def test_usage_errors_are_one_line_naming_what_was_typed(tmp_path):
    for args, line in [
        (['--group-size', '2', '--brokers', 'b:1', '--bogus'], "groups: unknown option '--bogus' (groups --help lists the options)"),
        (['--group-size', 'two', '--brokers', 'b:1'], "groups: --group-size N is required (a positive integer), not 'two'"),
        (['--group-size', '2', '--brokers', 'b:1', '--idle-exit-ms', 'soon'], "groups: --idle-exit-ms must be a number, not 'soon'"),
        (['--group-size', '2', '--brokers', 'b:1', '--out', 'o', '--to-topic', 't'], 'groups: --out and --to-topic exclude each other'),
        (['--group-size', '2', '--data-dir', str(tmp_path), '--follow', '--until-end'],
         'groups: --until-end and --follow exclude each other (--data-dir without --follow is read to its end)'),
        (['--group-size', '2', '--data-dir', str(tmp_path / 'nope')],
         f"groups: --data-dir {tmp_path / 'nope'} is not a directory (give the file exporter's data directory, or --follow to wait for it)"),
    ]:
        assert run(args) == (2, '', line + '\n'), args
    # Help wins over anything else on the line.
    code, stdout, err = run(['--bogus', '--help'])
    assert code == 0 and stdout.startswith('usage: ') and err == ''


def block_import(monkeypatch, *names):
    """Makes ``import name`` fail as it does where the package is not installed."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def test_kafka_without_confluent_kafka_is_one_line_naming_the_kafka_extra(tmp_path, monkeypatch):
    block_import(monkeypatch, 'confluent_kafka')
    extra = "needs the Kafka extra (confluent-kafka): pip install './clients/python[kafka]'\n"
    assert run(['--group-size', '2', '--brokers', '127.0.0.1:1']) == (2, '', f'groups: --brokers {extra}')
    assert run(['--group-size', '2'], {'LIGHTNING_KAFKA_BROKERS': '127.0.0.1:1'}) == (
        2, '', f'groups: reading Kafka (LIGHTNING_KAFKA_BROKERS is set) {extra}')
    (tmp_path / 'data').mkdir()
    assert run(['--group-size', '2', '--data-dir', str(tmp_path / 'data'), '--brokers', 'b:1', '--to-topic', 't']) == (2, '', f'groups: --to-topic {extra}')
    # Files need no Kafka client.
    assert run(['--group-size', '2', '--data-dir', str(tmp_path / 'data'), '--state', str(tmp_path / 'state')])[0] == 0


def test_the_command_without_confluent_kafka_prints_no_traceback(tmp_path):
    # A confluent_kafka that cannot be imported, ahead of any installed one.
    (tmp_path / 'blocked' / 'confluent_kafka').mkdir(parents=True)
    (tmp_path / 'blocked' / 'confluent_kafka' / '__init__.py').write_text("raise ImportError('no confluent_kafka here')\n")
    env = {'PATH': os.environ.get('PATH', ''), 'PYTHONPATH': f"{tmp_path / 'blocked'}{os.pathsep}{PACKAGE_ROOT}"}
    done = subprocess.run([sys.executable, '-m', 'lightning_sidecar_client', 'groups', '--group-size', '2', '--brokers', '127.0.0.1:1'],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, '')
    assert done.stderr == "groups: --brokers needs the Kafka extra (confluent-kafka): pip install './clients/python[kafka]'\n"


def test_protobuf_records_without_the_protobuf_runtime_end_the_command_with_one_line_and_no_commit_past_them(monkeypatch):
    pytest.importorskip('confluent_kafka')
    from factories import PROTO_HEADERS, encode_trajectory_pb
    from test_readers import FakeConsumer, source
    from lightning_sidecar_client import cli, proto

    _, [t], e = trajectory_rollout('a', 1, group_id='g', final_reward=1)
    consumer = FakeConsumer({('lightning.trajectories', 0): [(PROTO_HEADERS, encode_trajectory_pb(t))],
                             ('lightning.episodes', 0): [(JSON_HEADERS, json.dumps(dict(e, exported=['trajectories'])).encode())]})
    monkeypatch.setattr(cli, '_kafka_source', lambda *a: source(consumer, records='trajectories'))
    monkeypatch.setattr(proto, '_module', None)
    block_import(monkeypatch, 'google.protobuf', 'google')
    code, stdout, err = run(['--group-size', '1', '--brokers', 'b:1', '--state', os.devnull])
    assert (code, stdout) == (2, '')
    assert err == "groups: protobuf records need the protobuf extra (the protobuf runtime): pip install './clients/python[protobuf]'\n"
    # The record is not skipped as undecodable: a run with the runtime reads it again.
    assert consumer.committed.get(('lightning.trajectories', 0), 0) == 0 and consumer.closed


def test_an_unexpected_error_is_one_line_unless_lightning_debug_asks_for_the_traceback(tmp_path, monkeypatch):
    (tmp_path / 'data').mkdir()

    def broken(self, timeout_s=0):
        raise KeyError('boom')

    monkeypatch.setattr(FileSource, 'poll', broken)
    args = ['--group-size', '2', '--data-dir', str(tmp_path / 'data'), '--state', str(tmp_path / 'state')]
    assert run(args) == (1, '', "groups: unexpected error: KeyError: 'boom' (LIGHTNING_DEBUG=1 prints the traceback)\n")
    with pytest.raises(KeyError):
        run(args, {'LIGHTNING_DEBUG': '1'})


def test_a_file_that_cannot_be_written_is_named(tmp_path):
    d = two_groups(tmp_path)
    state = tmp_path / 'no-such-dir' / 'state'
    code, stdout, err = run(['--group-size', '2', '--data-dir', str(d), '--state', str(state)])
    assert code == 1 and err.endswith(f'groups: {state}: No such file or directory\n')


def test_the_command_line_itself_errs_in_one_line(tmp_path):
    env = {'PATH': os.environ.get('PATH', ''), 'PYTHONPATH': str(PACKAGE_ROOT)}
    for args, line in [([], 'lightning-sidecar-client: no command given (the command is groups; --help lists its options)\n'),
                       (['nope'], "lightning-sidecar-client: unknown command 'nope' (the command is groups; --help lists its options)\n")]:
        done = subprocess.run([sys.executable, '-m', 'lightning_sidecar_client', *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert (done.returncode, done.stdout, done.stderr) == (2, '', line)


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    d = two_groups(tmp_path)
    env = {'PATH': os.environ.get('PATH', ''), 'PYTHONPATH': str(PACKAGE_ROOT)}
    p = subprocess.Popen([sys.executable, '-m', 'lightning_sidecar_client', 'groups', '--group-size', '2', '--data-dir', str(d)],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before the group line is written
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and 'Traceback' not in err and 'BrokenPipe' not in err
