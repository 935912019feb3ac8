"""A trajectory's routed experts (MoE routing replay, "R3") as arrays.

A trajectory whose calls returned routing (vLLM started with ``--enable-return-routed-experts``)
carries, after ``logprobs`` (docs/output-contract.md#routed-experts)::

    "routed_experts": {"dtype": "uint8", "shape": [rows, layers, top_k], "data": "<base64>", "missing": [[start, end], ...]},
    "routing_coverage": 0.97, "routing_complete": false

``rows`` is ``len(token_ids) - 1``: row ``i`` is the forward pass over position ``i`` (it chose the
experts that produced the logits of the token at ``i + 1``); the last token has none. ``data`` is
base64 of the values, little-endian, C order; ``missing`` lists position ranges ``[start, end)``
with no row (their values are 0). ``routing_complete`` false means the routing must not be
replayed for this trajectory (drop it, or let the live router decide).

The same dict comes from JSON and protobuf records (``records.decode_trajectory``). numpy is
needed here (``routed_experts_array``, ``routing_missing_mask``); ``routed_experts_values`` is the
plain-Python form ``tensors.to_verl_batch`` uses without it.
"""
from __future__ import annotations

import base64
import struct
from typing import Any, Mapping, Optional

#: The dtypes a trajectory's ``routed_experts`` may name: numpy's little-endian type, struct's code.
DTYPES = {'uint8': ('<u1', 'B'), 'int16': ('<i2', 'h'), 'uint16': ('<u2', 'H'), 'int32': ('<i4', 'i')}


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise ImportError('routed experts as arrays need numpy (pip install numpy)') from None
    return numpy


def routed_experts_of(record: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The ``routed_experts`` member of a trajectory (or that member itself); None when absent."""
    if 'dtype' in record and 'shape' in record and 'data' in record:
        return record
    return record.get('routed_experts')


def _checked(r: Mapping[str, Any]) -> tuple[tuple[int, int, int], str, str, bytes]:
    dtype = r['dtype']
    if dtype not in DTYPES:
        raise ValueError(f'routed_experts: dtype {dtype!r} is not one of {", ".join(DTYPES)}')
    shape = tuple(int(x) for x in r['shape'])
    if len(shape) != 3 or min(shape) < 0:
        raise ValueError(f'routed_experts: shape {list(r["shape"])} is not [rows, layers, top_k]')
    data = base64.b64decode(r['data'])
    np_type, code = DTYPES[dtype]
    size = struct.calcsize('<' + code)
    if len(data) != shape[0] * shape[1] * shape[2] * size:
        raise ValueError(f'routed_experts: {len(data)} bytes of data for shape {list(shape)} of {dtype}')
    return shape, np_type, code, data  # type: ignore[return-value]


def routed_experts_array(trajectory: Mapping[str, Any]) -> Any:
    """The routed experts as a numpy array ``[rows, layers, top_k]`` of the dtype named (native byte
    order, writable); None when the trajectory has no ``routed_experts``. Rows of ``missing``
    positions hold 0 (see ``routing_missing_mask``)."""
    r = routed_experts_of(trajectory)
    if r is None:
        return None
    np = _numpy()
    shape, np_type, _, data = _checked(r)
    return np.frombuffer(data, dtype=np.dtype(np_type)).reshape(shape).astype(np.dtype(r['dtype']))


def routing_missing_mask(trajectory: Mapping[str, Any]) -> Any:
    """A numpy bool array ``[rows]``, True on the rows no call gave (``missing``); None when the
    trajectory has no ``routed_experts``."""
    r = routed_experts_of(trajectory)
    if r is None:
        return None
    np = _numpy()
    rows = int(r['shape'][0])
    mask = np.zeros(rows, dtype=bool)
    for start, end in r.get('missing') or []:
        mask[max(0, int(start)):min(rows, int(end))] = True
    return mask


def routed_experts_values(r: Mapping[str, Any]) -> tuple[tuple[int, int, int], list[int]]:
    """Without numpy: the shape and the values, flat, C order (``r`` is a ``routed_experts`` dict)."""
    shape, _, code, data = _checked(r)
    n = shape[0] * shape[1] * shape[2]
    return shape, list(struct.unpack(f'<{n}{code}', data))


def missing_rows(r: Mapping[str, Any]) -> set[int]:
    """The row indexes ``missing`` covers (``r`` is a ``routed_experts`` dict)."""
    rows = int(r['shape'][0])
    return {i for start, end in r.get('missing') or [] for i in range(max(0, int(start)), min(rows, int(end)))}
