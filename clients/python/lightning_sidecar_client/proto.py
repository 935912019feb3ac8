"""The protobuf classes for ``lightning.v1`` records, generated from ``proto/`` by protoc.

Nothing here is hand-written protobuf: in a clone of the repository the classes are generated on
first use into a temporary directory from ``proto/lightning/v1/records.proto``; an installed
package carries ``_generated/records_pb2.py``, written by the build (setup.py). Only protobuf
records need this; a JSON-only consumer never imports protobuf.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

PROTO_RELATIVE = Path('lightning') / 'v1' / 'records.proto'

_lock = threading.Lock()
_module: ModuleType | None = None


class ProtoUnavailableError(RuntimeError):
    code = 'PROTO_UNAVAILABLE'


def proto_dir() -> Path | None:
    """The ``proto/`` root: ``$LIGHTNING_PROTO_DIR``, else the repository's, found from this file."""
    env = os.environ.get('LIGHTNING_PROTO_DIR')
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [p / 'proto' for p in here.parents]
    for c in candidates:
        if (c / PROTO_RELATIVE).is_file():
            return c
    return None


def generate(out_dir: Path, root: Path | None = None) -> Path:
    """Runs protoc on records.proto into ``out_dir``; returns the generated file's path."""
    root = root or proto_dir()
    if root is None:
        raise ProtoUnavailableError('protobuf: records.proto not found (set LIGHTNING_PROTO_DIR to the repository\'s proto/ directory)')
    protoc = shutil.which('protoc')
    if protoc is None:
        raise ProtoUnavailableError('protobuf: protoc is not installed (Debian: protobuf-compiler), and the package has no generated records_pb2')
    out_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([protoc, f'--proto_path={root}', f'--python_out={out_dir}', str(PROTO_RELATIVE)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ProtoUnavailableError(f'protobuf: protoc failed: {done.stderr.strip()}')
    return out_dir / PROTO_RELATIVE.with_name('records_pb2.py')


def records_pb2() -> ModuleType:
    """The generated module (``Transition``, ``Episode``, ...), loaded once per process.

    Generated afresh from ``proto/`` when the source and protoc are at hand (so a clone never uses
    stale classes), else the copy the build put into the package.
    """
    global _module
    with _lock:
        if _module is not None:
            return _module
        try:
            importlib.import_module('google.protobuf')
        except ImportError as e:
            raise ProtoUnavailableError('protobuf: the protobuf runtime is not installed (Debian: python3-protobuf; PyPI: protobuf)') from e
        root = proto_dir()
        if root is None or shutil.which('protoc') is None:
            try:
                _module = importlib.import_module('lightning_sidecar_client._generated.records_pb2')
                return _module
            except ImportError:
                pass
        tmp = Path(tempfile.mkdtemp(prefix='lightning-proto-'))
        try:
            generated = generate(tmp, root)
            name = 'lightning_sidecar_client._records_pb2'
            spec = importlib.util.spec_from_file_location(name, generated)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _module = module
        return module
