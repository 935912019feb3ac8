"""Records shaped as the sidecar writes them, and their Kafka encodings, for the tests."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from lightning_sidecar_client.proto import records_pb2

REPO = Path(os.environ.get('LIGHTNING_REPO_ROOT') or Path(__file__).resolve().parents[3])
JSON_HEADERS = [('content-type', b'application/json')]
PROTO_HEADERS = [('content-type', b'application/x-protobuf')]


def transition(rollout_id: str, seq: int, *, attempt_id: str = '0', group_id: Optional[str] = None, choice: Optional[int] = None,
               prompt: Optional[list[int]] = (1, 2), response: Optional[list[int]] = (3,), logprobs: Optional[list[float]] = None,
               reward: float = 0, is_last: bool = False, policy_version: Optional[str] = None, **extra: Any) -> dict[str, Any]:
    tid = f'{rollout_id}/{attempt_id}/{seq}' + (f'.{choice}' if choice is not None else '')
    response = list(response) if response is not None else None
    t = {
        'schema': 'lightning.transition.v1', 'transition_id': tid, 'rollout_id': rollout_id, 'attempt_id': attempt_id,
        'group_id': group_id, 'seq': seq, 'choice_index': choice or 0, 'agent_name': None, 'model': 'm',
        'policy_version': policy_version, 'api': 'chat.completions', 'request': {'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]},
        'response': {'id': 'r', 'choices': [{'index': 0, 'message': {'role': 'assistant', 'content': 'ok'}}]}, 'streamed': False,
        'status': 'ok', 'http_status': 200, 'error': None, 'finish_reason': 'stop', 'usage': {'prompt_tokens': 2, 'completion_tokens': 1},
        'prompt_token_ids': list(prompt) if prompt is not None else None, 'response_token_ids': response,
        'response_logprobs': list(logprobs) if logprobs is not None else ([-0.5] * len(response) if response is not None else None),
        'continues_previous': seq > 0, 'tool_calls': [], 'intermediate_reward': None, 'final_reward': None, 'reward': reward,
        'credit': None, 'is_last': is_last, 'episode_status': 'completed', 'truncated': False, 'trace_id': None, 'span_id': None,
        'started_at': '2025-01-01T00:00:00.000Z', 'ended_at': '2025-01-01T00:00:00.100Z', 'latency_ms': 100, 'ttft_ms': None, 'injected': [],
    }
    t.update(extra)
    return t


def episode(rollout_id: str, transition_ids: list[str], *, attempt_id: str = '0', group_id: Optional[str] = None,
            final_reward: Optional[float] = None, status: str = 'completed', lag: Optional[float] = None) -> dict[str, Any]:
    return {
        'schema': 'lightning.episode.v1', 'rollout_id': rollout_id, 'attempt_id': attempt_id, 'group_id': group_id,
        'episode_status': status, 'final_reward': final_reward,
        'rewards': [] if final_reward is None else [{'name': 'final', 'value': final_reward, 'final': True}],
        'credit_mode': 'terminal', 'transitions': len(transition_ids), 'transition_ids': list(transition_ids),
        'policy_versions': [], 'policy_version_lag': lag, 'started_at': '2025-01-01T00:00:00.000Z', 'ended_at': '2025-01-01T00:00:01.000Z',
    }


def rollout(rollout_id: str, calls: int, *, group_id: Optional[str], final_reward: float, attempt_id: str = '0', base: int = 100) -> tuple[list[dict], dict]:
    """``calls`` transitions where each prompt continues the previous prompt and response, and their episode."""
    ts, prompt = [], [base, base + 1]
    for seq in range(calls):
        response = [base + 10 * seq + 5, base + 10 * seq + 6]
        last = seq == calls - 1
        ts.append(transition(rollout_id, seq, attempt_id=attempt_id, group_id=group_id, prompt=prompt, response=response,
                             reward=final_reward if last else 0, is_last=last, final_reward=final_reward if last else None))
        prompt = prompt + response + [base + 10 * seq + 9]
    return ts, episode(rollout_id, [t['transition_id'] for t in ts], attempt_id=attempt_id, group_id=group_id, final_reward=final_reward)


def as_delta(t: dict, previous: dict) -> dict:
    """``t`` as the exporter sends it with ``prompt_ids: delta``."""
    prefix = len(previous['prompt_token_ids']) + len(previous['response_token_ids'])
    assert t['prompt_token_ids'][:prefix] == previous['prompt_token_ids'] + previous['response_token_ids']
    out = dict(t)
    out['prompt_token_ids'] = None
    out['prompt_token_ids_delta'] = {'previous_transition_id': previous['transition_id'], 'prefix_length': prefix, 'suffix': t['prompt_token_ids'][prefix:]}
    return out


def _drop_nulls(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def encode_transition_pb(t: dict) -> bytes:
    """The protobuf encoding, field for field as the exporter writes it."""
    pb = records_pb2()
    m = pb.Transition()
    skip = {'request', 'response', 'usage', 'prompt_token_ids', 'response_token_ids', 'response_logprobs', 'tool_calls', 'injected', 'prompt_token_ids_delta'}
    for k, v in _drop_nulls(t).items():
        if k not in skip:
            setattr(m, k, v)
    m.request_json = json.dumps(t.get('request'))
    m.response_json = json.dumps(t.get('response'))
    m.usage_json = json.dumps(t.get('usage'))
    for name in ('prompt_token_ids', 'response_token_ids', 'response_logprobs'):
        if t.get(name) is not None:
            getattr(m, name).extend(t[name])
            setattr(m, f'has_{name}', True)
    m.injected.extend(t.get('injected') or [])
    for c in t.get('tool_calls') or []:
        tc = m.tool_calls.add()
        for k, v in _drop_nulls(c).items():
            setattr(tc, k, v)
    if t.get('prompt_token_ids_delta'):
        d = t['prompt_token_ids_delta']
        m.prompt_token_ids_delta.previous_transition_id = d['previous_transition_id']
        m.prompt_token_ids_delta.prefix_length = d['prefix_length']
        m.prompt_token_ids_delta.suffix.extend(d['suffix'])
    return m.SerializeToString()


def encode_episode_pb(e: dict) -> bytes:
    m = records_pb2().Episode()
    for k, v in _drop_nulls(e).items():
        if k == 'rewards':
            for r in v:
                m.rewards.add(**r)
        elif isinstance(v, list):
            getattr(m, k).extend(v)
        else:
            setattr(m, k, v)
    return m.SerializeToString()


def proto_has_delta() -> bool:
    return 'prompt_token_ids_delta' in records_pb2().Transition.DESCRIPTOR.fields_by_name


def chunk(record_id: str, value: bytes, size: int, headers: list[tuple[str, bytes]] = JSON_HEADERS) -> list[tuple[list[tuple[str, bytes]], bytes]]:
    """Splits ``value`` as the exporter does: equal chunks, the last one shorter, with chunk headers."""
    count = -(-len(value) // size)
    sha = hashlib.sha256(value).hexdigest().encode()
    return [
        (list(headers) + [
            ('lightning-chunk', b'v1'), ('lightning-record-id', record_id.encode()), ('lightning-chunk-index', str(i).encode()),
            ('lightning-chunk-count', str(count).encode()), ('lightning-record-bytes', str(len(value)).encode()), ('lightning-record-sha256', sha),
        ], value[i * size:(i + 1) * size])
        for i in range(count)
    ]


def node() -> Optional[str]:
    """node, when it and the built project (dist/) are at hand, for cross-checks with the Node code."""
    exe = shutil.which('node')
    return exe if exe and (REPO / 'dist' / 'trainer' / 'groups.js').is_file() else None
