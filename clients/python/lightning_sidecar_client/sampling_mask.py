"""A trajectory's sampling masks (the ids the sampler kept at each sampled position) as arrays.

A trajectory whose calls returned sampling masks (or whose sidecar was asked for them) carries,
after ``weight_versions`` and before ``turns``::

    "sampling_mask": {"offsets": [0, 0, 0, 3, 4, ...], "ids": [5, 6, 7, 8, ...], "missing": [[start, end], ...]},
    "sampling_mask_coverage": 0.97, "sampling_mask_complete": false, "sampling_mask_violations": 0

``offsets`` has ``len(token_ids) + 1`` entries: row ``p``, ``ids[offsets[p]:offsets[p + 1]]``, is
the set of token ids the sampler kept (the top-k / top-p / min-p survivors) when position ``p`` of
``token_ids`` was sampled. Rows are empty where nothing was sampled (loss mask 0: the prompt, tool
output) and at sampled positions whose call returned no mask; ``missing`` lists those sampled
ranges ``[start, end)``. ``sampling_mask_complete`` false means some sampled position has no row,
or some sampled id is not in its row (``sampling_mask_violations`` counts those): do not restrict
that trajectory's logits to its masks without a look.

The same dict comes from JSON and protobuf records (``records.decode_trajectory``). numpy is
needed here; ``sampling_mask_values`` is the checked plain-Python form ``tensors.to_verl_batch``
uses without it.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise ImportError('sampling masks as arrays need numpy (pip install numpy)') from None
    return numpy


def sampling_mask_of(record: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The ``sampling_mask`` member of a trajectory (or that member itself); None when absent."""
    if 'offsets' in record and 'ids' in record:
        return record
    return record.get('sampling_mask')


def _positions(record: Mapping[str, Any]) -> Optional[int]:
    """How many positions the mask must have rows for: ``len(token_ids)`` of a trajectory, None for the member alone."""
    ids = record.get('token_ids')
    return len(ids) if ids is not None and 'sampling_mask' in record else None


def sampling_mask_values(m: Mapping[str, Any], positions: Optional[int] = None) -> tuple[list[int], list[int]]:
    """Without numpy: ``offsets`` and ``ids`` as int lists, checked (``m`` is a ``sampling_mask``
    dict; ``positions``, when given, the number of rows it must have). A malformed mask is a
    ValueError naming what is wrong."""
    offsets = [int(x) for x in m['offsets']]
    ids = [int(x) for x in m['ids']]
    if not offsets or offsets[0] != 0 or offsets[-1] != len(ids) or any(a > b for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f'sampling_mask: offsets do not run from 0 up to the {len(ids)} ids')
    if positions is not None and len(offsets) != positions + 1:
        raise ValueError(f'sampling_mask: {len(offsets) - 1} rows for {positions} token ids')
    return offsets, ids


def sampling_mask_rows(trajectory: Mapping[str, Any]) -> Any:
    """The mask's compressed rows as numpy arrays ``(offsets, ids)``: ``offsets`` int64
    ``[len(token_ids) + 1]``, ``ids`` int32; row ``p`` is ``ids[offsets[p]:offsets[p + 1]]``. None
    when the trajectory has no ``sampling_mask``."""
    m = sampling_mask_of(trajectory)
    if m is None:
        return None
    np = _numpy()
    offsets, ids = sampling_mask_values(m, _positions(trajectory))
    return np.asarray(offsets, dtype=np.int64), np.asarray(ids, dtype=np.int32)


def sampling_mask_row(trajectory: Mapping[str, Any], position: int) -> Any:
    """The ids kept when ``token_ids[position]`` was sampled (numpy int32, in the order recorded;
    empty where nothing was sampled or the call returned no mask). None when the trajectory has no
    ``sampling_mask``; an IndexError for a position outside ``token_ids``."""
    rows = sampling_mask_rows(trajectory)
    if rows is None:
        return None
    offsets, ids = rows
    if not 0 <= position < len(offsets) - 1:
        raise IndexError(f'sampling_mask_row: position {position} is outside the {len(offsets) - 1} token ids')
    return ids[offsets[position]:offsets[position + 1]].copy()


def sampling_mask_missing(trajectory: Mapping[str, Any]) -> Any:
    """A numpy bool array ``[len(token_ids)]``, True at the sampled positions whose call returned no
    mask (``missing``); None when the trajectory has no ``sampling_mask``."""
    rows = sampling_mask_rows(trajectory)
    if rows is None:
        return None
    np = _numpy()
    n = len(rows[0]) - 1
    out = np.zeros(n, dtype=bool)
    for start, end in sampling_mask_of(trajectory).get('missing') or []:
        out[max(0, int(start)):min(n, int(end))] = True
    return out


def sampling_mask_dense(trajectory: Mapping[str, Any], vocab_size: int) -> Any:
    """The mask as a numpy bool array ``[len(token_ids), vocab_size]``, True at the ids kept at each
    position; rows without a mask (nothing sampled, or ``missing``) are all False. None when the
    trajectory has no ``sampling_mask``. A kept id outside ``[0, vocab_size)`` is a ValueError.

    Memory heavy: one byte per position and vocabulary entry (8,192 ids of a 152,064-entry
    vocabulary take 1.2 GB); prefer the rows, or build one batch's slice on the device.
    """
    rows = sampling_mask_rows(trajectory)
    if rows is None:
        return None
    np = _numpy()
    offsets, ids = rows
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f'sampling_mask_dense: kept id {bad} is outside a vocabulary of {vocab_size}')
    out = np.zeros((len(offsets) - 1, vocab_size), dtype=bool)
    out[np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)), ids] = True
    return out
