"""The protobuf classes of ``lightning.v1`` records, for protobuf records only.

They are protoc's output for ``proto/lightning/v1/records.proto``, committed as ``_records_pb2.py``
(tools/regen_proto.py writes it; a test fails while it differs from what protoc generates), so
neither installing nor running the package needs protoc. The protobuf runtime is the
``protobuf`` extra, imported on the first protobuf record: a JSON-only consumer never needs it.
"""
from __future__ import annotations

import importlib
import threading
from types import ModuleType

#: The install command that brings the runtime, for messages.
PROTOBUF_EXTRA = "pip install './clients/python[protobuf]'"

_lock = threading.Lock()
_module: ModuleType | None = None


class ProtoUnavailableError(RuntimeError):
    code = 'PROTO_UNAVAILABLE'


def records_pb2() -> ModuleType:
    """The generated module (``Transition``, ``Episode``, ``Trajectory``, ...), loaded once per process."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        try:
            importlib.import_module('google.protobuf')
        except ImportError:
            raise ProtoUnavailableError(f'protobuf records need the protobuf extra (the protobuf runtime): {PROTOBUF_EXTRA}') from None
        try:
            _module = importlib.import_module('lightning_sidecar_client._records_pb2')
        except ImportError as e:  # a runtime older than the generated code (3.20 and later load it)
            raise ProtoUnavailableError(f'protobuf records need protobuf>=3.20 ({e}): {PROTOBUF_EXTRA}') from None
        return _module
