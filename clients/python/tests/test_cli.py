import io
import json
import subprocess
import sys
from pathlib import Path

from lightning_sidecar_client import js_json
from lightning_sidecar_client.cli import run_groups
from lightning_sidecar_client.files import FileSource
from lightning_sidecar_client.readers import GroupReader
from factories import rollout, trajectory_rollout

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
                   'groups: episode b/0 has no exported trajectories (exporters.records is transitions); use --rows transitions or export trajectories\n')
    new = trajectories_dir(tmp_path / 'new', [trajectory_rollout('c', 1, group_id='h', final_reward=1)])
    code, _, err = run(['--group-size', '1', '--rows', 'transitions', '--data-dir', str(new), '--state', str(tmp_path / 'state')])
    assert code == 0
    assert err == 'groups: episode c/0 has no exported transitions (exporters.records is trajectories); use --rows trajectories or export transitions\n'


def test_trajectories_whose_episode_never_arrives_are_reported_as_trajectories(tmp_path):
    d = trajectories_dir(tmp_path / 'data', [trajectory_rollout('a', 1, group_id='g', final_reward=1)])
    (d / 'episodes' / 'e.ndjson').write_text('')
    code, _, err = run(['--group-size', '1', '--data-dir', str(d), '--follow', '--idle-exit-ms', '400', '--group-timeout-ms', '100',
                        '--state', str(tmp_path / 'state')])
    assert code == 0 and err == 'groups: dropped 1 trajectories whose episode never arrived\n'


def test_rows_and_topic_options_are_checked():
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '--rows', 'calls'])
    assert code == 2 and err.startswith("groups: --rows must be trajectories or transitions, not 'calls'")
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '--trajectories-topic', 'lightning.episodes'])
    assert code == 2 and err == 'groups: kafka: each kind of record needs its own topic (trajectories: lightning.episodes, episodes: lightning.episodes)\n'
    # Several consumers in one group need an eager assignor (range by default).
    code, _, err = run(['--group-size', '2', '--brokers', 'b:1', '-X', 'partition.assignment.strategy=cooperative-sticky'])
    assert code == 2 and err.startswith('groups: kafka: partition.assignment.strategy cooperative-sticky is not supported: a rebalance must read')
