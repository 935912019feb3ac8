"""Writes lightning_sidecar_client/_records_pb2.py: protoc's Python classes for proto/lightning/v1/records.proto.

The generated module is committed so that installing the package needs no protoc. Run this after
changing records.proto (tests/test_proto.py fails while the committed file is stale):

    python3 clients/python/tools/regen_proto.py

Use Debian bookworm's protoc (3.21, package protobuf-compiler): its output loads in every protobuf
runtime from 3.20 on, while a newer protoc's output demands a runtime at least as new.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CLIENT = Path(__file__).resolve().parent.parent
PROTO_ROOT = CLIENT.parent.parent / 'proto'
SOURCE = 'lightning/v1/records.proto'
TARGET = CLIENT / 'lightning_sidecar_client' / '_records_pb2.py'


def generate(proto_root: Path = PROTO_ROOT, protoc: str | None = None) -> bytes:
    """What protoc writes for records.proto now."""
    protoc = protoc or shutil.which('protoc')
    if protoc is None:
        raise RuntimeError('protoc is not installed (Debian: apt-get install protobuf-compiler)')
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([protoc, f'--proto_path={proto_root}', f'--python_out={out}', SOURCE], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f'protoc failed: {done.stderr.strip()}')
        return (Path(out) / SOURCE).with_name('records_pb2.py').read_bytes()


def descriptor(module_source: bytes) -> bytes:
    """The serialized FileDescriptorProto a generated module registers: what it defines, whichever
    protoc version wrote the code around it."""
    for node in ast.walk(ast.parse(module_source)):
        if isinstance(node, ast.Call) and getattr(node.func, 'attr', None) == 'AddSerializedFile':
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, bytes):
                return arg.value
    raise ValueError('no AddSerializedFile(...) call in the generated module')


def main() -> int:
    try:
        TARGET.write_bytes(generate())
    except RuntimeError as e:
        sys.stderr.write(f'regen_proto: {e}\n')
        return 1
    sys.stderr.write(f'regen_proto: wrote {TARGET}\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
