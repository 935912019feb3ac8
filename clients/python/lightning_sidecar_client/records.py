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

A trajectory's ``weight_versions`` (present only when a call's answer said which weights sampled
its tokens) is a list of ``{'version', 'start', 'end'}`` dicts, ``[start, end)`` ranges of
``token_ids`` positions in order, in either encoding; in protobuf ``has_weight_versions`` tells an
absent list from an empty one. It comes after ``logprobs`` (and the routing keys), before
``turns``. ``weight_version_per_token`` spreads it over the positions.

A trajectory's ``sampling_mask`` (present only when a call returned a mask or the sidecar was
asked for masks) is ``{'offsets', 'ids', 'missing'}`` in either encoding: row ``p`` is
``ids[offsets[p]:offsets[p + 1]]``, the ids the sampler kept at position ``p``, ``missing`` as
``[start, end]`` pairs. ``sampling_mask_coverage``, ``sampling_mask_complete`` and
``sampling_mask_violations`` follow it, then ``logprobs_mode`` (present only when the sidecar
names it, with or without a mask); all after ``weight_versions``, before ``turns``.
The module ``sampling_mask`` reads it as arrays.

A trajectory's images (present only when its last call had images: ``has_images`` in protobuf) are
four keys, after ``logprobs_mode`` and before ``turns``: ``images`` (each ``{'order', 'sha256',
'mime', 'bytes', 'width', 'height', 'url', 'start', 'length'}``, None where unset),
``images_complete``, ``images_error`` and ``image_processor`` (``image_token_id``, and ``factor``,
``min_pixels`` and ``max_pixels`` only when the sidecar was given them). The module ``images``
fetches their bytes.

A transition's and a trajectory turn's ``sampling`` (present only with the sidecar's
``processors.sampling.record``) is a ``SamplingParams`` message of optional doubles in protobuf;
decoded, it is the JSON dict, every key present (None where unset), as the record's last key (a
transition's ``prompt_token_ids_delta`` still after it). Whole numbers are ints there, as in the
JSON. A protobuf transition also has ``translation``, ``token_ids_missing``, ``token_in`` and
``upstream_replica`` (None when unset), as the JSON of a sidecar that has those fields.
"""
from __future__ import annotations

import base64
import json
from typing import Any, Mapping, Optional, Sequence

from .proto import ProtoUnavailableError, records_pb2

JSON = 'application/json'
PROTOBUF = 'application/x-protobuf'
TRANSITION_SCHEMA = 'lightning.transition.v1'
EPISODE_SCHEMA = 'lightning.episode.v1'
TRAJECTORY_SCHEMA = 'lightning.trajectory.v1'

Record = dict[str, Any]

# A transition's keys in the sidecar's JSON order (``sampling``, then the extras, follow when present).
_TRANSITION_KEYS = (
    'schema', 'transition_id', 'rollout_id', 'attempt_id', 'group_id', 'seq', 'choice_index', 'agent_name', 'model',
    'policy_version', 'api', 'request', 'response', 'streamed', 'status', 'http_status', 'error', 'finish_reason', 'usage',
    'prompt_token_ids', 'response_token_ids', 'response_logprobs', 'continues_previous', 'tool_calls', 'intermediate_reward',
    'final_reward', 'reward', 'credit', 'is_last', 'episode_status', 'truncated', 'trace_id', 'span_id', 'started_at', 'ended_at',
    'latency_ms', 'ttft_ms', 'injected', 'translation', 'token_ids_missing', 'token_in', 'upstream_replica',
)
_SAMPLING_KEYS = (
    'temperature', 'top_p', 'top_k', 'min_p', 'seed', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'max_tokens',
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
    fields = m.DESCRIPTOR.fields_by_name
    out: Record = {}
    for f in _TRANSITION_KEYS:
        if f in ('request', 'response', 'usage'):
            out[f] = json.loads(getattr(m, f'{f}_json') or 'null')
        elif f in ('prompt_token_ids', 'response_token_ids', 'response_logprobs'):
            out[f] = list(getattr(m, f)) if getattr(m, f'has_{f}') else None
        elif f == 'tool_calls':
            out[f] = _tool_calls(m.tool_calls)
        elif f == 'injected':
            out[f] = list(m.injected)
        elif f not in fields:
            continue
        elif f == 'translation':
            out[f] = {'upstream_api': m.translation.upstream_api, 'notes': list(m.translation.notes)} if m.HasField('translation') else None
        else:
            out[f] = _opt(m, f)
    sampling = _sampling_from_proto(m)
    if sampling is not None:
        out['sampling'] = sampling
    if m.bodies_dropped:
        out['bodies_dropped'] = True
    if 'prompt_token_ids_delta' in fields and m.HasField('prompt_token_ids_delta'):
        d = m.prompt_token_ids_delta
        out['prompt_token_ids_delta'] = {
            'previous_transition_id': d.previous_transition_id,
            'prefix_length': d.prefix_length,
            'suffix': list(d.suffix),
        }
    return out


def _sampling_from_proto(m: Any) -> Record | None:
    """A transition's or turn's ``sampling`` as JSON has it (every key, None where unset), None when
    it has none. A whole number comes back an int, as the JSON text the sidecar writes parses to."""
    if 'sampling' not in m.DESCRIPTOR.fields_by_name or not m.HasField('sampling'):
        return None
    s = m.sampling
    return {f: _js_number(getattr(s, f)) if s.HasField(f) else None for f in _SAMPLING_KEYS}


def _js_number(x: float) -> int | float:
    """``x`` as ``json.loads`` gives it back from JavaScript's JSON text: whole numbers below 1e21
    are written without a point or exponent, so they parse to ints."""
    return int(x) if x.is_integer() and abs(x) < 1e21 else x


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
    if 'has_weight_versions' in m.DESCRIPTOR.fields_by_name and m.has_weight_versions:
        out['weight_versions'] = [{'version': s.version, 'start': s.start, 'end': s.end} for s in m.weight_versions]
    if 'sampling_mask' in m.DESCRIPTOR.fields_by_name and m.HasField('sampling_mask'):
        out.update(_sampling_mask_from_proto(m))
    if 'logprobs_mode' in m.DESCRIPTOR.fields_by_name and m.HasField('logprobs_mode'):
        out['logprobs_mode'] = m.logprobs_mode
    if 'has_images' in m.DESCRIPTOR.fields_by_name and m.has_images:
        out.update(_images_from_proto(m))
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


def _sampling_mask_from_proto(m: Any) -> Record:
    """The four sampling-mask keys as JSON has them: ``missing`` as ``[start, end]`` pairs; an unset
    flag reads as its zero value, as the Node decoder reads it."""
    s = m.sampling_mask
    return {
        'sampling_mask': {'offsets': list(s.offsets), 'ids': list(s.ids), 'missing': [[x.start, x.end] for x in s.missing]},
        'sampling_mask_coverage': m.sampling_mask_coverage,
        'sampling_mask_complete': m.sampling_mask_complete,
        'sampling_mask_violations': m.sampling_mask_violations,
    }


_IMAGE_FIELDS = ('order', 'sha256', 'mime', 'bytes', 'width', 'height', 'url', 'start', 'length')
_IMAGE_PROCESSOR_OPTIONAL = ('factor', 'min_pixels', 'max_pixels')


def _images_from_proto(m: Any) -> Record:
    """The four image keys as JSON has them: each image with every key (None where unset), an unset
    ``images_complete`` read as False (as the Node decoder reads it), and ``image_processor`` with
    the resize settings only when the sidecar was given them."""
    p = m.image_processor
    processor: Record = {'image_token_id': p.image_token_id}
    processor.update((f, getattr(p, f)) for f in _IMAGE_PROCESSOR_OPTIONAL if p.HasField(f))
    return {
        'images': [{f: _opt(i, f) for f in _IMAGE_FIELDS} for i in m.images],
        'images_complete': m.images_complete,
        'images_error': _opt(m, 'images_error'),
        'image_processor': processor,
    }


def _turn_from_proto(t: Any) -> Record:
    out: Record = {f: _opt(t, f) for f in _TURN_HEAD}
    out['tool_calls'] = _tool_calls(t.tool_calls)
    out.update((f, _opt(t, f)) for f in _TURN_TAIL)
    sampling = _sampling_from_proto(t)
    if sampling is not None:
        out['sampling'] = sampling
    return out


def weight_version_per_token(trajectory: Mapping[str, Any]) -> list[Optional[str]]:
    """The weight version that sampled each position of the trajectory's ``token_ids`` (one entry per
    id), from its ``weight_versions`` spans; None where no span covers a position (prompt ids, calls
    whose answer did not say) and everywhere when the trajectory has no ``weight_versions``. Span
    ends past ``token_ids`` are cut at its length."""
    n = len(trajectory['token_ids'])
    out: list[Optional[str]] = [None] * n
    for span in trajectory.get('weight_versions') or ():
        start, end = max(0, span['start']), min(n, span['end'])
        if start < end:
            out[start:end] = [span['version']] * (end - start)
    return out
