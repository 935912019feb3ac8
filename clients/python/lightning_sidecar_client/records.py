"""Transition, trajectory and episode records as dicts in their JSON shape, from either Kafka encoding.

A protobuf record is turned into exactly the dict its JSON encoding parses to (``null`` for unset
optional fields, free-form parts parsed from their ``*_json`` text), keys in the sidecar's order,
so everything downstream sees one shape. Protobuf doubles come out as Python floats where the JSON
may hold an integer (``1.0`` for ``1``): they compare equal, and ``js_json`` prints both as ``1``.

Protobuf cannot tell an absent repeated field from an empty one. An episode's ``trajectory_ids``,
``unmerged_calls`` and ``exported`` are therefore always lists when decoded from protobuf (empty
from a sidecar older than them), while a JSON episode from such a sidecar lacks the three keys.
A sidecar that writes ``exported`` names at least one record kind, so ``groups.GroupAssembler``
reads an empty list as what an older sidecar wrote: transitions only.

A protobuf record without the protobuf runtime raises ``ProtoUnavailableError``, not
``DecodeError``: the record is fine and must not be skipped as undecodable (offsets would move past
it); installing the extra and reading again gets it.

A trajectory's ``routed_experts`` (present only when a call returned routing) is raw bytes in
protobuf and base64 in JSON; decoded, both give the JSON dict (``data`` base64), with
``routing_coverage`` and ``routing_complete`` after it. ``routing.routed_experts_array`` makes it
a numpy array.
"""
from __future__ import annotations

import base64
import json
from typing import Any, Mapping, Sequence

from .proto import ProtoUnavailableError, records_pb2

JSON = 'application/json'
PROTOBUF = 'application/x-protobuf'
TRANSITION_SCHEMA = 'lightning.transition.v1'
EPISODE_SCHEMA = 'lightning.episode.v1'
TRAJECTORY_SCHEMA = 'lightning.trajectory.v1'

Record = dict[str, Any]

_TRANSITION_SCALARS = (
    'schema', 'transition_id', 'rollout_id', 'attempt_id', 'group_id', 'seq', 'choice_index', 'agent_name', 'model',
    'policy_version', 'api', 'streamed', 'status', 'http_status', 'error', 'finish_reason', 'continues_previous',
    'intermediate_reward', 'final_reward', 'reward', 'credit', 'is_last', 'episode_status', 'truncated', 'trace_id',
    'span_id', 'started_at', 'ended_at', 'latency_ms', 'ttft_ms',
)
_TOOL_CALL_FIELDS = ('id', 'name', 'status', 'reward', 'span_id', 'join')
_TRAJECTORY_HEAD = (
    'schema', 'trajectory_id', 'rollout_id', 'attempt_id', 'group_id', 'agent_name', 'segment', 'segments', 'start_reason',
    'parent_trajectory_id', 'parent_rollout_id', 'parent_attempt_id', 'parent_transition_id', 'prompt_length',
)
_TRAJECTORY_TAIL = ('reward', 'final_reward', 'episode_status')
_TURN_HEAD = ('transition_id', 'seq', 'choice_index', 'response_start', 'response_end', 'has_logprobs', 'finish_reason')
_TURN_TAIL = ('intermediate_reward', 'reward', 'policy_version')


class DecodeError(ValueError):
    code = 'UNDECODABLE'


def header(headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None, name: str) -> str | None:
    """A Kafka header's value as text (the first one of that name), or None."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    for k, v in items:
        if k == name:
            return None if v is None else (v.decode('utf-8', 'replace') if isinstance(v, (bytes, bytearray)) else str(v))
    return None


def encoding_of(headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None) -> str:
    return PROTOBUF if header(headers, 'content-type') == PROTOBUF else JSON


def decode_transition(value: bytes, encoding: str = JSON) -> Record:
    try:
        if encoding != PROTOBUF:
            return _json_object(value)
        m = records_pb2().Transition()
        m.ParseFromString(value)
        return _transition_from_proto(m)
    except (DecodeError, ProtoUnavailableError):
        raise
    except Exception as e:
        raise DecodeError(f'transition: cannot decode {encoding} ({e})') from e


def decode_episode(value: bytes, encoding: str = JSON) -> Record:
    try:
        if encoding != PROTOBUF:
            return _json_object(value)
        m = records_pb2().Episode()
        m.ParseFromString(value)
        return _episode_from_proto(m)
    except (DecodeError, ProtoUnavailableError):
        raise
    except Exception as e:
        raise DecodeError(f'episode: cannot decode {encoding} ({e})') from e


def decode_trajectory(value: bytes, encoding: str = JSON) -> Record:
    try:
        if encoding != PROTOBUF:
            return _json_object(value)
        m = records_pb2().Trajectory()
        m.ParseFromString(value)
        return _trajectory_from_proto(m)
    except (DecodeError, ProtoUnavailableError):
        raise
    except Exception as e:
        raise DecodeError(f'trajectory: cannot decode {encoding} ({e})') from e


def _json_object(value: bytes) -> Record:
    o = json.loads(value)
    if not isinstance(o, dict):
        raise DecodeError('record: not a JSON object')
    return o


def _opt(m: Any, field: str) -> Any:
    """A field's value, None when an `optional` field is unset (JSON null)."""
    fd = m.DESCRIPTOR.fields_by_name[field]
    if getattr(fd, 'has_presence', fd.containing_oneof is not None) and not m.HasField(field):
        return None
    return getattr(m, field)


def _transition_from_proto(m: Any) -> Record:
    out: Record = {f: _opt(m, f) for f in _TRANSITION_SCALARS}
    out['injected'] = list(m.injected)
    out['request'] = json.loads(m.request_json or 'null')
    out['response'] = json.loads(m.response_json or 'null')
    out['usage'] = json.loads(m.usage_json or 'null')
    out['prompt_token_ids'] = list(m.prompt_token_ids) if m.has_prompt_token_ids else None
    out['response_token_ids'] = list(m.response_token_ids) if m.has_response_token_ids else None
    out['response_logprobs'] = list(m.response_logprobs) if m.has_response_logprobs else None
    out['tool_calls'] = _tool_calls(m.tool_calls)
    if m.bodies_dropped:
        out['bodies_dropped'] = True
    if 'prompt_token_ids_delta' in m.DESCRIPTOR.fields_by_name and m.HasField('prompt_token_ids_delta'):
        d = m.prompt_token_ids_delta
        out['prompt_token_ids_delta'] = {
            'previous_transition_id': d.previous_transition_id,
            'prefix_length': d.prefix_length,
            'suffix': list(d.suffix),
        }
    return out


def _episode_from_proto(m: Any) -> Record:
    return {
        'schema': m.schema,
        'rollout_id': m.rollout_id,
        'attempt_id': m.attempt_id,
        'group_id': _opt(m, 'group_id'),
        'episode_status': m.episode_status,
        'final_reward': _opt(m, 'final_reward'),
        'rewards': [{'name': r.name, 'value': r.value, 'final': r.final} for r in m.rewards],
        'credit_mode': m.credit_mode,
        'transitions': m.transitions,
        'transition_ids': list(m.transition_ids),
        'trajectory_ids': list(m.trajectory_ids),
        'unmerged_calls': [{'transition_id': u.transition_id, 'reason': u.reason} for u in m.unmerged_calls],
        'exported': list(m.exported),
        'policy_versions': list(m.policy_versions),
        'policy_version_lag': _opt(m, 'policy_version_lag'),
        'started_at': m.started_at,
        'ended_at': m.ended_at,
    }


def _tool_calls(calls: Any) -> list[Record]:
    return [{f: _opt(c, f) for f in _TOOL_CALL_FIELDS} for c in calls]


def _trajectory_from_proto(m: Any) -> Record:
    out: Record = {f: _opt(m, f) for f in _TRAJECTORY_HEAD}
    out['token_ids'] = list(m.token_ids)
    out['loss_mask'] = list(m.loss_mask)
    out['logprobs'] = list(m.logprobs) if m.has_logprobs else None
    if 'routed_experts' in m.DESCRIPTOR.fields_by_name and m.HasField('routed_experts'):
        out.update(_routing_from_proto(m))
    out['turns'] = [_turn_from_proto(t) for t in m.turns]
    out['token_rewards'] = [{'position': r.position, 'value': r.value} for r in m.token_rewards]
    out.update((f, _opt(m, f)) for f in _TRAJECTORY_TAIL)
    out['policy_versions'] = list(m.policy_versions)
    out['started_at'] = m.started_at
    out['ended_at'] = m.ended_at
    return out


def _routing_from_proto(m: Any) -> Record:
    """The three routing keys as JSON has them: ``shape`` from the three sizes, ``data`` base64 of the
    raw little-endian bytes, ``missing`` as ``[start, end]`` pairs."""
    r = m.routed_experts
    return {
        'routed_experts': {
            'dtype': r.dtype,
            'shape': [r.rows, r.layers, r.top_k],
            'data': base64.b64encode(r.data).decode('ascii'),
            'missing': [[x.start, x.end] for x in r.missing],
        },
        'routing_coverage': m.routing_coverage,
        'routing_complete': m.routing_complete,
    }


def _turn_from_proto(t: Any) -> Record:
    out: Record = {f: _opt(t, f) for f in _TURN_HEAD}
    out['tool_calls'] = _tool_calls(t.tool_calls)
    out.update((f, _opt(t, f)) for f in _TURN_TAIL)
    return out
