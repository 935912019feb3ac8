"""Records shaped as the sidecar writes them, and their Kafka encodings, for the tests."""
from __future__ import annotations

import base64
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
        'translation': None, 'token_ids_missing': None, 'token_in': None, 'upstream_replica': None,
    }
    t.update(extra)
    return t


def episode(rollout_id: str, transition_ids: list[str], *, attempt_id: str = '0', group_id: Optional[str] = None,
            final_reward: Optional[float] = None, status: str = 'completed', lag: Optional[float] = None,
            exported: Optional[list[str]] = None, trajectory_ids: list[str] = (), unmerged_calls: list[dict] = ()) -> dict[str, Any]:
    """An episode; with ``exported`` it has the keys trajectories brought, else it is an older sidecar's."""
    e = {
        'schema': 'lightning.episode.v1', 'rollout_id': rollout_id, 'attempt_id': attempt_id, 'group_id': group_id,
        'episode_status': status, 'final_reward': final_reward,
        'rewards': [] if final_reward is None else [{'name': 'final', 'value': final_reward, 'final': True}],
        'credit_mode': 'terminal', 'transitions': len(transition_ids), 'transition_ids': list(transition_ids),
    }
    if exported is not None:
        e.update(trajectory_ids=list(trajectory_ids), unmerged_calls=[dict(u) for u in unmerged_calls], exported=list(exported))
    e.update({'policy_versions': [], 'policy_version_lag': lag, 'started_at': '2025-01-01T00:00:00.000Z', 'ended_at': '2025-01-01T00:00:01.000Z'})
    return e


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


def trajectory(ts: list[dict], *, segment: int = 0, segments: int = 1, start_reason: str = 'first', final_reward: Optional[float] = None,
               parent: Optional[dict] = None) -> dict[str, Any]:
    """The trajectory record of calls ``ts`` (one segment), merged as the spec says.

    Each call's prompt must start with the previous call's prompt and response. Sampled tokens get
    loss mask 1 and their logprobs; each call's intermediate reward goes on its last token, and
    ``final_reward`` (given for the attempt's last segment) on the last sampled token.
    """
    first, last = ts[0], ts[-1]
    token_ids = list(last['prompt_token_ids']) + list(last['response_token_ids'])
    loss_mask, logprobs = [0] * len(token_ids), [0] * len(token_ids)
    turns, rewards = [], {}
    for t in ts:
        start = len(t['prompt_token_ids'])
        end = start + len(t['response_token_ids'])
        assert token_ids[:end] == list(t['prompt_token_ids']) + list(t['response_token_ids']), 'calls do not continue each other'
        for i in range(start, end):
            loss_mask[i] = 1
            if t['response_logprobs'] is not None:
                logprobs[i] = t['response_logprobs'][i - start]
        turns.append({'transition_id': t['transition_id'], 'seq': t['seq'], 'choice_index': t['choice_index'], 'response_start': start,
                      'response_end': end, 'has_logprobs': t['response_logprobs'] is not None, 'finish_reason': t['finish_reason'],
                      'tool_calls': t['tool_calls'], 'intermediate_reward': t['intermediate_reward'], 'reward': t['reward'],
                      'policy_version': t['policy_version']})
        if t['intermediate_reward'] is not None:
            rewards[end - 1] = rewards.get(end - 1, 0) + t['intermediate_reward']
    if final_reward is not None and segment == segments - 1:
        rewards[turns[-1]['response_end'] - 1] = rewards.get(turns[-1]['response_end'] - 1, 0) + final_reward
    token_rewards = [{'position': p, 'value': v} for p, v in sorted(rewards.items())]
    versions = list(dict.fromkeys(t['policy_version'] for t in ts if t['policy_version'] is not None))
    return {
        'schema': 'lightning.trajectory.v1', 'trajectory_id': f"{first['rollout_id']}/{first['attempt_id']}/s{segment}",
        'rollout_id': first['rollout_id'], 'attempt_id': first['attempt_id'], 'group_id': first['group_id'], 'agent_name': first['agent_name'],
        'segment': segment, 'segments': segments, 'start_reason': start_reason,
        'parent_trajectory_id': parent['trajectory_id'] if parent else None, 'parent_rollout_id': parent['rollout_id'] if parent else None,
        'parent_attempt_id': parent['attempt_id'] if parent else None, 'parent_transition_id': parent['turns'][-1]['transition_id'] if parent else None,
        'prompt_length': len(first['prompt_token_ids']), 'token_ids': token_ids, 'loss_mask': loss_mask,
        'logprobs': logprobs if any(t['response_logprobs'] is not None for t in ts) else None,
        'turns': turns, 'token_rewards': token_rewards, 'reward': sum(r['value'] for r in token_rewards), 'final_reward': final_reward,
        'episode_status': last['episode_status'], 'policy_versions': versions, 'started_at': first['started_at'], 'ended_at': last['ended_at'],
    }


def trajectory_rollout(rollout_id: str, calls: int, *, group_id: Optional[str], final_reward: float, attempt_id: str = '0',
                       base: int = 100) -> tuple[list[dict], list[dict], dict]:
    """``rollout``'s calls (one continuing segment), its trajectory and the episode a sidecar exporting both writes."""
    ts, e = rollout(rollout_id, calls, group_id=group_id, final_reward=final_reward, attempt_id=attempt_id, base=base)
    tr = trajectory(ts, final_reward=final_reward)
    e = episode(rollout_id, e['transition_ids'], attempt_id=attempt_id, group_id=group_id, final_reward=final_reward,
                exported=['transitions', 'trajectories'], trajectory_ids=[tr['trajectory_id']])
    return ts, [tr], e


def three_calls(rollout_id: str = 'r', *, group_id: Optional[str] = 'g', final_reward: float = 1) -> tuple[list[dict], dict, dict]:
    """A 3-call rollout merged into one trajectory, and its episode (one more call, retried, left out).

    token_ids   1 2 3 | 10 11 | 4 5 | 12 | 6 | 13 14      (prompt_length 3)
    loss_mask   0 0 0 |  1  1 | 0 0 |  1 | 0 |  1  1
    rewards             AIR -0.25 on 11, AIR 0.5 on 12, the final reward on 14
    """
    def call(seq, prompt, response, logprobs, air):
        return transition(rollout_id, seq, group_id=group_id, prompt=prompt, response=response, logprobs=logprobs, policy_version='7',
                          intermediate_reward=air, finish_reason='tool_calls' if seq < 2 else 'stop',
                          tool_calls=[{'id': f'c{seq}', 'name': 'calc', 'status': 'ok' if air is None or air > 0 else 'error',
                                       'reward': air, 'span_id': None, 'join': None}] if air is not None else [])
    ts = [
        call(0, [1, 2, 3], [10, 11], [-0.1, -0.2], -0.25),
        call(1, [1, 2, 3, 10, 11, 4, 5], [12], [-0.3], 0.5),
        call(2, [1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], [-0.4, -0.5], None),
    ]
    tr = trajectory(ts, final_reward=final_reward)
    retried = f'{rollout_id}/0/3'
    e = episode(rollout_id, [t['transition_id'] for t in ts] + [retried], group_id=group_id, final_reward=final_reward,
                exported=['trajectories'], trajectory_ids=[tr['trajectory_id']], unmerged_calls=[{'transition_id': retried, 'reason': 'not_ok'}])
    return ts, tr, e


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
    skip = {'request', 'response', 'usage', 'prompt_token_ids', 'response_token_ids', 'response_logprobs', 'tool_calls', 'injected', 'prompt_token_ids_delta',
            'translation', 'sampling'}
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
    if t.get('translation'):
        m.translation.upstream_api = t['translation']['upstream_api']
        m.translation.notes.extend(t['translation']['notes'])
    if t.get('sampling') is not None:
        set_sampling(m.sampling, t['sampling'])
    return m.SerializeToString()


def set_sampling(m: Any, sampling: dict) -> None:
    """A ``SamplingParams`` message from the JSON ``sampling`` (its nulls unset; set, even to 0, marks it present)."""
    m.SetInParent()
    for k, v in _drop_nulls(sampling).items():
        setattr(m, k, v)


def encode_episode_pb(e: dict) -> bytes:
    m = records_pb2().Episode()
    for k, v in _drop_nulls(e).items():
        if k in ('rewards', 'unmerged_calls'):
            for r in v:
                getattr(m, k).add(**r)
        elif isinstance(v, list):
            getattr(m, k).extend(v)
        else:
            setattr(m, k, v)
    return m.SerializeToString()


def encode_trajectory_pb(t: dict) -> bytes:
    """The protobuf encoding, field for field, with the generated classes."""
    m = records_pb2().Trajectory()
    for k, v in _drop_nulls(t).items():
        if k == 'logprobs':
            m.logprobs.extend(v)
            m.has_logprobs = True
        elif k == 'turns':
            for turn in v:
                pt = m.turns.add()
                for tk, tv in _drop_nulls(turn).items():
                    if tk == 'tool_calls':
                        for c in tv:
                            pt.tool_calls.add(**_drop_nulls(c))
                    elif tk == 'sampling':
                        set_sampling(pt.sampling, tv)
                    else:
                        setattr(pt, tk, tv)
        elif k == 'token_rewards':
            for r in v:
                m.token_rewards.add(**r)
        elif k == 'images':
            # The flag tells an absent list from an empty one; unset optional fields are JSON's nulls.
            for image in v:
                m.images.add(**_drop_nulls(image))
            m.has_images = True
        elif k == 'image_processor':
            m.image_processor.SetInParent()
            for pk, pv in v.items():
                setattr(m.image_processor, pk, pv)
        elif k == 'routed_experts':
            # Raw bytes in protobuf (base64 in JSON); the shape as three sizes.
            m.routed_experts.dtype = v['dtype']
            m.routed_experts.rows, m.routed_experts.layers, m.routed_experts.top_k = v['shape']
            m.routed_experts.data = base64.b64decode(v['data'])
            for start, end in v['missing']:
                m.routed_experts.missing.add(start=start, end=end)
        elif isinstance(v, list):
            getattr(m, k).extend(v)
        else:
            setattr(m, k, v)
    return m.SerializeToString()


def with_routing(t: dict, values: Any, *, missing: list[list[int]] = (), coverage: float = 1, complete: bool = True) -> dict:
    """``t`` with ``routed_experts`` holding ``values`` (a numpy array [rows, layers, top_k], rows =
    len(token_ids) - 1), keys where the sidecar puts them (after ``logprobs``)."""
    routed = {'dtype': str(values.dtype), 'shape': list(values.shape), 'data': base64.b64encode(values.astype(values.dtype.newbyteorder('<')).tobytes()).decode(),
              'missing': [list(m) for m in missing]}
    out: dict[str, Any] = {}
    for k, v in t.items():
        if k == 'turns':
            out.update(routed_experts=routed, routing_coverage=coverage, routing_complete=complete)
        out[k] = v
    return out


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


# Decodes a JSON list of base64 protobuf trajectories with the built Node encoder (argv[1]), printing their JSON.
NODE_DECODE_TRAJECTORIES = """
const enc = require(process.argv[1]);
const records = JSON.parse(require('fs').readFileSync(0, 'utf8'));
process.stdout.write(JSON.stringify(records.map((b64) => enc.decodeTrajectory(Buffer.from(b64, 'base64'), 'protobuf'))));
"""


def built_node_encoding(marker, what):
    """The built Node encoder (dist/), once it knows ``marker``; a stale build skips with how to build it."""
    import pytest
    encoding_js = REPO / 'dist' / 'exporters' / 'kafka' / 'encoding.js'
    if marker not in encoding_js.read_text():
        pytest.skip(f'the built Node encoding has no {what} (npx tsc -p tsconfig.build.json)')
    return encoding_js


# Encodes a JSON trajectory with the built Node exporter (argv[1]: encoding.js, argv[2]:
# transition-json.js), its record made back from the JSON (routing, weight versions, sampling masks,
# logprobs mode and images included), printing [JSON, protobuf] in base64.
NODE_ENCODE_TRAJECTORY = """
const [encJs, writerJs] = process.argv.slice(1);
const enc = require(encJs);
const { TransitionWriter } = require(writerJs);
const writer = new TransitionWriter(() => { throw new Error('no journal'); });
const TYPES = { uint8: Uint8Array, int16: Int16Array, uint16: Uint16Array, int32: Int32Array };
const t = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const { token_ids, loss_mask, logprobs, routed_experts: r, routing_coverage, routing_complete, weight_versions, sampling_mask: m,
        sampling_mask_coverage, sampling_mask_complete, sampling_mask_violations, logprobs_mode, images, images_complete, images_error,
        image_processor, ...rest } = t;
const cut = t.turns[t.turns.length - 1].response_start;
let routing = null;
if (r) {
  const bytes = Buffer.from(r.data, 'base64');
  const copy = new Uint8Array(bytes);  // aligned for the typed array
  routing = { rows: r.shape[0], layers: r.shape[1], topK: r.shape[2], data: new TYPES[r.dtype](copy.buffer), missing: r.missing, coverage: routing_coverage, complete: routing_complete, problems: [] };
}
const record = {
  ...rest,
  routing,
  weightVersions: weight_versions ?? null,
  samplingMask: m ? { offsets: Int32Array.from(m.offsets), ids: Int32Array.from(m.ids), missing: m.missing, coverage: sampling_mask_coverage,
                      complete: sampling_mask_complete, violations: sampling_mask_violations, problems: [] } : null,
  logprobsMode: logprobs_mode ?? null,
  images: images ? { images, complete: images_complete, error: images_error, processor: image_processor } : null,
  last: { transition_id: t.turns[t.turns.length - 1].transition_id, prompt_token_ids: token_ids.slice(0, cut), response_token_ids: token_ids.slice(cut) },
  length: token_ids.length,
  turnLogprobs: t.turns.map((u) => (u.has_logprobs && logprobs ? logprobs.slice(u.response_start, u.response_end) : null)),
};
process.stdout.write(JSON.stringify(['json', 'protobuf'].map((e) => enc.encodeTrajectory(record, e, writer).toString('base64'))));
"""


def node_encode_trajectory(tr, encoding_js):
    """The Node exporter's JSON and protobuf bytes of trajectory ``tr`` (a dict in the JSON shape)."""
    import base64
    import json
    import subprocess
    done = subprocess.run([node(), '-e', NODE_ENCODE_TRAJECTORY, str(encoding_js), str(REPO / 'dist' / 'exporters' / 'transition-json.js')],
                          input=json.dumps(tr).encode(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    return tuple(base64.b64decode(x) for x in json.loads(done.stdout))
