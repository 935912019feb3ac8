"""The package as pip gets it: the committed protobuf classes are protoc's output for the current
proto/, the build backend needs nothing from an index, and JSON consumers import neither protobuf
nor confluent-kafka. (test/python/packaging.test.ts installs it for real in a fresh venv.)"""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CLIENT / 'tools'))

import build_backend  # noqa: E402
import regen_proto  # noqa: E402

COMMITTED = CLIENT / 'lightning_sidecar_client' / '_records_pb2.py'


def test_the_committed_protobuf_classes_are_what_protoc_generates_from_proto():
    if shutil.which('protoc') is None:
        if os.environ.get('CI'):
            pytest.fail('protoc is not installed (Debian: protobuf-compiler); CI must check the committed classes')
        pytest.skip('protoc is not installed (Debian: protobuf-compiler)')
    fresh = regen_proto.generate()
    # The descriptor is what the module defines; the code around it depends on protoc's version.
    assert regen_proto.descriptor(COMMITTED.read_bytes()) == regen_proto.descriptor(fresh), (
        'lightning_sidecar_client/_records_pb2.py is stale: run python3 clients/python/tools/regen_proto.py')


def test_the_descriptor_is_read_from_the_generated_code():
    assert regen_proto.descriptor(COMMITTED.read_bytes()).startswith(b'\n\x1alightning/v1/records.proto')
    with pytest.raises(ValueError):
        regen_proto.descriptor(b'x = 1\n')


def test_the_build_backend_asks_for_nothing_on_python_3_11_and_later():
    if sys.version_info >= (3, 11):
        assert build_backend.get_requires_for_build_wheel() == [] and build_backend.get_requires_for_build_editable() == []
    with open(CLIENT / 'pyproject.toml', 'rb') as f:
        text = f.read().decode()
    assert 'requires = []' in text and 'build-backend = "build_backend"' in text


def test_the_wheel_holds_the_package_and_its_protobuf_classes_with_kafka_and_protobuf_as_extras(tmp_path):
    name = build_backend.build_wheel(str(tmp_path))
    assert name == 'lightning_sidecar_client-0.1.0-py3-none-any.whl'
    with zipfile.ZipFile(tmp_path / name) as z:
        files = {n: z.read(n) for n in z.namelist()}
    assert 'lightning_sidecar_client/_records_pb2.py' in files and 'lightning_sidecar_client/cli.py' in files
    assert not [n for n in files if '__pycache__' in n or n.endswith('.pyc') or n.startswith('tools/')]
    meta = files['lightning_sidecar_client-0.1.0.dist-info/METADATA'].decode().splitlines()
    requires = [line for line in meta if line.startswith('Requires-Dist:')]
    assert 'Requires-Dist: confluent-kafka>=1.7; extra == "kafka"' in requires
    assert 'Requires-Dist: protobuf>=3.20; extra == "protobuf"' in requires
    assert all('; extra ==' in r for r in requires), 'a plain install must pull in nothing'
    assert files['lightning_sidecar_client-0.1.0.dist-info/entry_points.txt'].decode() == (
        '[console_scripts]\nlightning-sidecar-client = lightning_sidecar_client.cli:main\n')
    # RECORD lists every other file with its hash, as installers check.
    record = files['lightning_sidecar_client-0.1.0.dist-info/RECORD'].decode().splitlines()
    assert len(record) == len(files)
    for line in record:
        path, digest, size = line.rsplit(',', 2)
        if path.endswith('/RECORD'):
            continue
        assert digest == 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b'=').decode()
        assert int(size) == len(files[path])
    # The same sources make the same wheel.
    again = tmp_path / 'again'
    again.mkdir()
    assert (again / build_backend.build_wheel(str(again))).read_bytes() == (tmp_path / name).read_bytes()


def test_the_sdist_builds_the_same_wheel(tmp_path):
    import tarfile

    name = build_backend.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as tar:
        # The 'data' filter where this Python has it (3.12, and later 3.8 to 3.11 releases).
        tar.extractall(tmp_path / 'src', **({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))
    root = tmp_path / 'src' / 'lightning_sidecar_client-0.1.0'
    assert (root / 'PKG-INFO').is_file() and (root / 'tools' / 'build_backend.py').is_file()
    (tmp_path / 'out').mkdir()
    code = ('import sys; sys.path.insert(0, "tools"); import build_backend; print(build_backend.build_wheel(sys.argv[1]))')
    done = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'out')], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / 'out' / done.stdout.strip()).read_bytes() == (tmp_path / build_backend.build_wheel(str(tmp_path))).read_bytes()


def test_json_consumers_need_neither_protobuf_nor_confluent_kafka_and_protobuf_records_name_the_extra(tmp_path):
    from factories import trajectory_rollout
    from test_cli import trajectories_dir

    d = trajectories_dir(tmp_path / 'data', [trajectory_rollout('a', 2, group_id='g', final_reward=1)])
    code = '''
import sys
sys.modules['google'] = sys.modules['google.protobuf'] = sys.modules['confluent_kafka'] = None  # as where they are not installed
import lightning_sidecar_client as lsc
from lightning_sidecar_client.proto import ProtoUnavailableError
from lightning_sidecar_client.records import PROTOBUF, decode_transition
assert decode_transition(b'{"transition_id": "t"}') == {"transition_id": "t"}
[g] = lsc.iter_groups(1, data_dir=sys.argv[1])
print(g["uid"])
try:
    decode_transition(b'', PROTOBUF)
except ProtoUnavailableError as e:  # not a DecodeError: the record is fine, the runtime is missing
    print(e)
'''
    done = subprocess.run([sys.executable, '-c', code, str(d)], cwd=tmp_path, env={'PYTHONPATH': str(CLIENT), 'PATH': os.environ.get('PATH', '')},
                          capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, '')
    assert done.stdout == "g\nprotobuf records need the protobuf extra (the protobuf runtime): pip install './clients/python[protobuf]'\n"
