"""A group as the tensors of a veRL-style batch.

Rows are the group's ``batch`` rows (a ``lightning.group.v1`` dict): trajectories, or transitions
(one per call) in a group built with ``rows='transitions'``. Prompts are padded on the left and
responses on the right, so every row's response starts at the same column:

- ``prompts`` [B, P], ``responses`` [B, R], ``input_ids`` [B, P + R] (ids, ``pad_token_id`` as padding)
- ``attention_mask`` [B, P + R] (1 on real tokens)
- ``response_mask`` [B, R]: the row's ``response_mask``, 0 on padding. For a trajectory that is 1
  exactly on the tokens the policy sampled (0 on tool outputs and on the prompt text between
  turns); for a transition, every response token.
- ``position_ids`` [B, P + R] (0 at the first real token, counting real tokens only)
- ``token_level_scores`` [B, R] (the row's scores: a trajectory's token rewards at their tokens,
  a transition's reward on its last response token)
- ``old_log_probs`` [B, R] (the sampler's log-probs; 0 where absent), ``has_old_log_probs`` [B]
- ``uid``, ``rollout_id``, and ``trajectory_id`` or ``transition_id`` (per row), ``reward`` [B]

Only when a trajectory of the group has routed experts (MoE routing replay: the batch then has a
``routed_experts`` column, see ``groups``; docs/output-contract.md#routed-experts):

- ``routed_experts`` [B, P + R, layers, top_k]: rows aligned with ``input_ids`` columns: the
  column of the token at position ``i`` holds row ``i`` (the forward pass over that token, which
  chose the experts for the logits of the next one). Pad columns, the row's last token (it has no
  row), a trajectory's ``missing`` positions and every column of a row without routing hold 0.
  dtype: the rows' dtypes promoted (numpy), e.g. uint8.
- ``routed_experts_mask`` [B, P + R]: 1 where the column holds a real row, 0 on the padding above.
- ``routing_complete`` [B]: the trajectory's ``routing_complete`` (False without routing). A row
  that is not complete must not be replayed: drop it or let the live router decide.

Only when a trajectory of the group has sampling masks (the batch then has a ``sampling_mask``
column, see ``groups`` and ``sampling_mask``), per response column, in compressed rows:

- ``sampling_mask_offsets`` [B, R + 1] and ``sampling_mask_ids`` [B, K]: the ids the sampler kept
  at response column ``j`` of row ``b`` are ``sampling_mask_ids[b, offsets[b, j]:offsets[b, j + 1]]``
  (K: the most ids of a row; the ids past a row's last offset are padding, 0). Columns with no
  row (padding, unsampled tokens, ``missing`` positions, every column of a row without masks) are
  empty. The prompt has no rows, so nothing is lost.
- ``sampling_mask_present`` [B, R]: 1 where the column holds a recorded row (a sampled token whose
  call returned a mask), 0 elsewhere.
- ``sampling_mask_complete`` [B]: the trajectory's ``sampling_mask_complete`` (False without
  masks). Restrict the logits of a row that is not complete only knowing why (the trajectory's
  ``sampling_mask_violations`` and ``missing``).

numpy arrays (int64 ids and masks, float32 scores and log-probs) when numpy is importable and
``use_numpy`` is not False; nested lists of the same shapes otherwise.
"""
from __future__ import annotations

from typing import Any, Optional

from .routing import missing_rows, routed_experts_array, routed_experts_values, routing_missing_mask
from .sampling_mask import sampling_mask_values


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def to_verl_batch(
    group: dict[str, Any],
    *,
    pad_token_id: int = 0,
    max_prompt_length: Optional[int] = None,
    max_response_length: Optional[int] = None,
    use_numpy: Optional[bool] = None,
) -> dict[str, Any]:
    """``max_*_length`` fix the padded widths (a longer row is an error); default: the longest row.

    A row whose mask, scores or log-probs do not have one entry per response token is an error.
    """
    b = group['batch']
    # Trajectory rows are named by trajectory_id, per-call rows by transition_id.
    id_key = 'trajectory_id' if 'trajectory_id' in b else 'transition_id'
    names: list[str] = b[id_key]
    prompts: list[list[int]] = b['prompt_ids']
    responses: list[list[int]] = b['response_ids']
    for i, response in enumerate(responses):
        for name, row in (('response_mask', b['response_mask'][i]), ('token_level_scores', b['token_level_scores'][i]),
                          ('rollout_log_probs', b['rollout_log_probs'][i])):
            if row is not None and len(row) != len(response):
                raise ValueError(f'to_verl_batch: {name} of {names[i]} has {len(row)} entries for {len(response)} response tokens')
    p_len = max((len(p) for p in prompts), default=0)
    r_len = max((len(r) for r in responses), default=0)
    for name, limit, rows in (('prompt', max_prompt_length, prompts), ('response', max_response_length, responses)):
        if limit is None:
            continue
        for i, row in enumerate(rows):
            if len(row) > limit:
                raise ValueError(f'to_verl_batch: {name} of {names[i]} has {len(row)} tokens, more than max_{name}_length {limit}')
    p_len = max_prompt_length if max_prompt_length is not None else p_len
    r_len = max_response_length if max_response_length is not None else r_len

    out: dict[str, list[Any]] = {k: [] for k in ('prompts', 'responses', 'input_ids', 'attention_mask', 'position_ids', 'response_mask', 'token_level_scores', 'old_log_probs', 'has_old_log_probs')}
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        p_pad, r_pad = p_len - len(prompt), r_len - len(response)
        prompt_row = [pad_token_id] * p_pad + list(prompt)
        response_row = list(response) + [pad_token_id] * r_pad
        attention = [0] * p_pad + [1] * (len(prompt) + len(response)) + [0] * r_pad
        # veRL's compute_position_id_with_mask: clip(cumsum(attention_mask) - 1, min=0)
        positions, seen = [], 0
        for a in attention:
            seen += a
            positions.append(max(seen - 1, 0))
        logprobs = b['rollout_log_probs'][i]
        out['prompts'].append(prompt_row)
        out['responses'].append(response_row)
        out['input_ids'].append(prompt_row + response_row)
        out['attention_mask'].append(attention)
        out['position_ids'].append(positions)
        out['response_mask'].append([int(m) for m in b['response_mask'][i]] + [0] * r_pad)
        out['token_level_scores'].append([float(s) for s in b['token_level_scores'][i]] + [0.0] * r_pad)
        out['old_log_probs'].append(([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(response)) + [0.0] * r_pad)
        out['has_old_log_probs'].append(logprobs is not None)

    result: dict[str, Any] = dict(out)
    np = _numpy() if use_numpy is not False else None
    if use_numpy and np is None:
        raise ImportError('to_verl_batch: use_numpy=True but numpy is not installed')
    if any(r is not None for r in b.get('routed_experts') or []):
        result.update(_routing(b, names, prompts, responses, p_len, r_len, np))
    if any(m is not None for m in b.get('sampling_mask') or []):
        result.update(_sampling_masks(b, names, prompts, responses, r_len, np))
    if np is not None:
        # Explicit widths, so a group without rows still gives [0, width] arrays.
        widths = {'prompts': p_len, 'responses': r_len, 'input_ids': p_len + r_len, 'attention_mask': p_len + r_len,
                  'position_ids': p_len + r_len, 'response_mask': r_len, 'token_level_scores': r_len, 'old_log_probs': r_len}
        for k, width in widths.items():
            dtype = np.float32 if k in ('token_level_scores', 'old_log_probs') else np.int64
            result[k] = np.asarray(out[k], dtype=dtype).reshape(len(prompts), width)
        result['has_old_log_probs'] = np.asarray(out['has_old_log_probs'], dtype=bool)
        result['reward'] = np.asarray(b['reward'], dtype=np.float32)
        result['uid'] = np.asarray(b['uid'], dtype=object)
        result['rollout_id'] = np.asarray(b['rollout_id'], dtype=object)
        result[id_key] = np.asarray(names, dtype=object)
    else:
        result['reward'] = [float(r) for r in b['reward']]
        result['uid'] = list(b['uid'])
        result['rollout_id'] = list(b['rollout_id'])
        result[id_key] = list(names)
    return result


def _routing(b: dict[str, Any], names: list[str], prompts: list[list[int]], responses: list[list[int]], p_len: int, r_len: int,
             np: Any) -> dict[str, Any]:
    """``routed_experts``, ``routed_experts_mask`` and ``routing_complete``, aligned with ``input_ids``."""
    width = p_len + r_len
    complete = [bool(c) for c in b.get('routing_complete') or [r is not None for r in b['routed_experts']]]
    # Routing the sidecar could not read at all (shape [rows, 0, 0], never complete) has no rows to place.
    routed: list[Any] = [None if r is not None and 0 in (int(r['shape'][1]), int(r['shape'][2])) else r for r in b['routed_experts']]
    sizes: Optional[tuple[int, int]] = None
    for i, r in enumerate(routed):
        if r is None:
            continue
        rows, layers, top_k = (int(x) for x in r['shape'])
        n = len(prompts[i]) + len(responses[i])
        if rows != max(n - 1, 0):
            raise ValueError(f'to_verl_batch: routed_experts of {names[i]} has {rows} rows for {n} tokens (one per token but the last)')
        if sizes is None:
            sizes = (layers, top_k)
        elif sizes != (layers, top_k):
            raise ValueError(f'to_verl_batch: routed_experts of {names[i]} has {layers} layers × top-{top_k}, others {sizes[0]} × top-{sizes[1]}')
    layers, top_k = sizes or (0, 0)
    if np is not None:
        arrays = [routed_experts_array(r) if r is not None else None for r in routed]
        present = [a.dtype for a in arrays if a is not None]
        dtype = np.result_type(*present) if present else np.uint8
        experts = np.zeros((len(routed), width, layers, top_k), dtype=dtype)
        mask = np.zeros((len(routed), width), dtype=np.int64)
        for i, a in enumerate(arrays):
            if a is None:
                continue
            start = p_len - len(prompts[i])
            experts[i, start:start + len(a)] = a
            mask[i, start:start + len(a)] = ~routing_missing_mask(routed[i])
        return {'routed_experts': experts, 'routed_experts_mask': mask, 'routing_complete': np.asarray(complete, dtype=bool)}
    zero_row = [[0] * top_k for _ in range(layers)]
    experts_rows, mask_rows = [], []
    for i, r in enumerate(routed):
        row = [[list(x) for x in zero_row] for _ in range(width)]
        m = [0] * width
        if r is not None:
            (rows, _, _), values = routed_experts_values(r)
            gone = missing_rows(r)
            start = p_len - len(prompts[i])
            per_row = layers * top_k
            for j in range(rows):
                flat = values[j * per_row:(j + 1) * per_row]
                row[start + j] = [flat[k * top_k:(k + 1) * top_k] for k in range(layers)]
                m[start + j] = 0 if j in gone else 1
        experts_rows.append(row)
        mask_rows.append(m)
    return {'routed_experts': experts_rows, 'routed_experts_mask': mask_rows, 'routing_complete': complete}


def _sampling_masks(b: dict[str, Any], names: list[str], prompts: list[list[int]], responses: list[list[int]], r_len: int,
                    np: Any) -> dict[str, Any]:
    """``sampling_mask_offsets``, ``sampling_mask_ids``, ``sampling_mask_present`` and
    ``sampling_mask_complete``, over the response columns."""
    masks = b['sampling_mask']
    complete = [bool(c) for c in b.get('sampling_mask_complete') or [m is not None for m in masks]]
    offsets_rows: list[list[int]] = []
    ids_rows: list[list[int]] = []
    present_rows: list[list[int]] = []
    for i, m in enumerate(masks):
        p, r = len(prompts[i]), len(responses[i])
        if m is None:
            offsets_rows.append([0] * (r_len + 1))
            ids_rows.append([])
            present_rows.append([0] * r_len)
            continue
        try:
            offsets, ids = sampling_mask_values(m, p + r)
        except ValueError as e:
            raise ValueError(f'to_verl_batch: {names[i]}: {e}') from None
        if offsets[p] != 0:
            raise ValueError(f'to_verl_batch: sampling_mask of {names[i]} has rows in its prompt')
        offsets_rows.append(offsets[p:] + [offsets[-1]] * (r_len - r))
        ids_rows.append(ids)
        gone = {j for start, end in m.get('missing') or [] for j in range(max(p, int(start)), min(p + r, int(end)))}
        sampled = b['response_mask'][i]
        present_rows.append([1 if sampled[j] and p + j not in gone else 0 for j in range(r)] + [0] * (r_len - r))
    k = max((len(x) for x in ids_rows), default=0)
    ids_rows = [x + [0] * (k - len(x)) for x in ids_rows]
    if np is not None:
        n = len(masks)
        return {
            'sampling_mask_offsets': np.asarray(offsets_rows, dtype=np.int64).reshape(n, r_len + 1),
            'sampling_mask_ids': np.asarray(ids_rows, dtype=np.int64).reshape(n, k),
            'sampling_mask_present': np.asarray(present_rows, dtype=np.int64).reshape(n, r_len),
            'sampling_mask_complete': np.asarray(complete, dtype=bool),
        }
    return {'sampling_mask_offsets': offsets_rows, 'sampling_mask_ids': ids_rows, 'sampling_mask_present': present_rows,
            'sampling_mask_complete': complete}
