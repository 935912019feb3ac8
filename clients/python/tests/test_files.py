import json

from lightning_sidecar_client import iter_groups, iter_trajectories, iter_transitions
from lightning_sidecar_client.files import FileSource
from lightning_sidecar_client.readers import GroupReader, RecordReader
from factories import as_delta, rollout, trajectory_rollout


def write(path, records, tail=''):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, 'a') as f:
        f.write(''.join(json.dumps(r) + '\n' for r in records) + tail)


def test_groups_come_from_the_file_exporters_directory_across_rotated_files(tmp_path):
    a, ea = rollout('a', 2, group_id='g', final_reward=1)
    b, eb = rollout('b', 1, group_id='g', final_reward=0)
    write(tmp_path / 'transitions' / 'transitions-20250101T000000-1-0001.ndjson', a)
    write(tmp_path / 'transitions' / 'transitions-20250101T000000-1-0002.ndjson', b)
    write(tmp_path / 'episodes' / 'episodes-20250101T000000-1-0001.ndjson', [ea, eb])
    [g] = list(GroupReader(FileSource(tmp_path, records='transitions'), 2, rows='transitions'))
    assert g['batch']['transition_id'] == ['a/0/0', 'a/0/1', 'b/0/0']
    assert g['batch']['prompt_ids'] == [t['prompt_token_ids'] for t in a + b]


def test_prompt_deltas_in_the_files_are_made_whole_across_rotated_files(tmp_path):
    # exporters.file.prompt_ids: delta; the previous transition may be in an earlier file.
    a, ea = rollout('a', 3, group_id='g', final_reward=1)
    write(tmp_path / 'transitions' / 'transitions-20250101T000000-1-0001.ndjson', [a[0], as_delta(a[1], a[0])])
    write(tmp_path / 'transitions' / 'transitions-20250101T000000-1-0002.ndjson', [as_delta(a[2], a[1])])
    write(tmp_path / 'episodes' / 'episodes-20250101T000000-1-0001.ndjson', [ea])
    [g] = list(GroupReader(FileSource(tmp_path, records='transitions'), 1, rows='transitions'))
    assert g['batch']['prompt_ids'] == [t['prompt_token_ids'] for t in a]
    assert list(RecordReader(FileSource(tmp_path, records='transitions')).transitions()) == a


def test_following_a_directory_reads_only_whole_lines_and_picks_up_what_is_appended(tmp_path):
    ts, e = rollout('a', 2, group_id=None, final_reward=1)
    path = tmp_path / 'transitions' / 'transitions-1.ndjson'
    half = json.dumps(ts[1])
    write(path, [ts[0]], tail=half[:20])
    src = FileSource(tmp_path, follow=True, records='transitions')
    items, events = src.poll()
    assert [i.record['transition_id'] for i in items] == ['a/0/0'] and events == []
    write(path, [], tail=half[20:] + '\n')
    write(tmp_path / 'episodes' / 'episodes-1.ndjson', [e], tail='{"torn')
    items, _ = src.poll()
    assert [(i.kind, i.record.get('transition_id', i.record.get('rollout_id'))) for i in items] == [('transition', 'a/0/1'), ('episode', 'a')]
    assert not src.exhausted()


def test_an_undecodable_line_is_reported_with_its_place_and_skipped(tmp_path):
    ts, _ = rollout('a', 1, group_id=None, final_reward=1)
    write(tmp_path / 'transitions' / 't.ndjson', [ts[0]], tail='not json\n')
    seen = []
    out = list(RecordReader(FileSource(tmp_path, records='transitions'), on_event=seen.append).transitions())
    assert [t['transition_id'] for t in out] == ['a/0/0']
    assert [ev.kind for ev in seen] == ['undecodable'] and 't.ndjson:2' in seen[0].message


def both_kinds(tmp_path):
    """A data directory from a sidecar exporting both kinds: group g of rollouts a (2 calls) and b (1)."""
    a_ts, a_trs, ea = trajectory_rollout('a', 2, group_id='g', final_reward=1)
    b_ts, b_trs, eb = trajectory_rollout('b', 1, group_id='g', final_reward=0, base=300)
    write(tmp_path / 'transitions' / 'transitions-20250101T000000-1-0001.ndjson', a_ts + b_ts)
    write(tmp_path / 'trajectories' / 'trajectories-20250101T000000-1-0001.ndjson', a_trs)
    write(tmp_path / 'trajectories' / 'trajectories-20250101T000000-1-0002.ndjson', b_trs)
    write(tmp_path / 'episodes' / 'episodes-20250101T000000-1-0001.ndjson', [ea, eb])
    return a_ts + b_ts, a_trs + b_trs


def test_trajectory_groups_come_from_the_trajectories_directory_and_transitions_are_not_read(tmp_path):
    ts, trs = both_kinds(tmp_path)
    items, _ = FileSource(tmp_path).poll()
    assert [i.kind for i in items] == ['trajectory', 'trajectory', 'episode', 'episode']
    [g] = list(GroupReader(FileSource(tmp_path), 2))
    assert g['batch']['trajectory_id'] == ['a/0/s0', 'b/0/s0']
    assert g['batch']['prompt_ids'] == [tr['token_ids'][:tr['prompt_length']] for tr in trs]
    # Per-call rows from the same directory, through the package's entry points.
    [calls] = list(iter_groups(2, data_dir=tmp_path, rows='transitions'))
    assert calls['batch']['transition_id'] == [t['transition_id'] for t in ts]
    assert list(iter_trajectories(data_dir=tmp_path)) == trs
    assert list(iter_transitions(data_dir=tmp_path)) == ts


def test_both_kinds_are_read_transitions_first_then_trajectories_then_episodes(tmp_path):
    both_kinds(tmp_path)
    items, _ = FileSource(tmp_path, records='both').poll()
    assert [i.kind for i in items] == ['transition'] * 3 + ['trajectory'] * 2 + ['episode'] * 2
