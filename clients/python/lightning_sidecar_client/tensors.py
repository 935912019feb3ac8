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

numpy arrays (int64 ids and masks, float32 scores and log-probs) when numpy is importable and
``use_numpy`` is not False; nested lists of the same shapes otherwise.
"""
from __future__ import annotations

from typing import Any, Optional


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
