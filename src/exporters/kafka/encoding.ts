import path from 'node:path';
import protobuf from 'protobufjs';
import type { PromptIdsDelta } from '../../model/prompt-delta';
import type {
  EpisodeSummary,
  RoutingDtype,
  SamplingParams,
  Trajectory,
  TrajectoryRecord,
  TrajectoryRouting,
  Transition,
  TransitionRecord,
  WeightVersionSpan,
} from '../../model/records';
import { dtypeOf } from '../../formats/routed-experts';
import { TransitionWriter } from '../transition-json';
import { materializeTrajectory, routingBytes, trajectoryJson } from '../trajectory-json';
import { extend } from '../../model/extend';

export type Encoding = 'json' | 'protobuf';

export const CONTENT_TYPE: Record<Encoding, string> = { json: 'application/json', protobuf: 'application/x-protobuf' };

let root: protobuf.Root | null = null;
function types(): { transition: protobuf.Type; episode: protobuf.Type; trajectory: protobuf.Type } {
  root ??= new protobuf.Root().loadSync(path.resolve(__dirname, '../../../proto/lightning/v1/records.proto'), { keepCase: true });
  return {
    transition: root.lookupType('lightning.v1.Transition'),
    episode: root.lookupType('lightning.v1.Episode'),
    trajectory: root.lookupType('lightning.v1.Trajectory'),
  };
}

/**
 * A transition as it is on the wire: the JSON record; with prompt deltas, `prompt_token_ids` is
 * null and `prompt_token_ids_delta` says how to rebuild it. `bodies_dropped` only appears in
 * records of versions that dropped bodies to fit a message (records are chunked now).
 */
export type OutgoingTransition = Transition & { bodies_dropped?: boolean; prompt_token_ids_delta?: PromptIdsDelta };

const INLINE_ONLY = new TransitionWriter(() => {
  throw new Error('no journal to read bodies from');
});

/**
 * Encodes a transition; `writer` resolves what is still in the journal (bodies, id ranges).
 * JSON copies those bytes as they are; protobuf decodes them into its fields.
 */
export function encodeTransition(
  record: TransitionRecord | OutgoingTransition,
  encoding: Encoding,
  writer: TransitionWriter = INLINE_ONLY,
  extra?: { prompt_token_ids_delta?: PromptIdsDelta },
): Buffer {
  if (encoding === 'json') return writer.json(record, extra);
  const m = writer.materialize(record);
  const t: OutgoingTransition = extra ? extend(m, extra) : m;
  // Members added to dropNulls' fresh object in place (a literal starting with a spread is slow: see model/extend.ts).
  const msg = Object.assign(dropNulls(t), {
    request_json: JSON.stringify(t.request ?? null),
    response_json: JSON.stringify(t.response ?? null),
    usage_json: JSON.stringify(t.usage ?? null),
    prompt_token_ids: t.prompt_token_ids ?? [],
    has_prompt_token_ids: t.prompt_token_ids !== null,
    response_token_ids: t.response_token_ids ?? [],
    has_response_token_ids: t.response_token_ids !== null,
    response_logprobs: t.response_logprobs ?? [],
    has_response_logprobs: t.response_logprobs !== null,
    tool_calls: t.tool_calls.map((c) => dropNulls(c)),
    bodies_dropped: t.bodies_dropped === true,
    prompt_token_ids_delta: t.prompt_token_ids_delta,
    sampling: t.sampling === undefined ? undefined : dropNulls(t.sampling),
  });
  const type = types().transition;
  return Buffer.from(type.encode(type.fromObject(msg)).finish());
}

export function decodeTransition(bytes: Buffer, encoding: Encoding): OutgoingTransition {
  if (encoding === 'json') return JSON.parse(bytes.toString('utf8')) as OutgoingTransition;
  const type = types().transition;
  const o = type.toObject(type.decode(bytes), { longs: Number, defaults: true, arrays: true }) as Record<string, unknown>;
  // Keys in the order the JSON record has them (the Transition interface's), extras last.
  const out: Record<string, unknown> = {};
  for (const f of TRANSITION_FIELDS) {
    switch (f) {
      case 'request':
      case 'response':
      case 'usage':
        out[f] = JSON.parse(o[`${f}_json`] as string);
        break;
      case 'prompt_token_ids':
      case 'response_token_ids':
      case 'response_logprobs':
        out[f] = o[`has_${f}`] ? o[f] : null;
        break;
      case 'tool_calls':
        out.tool_calls = (o.tool_calls as Record<string, unknown>[]).map((c) => ({
          id: c.id ?? null,
          name: c.name ?? null,
          status: c.status ?? null,
          reward: c.reward ?? null,
          span_id: c.span_id ?? null,
          join: c.join ?? null,
        }));
        break;
      case 'translation':
        out.translation = o.translation
          ? { upstream_api: (o.translation as { upstream_api: string }).upstream_api, notes: (o.translation as { notes?: string[] }).notes ?? [] }
          : null;
        break;
      default:
        out[f] = o[f] === undefined ? null : o[f];
    }
  }
  const sampling = samplingFromMessage(o.sampling);
  if (sampling) out.sampling = sampling;
  if (o.bodies_dropped) out.bodies_dropped = true;
  const d = o.prompt_token_ids_delta as { previous_transition_id: string; prefix_length: number; suffix: number[] } | undefined;
  if (d) out.prompt_token_ids_delta = { previous_transition_id: d.previous_transition_id, prefix_length: d.prefix_length, suffix: d.suffix };
  return out as unknown as OutgoingTransition;
}

export function encodeEpisode(e: EpisodeSummary, encoding: Encoding): Buffer {
  if (encoding === 'json') return Buffer.from(JSON.stringify(e));
  const type = types().episode;
  return Buffer.from(type.encode(type.fromObject(dropNulls(e))).finish());
}

export function decodeEpisode(bytes: Buffer, encoding: Encoding): EpisodeSummary {
  if (encoding === 'json') return JSON.parse(bytes.toString('utf8')) as EpisodeSummary;
  const type = types().episode;
  const o = type.toObject(type.decode(bytes), { longs: Number, defaults: true, arrays: true }) as Record<string, unknown>;
  return {
    schema: o.schema,
    rollout_id: o.rollout_id,
    attempt_id: o.attempt_id,
    group_id: o.group_id ?? null,
    episode_status: o.episode_status,
    final_reward: o.final_reward ?? null,
    rewards: o.rewards,
    credit_mode: o.credit_mode,
    transitions: o.transitions,
    transition_ids: o.transition_ids,
    trajectory_ids: o.trajectory_ids ?? [],
    unmerged_calls: ((o.unmerged_calls as { transition_id: string; reason: string }[] | undefined) ?? []).map((u) => ({
      transition_id: u.transition_id,
      reason: u.reason,
    })),
    exported: o.exported ?? [],
    policy_versions: o.policy_versions ?? [],
    policy_version_lag: o.policy_version_lag ?? null,
    started_at: o.started_at,
    ended_at: o.ended_at,
  } as EpisodeSummary;
}

/**
 * Encodes a trajectory; `writer` reads the ids it takes from the journal. JSON copies them as
 * they are; protobuf decodes them into its fields.
 */
export function encodeTrajectory(t: TrajectoryRecord, encoding: Encoding, writer: TransitionWriter): Buffer {
  if (encoding === 'json') return trajectoryJson(writer, t);
  // The routing's bytes go in as they are, not through base64 and back.
  const x = materializeTrajectory(writer, t, false);
  const msg = Object.assign(dropNulls(x), {
    logprobs: x.logprobs ?? [],
    has_logprobs: x.logprobs !== null,
    ...(t.routing === null ? {} : routedExpertsMessage(t.routing)),
    weight_versions: x.weight_versions ?? [],
    has_weight_versions: x.weight_versions !== undefined,
    sampling_mask:
      x.sampling_mask === undefined ? undefined : extend(x.sampling_mask, { missing: x.sampling_mask.missing.map(([start, end]) => ({ start, end })) }),
    images: (x.images ?? []).map((i) => dropNulls(i)),
    has_images: x.images !== undefined,
    image_processor: x.image_processor === undefined ? undefined : dropNulls(x.image_processor),
    turns: x.turns.map((turn) =>
      Object.assign(dropNulls(turn), {
        tool_calls: turn.tool_calls.map((c) => dropNulls(c)),
        sampling: turn.sampling === undefined ? undefined : dropNulls(turn.sampling),
      }),
    ),
  });
  const type = types().trajectory;
  return asBuffer(type.encode(type.fromObject(msg)).finish());
}

/** protobufjs's output as a Buffer, without a copy (a trajectory's can be tens of MiB). */
function asBuffer(u8: Uint8Array): Buffer {
  return Buffer.isBuffer(u8) ? u8 : Buffer.from(u8.buffer, u8.byteOffset, u8.byteLength);
}

export function decodeTrajectory(bytes: Buffer, encoding: Encoding): Trajectory {
  if (encoding === 'json') return JSON.parse(bytes.toString('utf8')) as Trajectory;
  const type = types().trajectory;
  const o = type.toObject(type.decode(bytes), { longs: Number, defaults: true, arrays: true }) as Record<string, unknown>;
  const opt = (v: unknown) => (v === undefined ? null : v);
  const turns = (o.turns as Record<string, unknown>[]).map((t) => {
    const sampling = samplingFromMessage(t.sampling);
    return {
      transition_id: t.transition_id,
      seq: t.seq,
      choice_index: t.choice_index,
      response_start: t.response_start,
      response_end: t.response_end,
      has_logprobs: t.has_logprobs,
      finish_reason: opt(t.finish_reason),
      tool_calls: (t.tool_calls as Record<string, unknown>[]).map((c) => ({
        id: opt(c.id),
        name: opt(c.name),
        status: opt(c.status),
        reward: opt(c.reward),
        span_id: opt(c.span_id),
        join: opt(c.join),
      })),
      intermediate_reward: opt(t.intermediate_reward),
      reward: t.reward,
      policy_version: opt(t.policy_version),
      ...(sampling ? { sampling } : {}),
    };
  });
  return {
    schema: o.schema,
    trajectory_id: o.trajectory_id,
    rollout_id: o.rollout_id,
    attempt_id: o.attempt_id,
    group_id: opt(o.group_id),
    agent_name: opt(o.agent_name),
    segment: o.segment,
    segments: o.segments,
    start_reason: o.start_reason,
    parent_trajectory_id: opt(o.parent_trajectory_id),
    parent_rollout_id: opt(o.parent_rollout_id),
    parent_attempt_id: opt(o.parent_attempt_id),
    parent_transition_id: opt(o.parent_transition_id),
    prompt_length: o.prompt_length,
    token_ids: o.token_ids,
    loss_mask: o.loss_mask,
    logprobs: o.has_logprobs ? o.logprobs : null,
    ...routingFromMessage(o),
    ...weightVersionsFromMessage(o),
    ...samplingMaskFromMessage(o),
    ...(o.logprobs_mode !== undefined && o.logprobs_mode !== null ? { logprobs_mode: o.logprobs_mode } : {}),
    ...imagesFromMessage(o),
    turns,
    token_rewards: (o.token_rewards as { position: number; value: number }[]).map((r) => ({ position: r.position, value: r.value })),
    reward: o.reward,
    final_reward: opt(o.final_reward),
    episode_status: o.episode_status,
    policy_versions: o.policy_versions,
    started_at: o.started_at,
    ended_at: o.ended_at,
  } as Trajectory;
}

/**
 * A trajectory's three routing fields as the message's: `routed_experts` with the shape as three
 * sizes, the values as their raw bytes, `missing` as ranges.
 */
function routedExpertsMessage(r: TrajectoryRouting): Record<string, unknown> {
  return {
    routed_experts: {
      dtype: dtypeOf(r.data),
      rows: r.rows,
      layers: r.layers,
      top_k: r.topK,
      data: routingBytes(r),
      missing: r.missing.map(([start, end]) => ({ start, end })),
    },
    routing_coverage: r.coverage,
    routing_complete: r.complete,
  };
}

/** The three routing fields of a decoded trajectory message in their JSON shape; none when it has no routing. */
function routingFromMessage(o: Record<string, unknown>): Pick<Trajectory, 'routed_experts' | 'routing_coverage' | 'routing_complete'> {
  const m = o.routed_experts as
    { dtype: RoutingDtype; rows: number; layers: number; top_k: number; data: Uint8Array; missing: { start: number; end: number }[] } | undefined;
  if (m === undefined || m === null) return {};
  return {
    routed_experts: {
      dtype: m.dtype,
      shape: [m.rows, m.layers, m.top_k],
      data: Buffer.from(m.data.buffer, m.data.byteOffset, m.data.byteLength).toString('base64'),
      missing: m.missing.map((r) => [r.start, r.end]),
    },
    routing_coverage: (o.routing_coverage as number | undefined) ?? 0,
    routing_complete: (o.routing_complete as boolean | undefined) ?? false,
  };
}

/** The four image fields of a decoded trajectory message in their JSON shape; none when `has_images` is unset. */
function imagesFromMessage(o: Record<string, unknown>): Pick<Trajectory, 'images' | 'images_complete' | 'images_error' | 'image_processor'> {
  if (o.has_images !== true) return {};
  const opt = (v: unknown) => (v === undefined ? null : v);
  const p = (o.image_processor ?? {}) as Record<string, unknown>;
  return {
    images: (o.images as Record<string, unknown>[]).map((i) => ({
      order: i.order as number,
      sha256: opt(i.sha256) as string | null,
      mime: opt(i.mime) as string | null,
      bytes: opt(i.bytes) as number | null,
      width: opt(i.width) as number | null,
      height: opt(i.height) as number | null,
      url: opt(i.url) as string | null,
      start: opt(i.start) as number | null,
      length: opt(i.length) as number | null,
    })),
    images_complete: (o.images_complete as boolean | undefined) ?? false,
    images_error: opt(o.images_error) as string | null,
    image_processor: {
      image_token_id: p.image_token_id as number,
      ...(p.factor !== undefined ? { factor: p.factor as number } : {}),
      ...(p.min_pixels !== undefined ? { min_pixels: p.min_pixels as number } : {}),
      ...(p.max_pixels !== undefined ? { max_pixels: p.max_pixels as number } : {}),
    },
  };
}

/** The four sampling-mask fields of a decoded trajectory message in their JSON shape; none when it has no mask. */
function samplingMaskFromMessage(
  o: Record<string, unknown>,
): Pick<Trajectory, 'sampling_mask' | 'sampling_mask_coverage' | 'sampling_mask_complete' | 'sampling_mask_violations'> {
  const m = o.sampling_mask as { offsets: number[]; ids: number[]; missing: { start: number; end: number }[] } | undefined;
  if (m === undefined || m === null) return {};
  return {
    sampling_mask: { offsets: m.offsets, ids: m.ids, missing: m.missing.map((r) => [r.start, r.end]) },
    sampling_mask_coverage: (o.sampling_mask_coverage as number | undefined) ?? 0,
    sampling_mask_complete: (o.sampling_mask_complete as boolean | undefined) ?? false,
    sampling_mask_violations: (o.sampling_mask_violations as number | undefined) ?? 0,
  };
}

/** `weight_versions` of a decoded trajectory message, `{version, start, end}` as JSON has them; none when `has_weight_versions` is unset. */
function weightVersionsFromMessage(o: Record<string, unknown>): Pick<Trajectory, 'weight_versions'> {
  if (o.has_weight_versions !== true) return {};
  const spans = o.weight_versions as WeightVersionSpan[];
  return { weight_versions: spans.map((s) => ({ version: s.version, start: s.start, end: s.end })) };
}

/** The transition's keys in the JSON record's order; scalars are copied as they are (optional ones come back as null when unset). */
const TRANSITION_FIELDS = [
  'schema',
  'transition_id',
  'rollout_id',
  'attempt_id',
  'group_id',
  'seq',
  'choice_index',
  'agent_name',
  'model',
  'policy_version',
  'api',
  'request',
  'response',
  'streamed',
  'status',
  'http_status',
  'error',
  'finish_reason',
  'usage',
  'prompt_token_ids',
  'response_token_ids',
  'response_logprobs',
  'continues_previous',
  'tool_calls',
  'intermediate_reward',
  'final_reward',
  'reward',
  'credit',
  'is_last',
  'episode_status',
  'truncated',
  'trace_id',
  'span_id',
  'started_at',
  'ended_at',
  'latency_ms',
  'ttft_ms',
  'injected',
  'translation',
  'token_ids_missing',
  'token_in',
  'upstream_replica',
] as const satisfies readonly Exclude<keyof Transition, 'sampling'>[];

/** The sampling parameters' keys, in their JSON order. */
const SAMPLING_FIELDS = [
  'temperature',
  'top_p',
  'top_k',
  'min_p',
  'seed',
  'presence_penalty',
  'frequency_penalty',
  'repetition_penalty',
  'max_tokens',
] as const satisfies readonly (keyof SamplingParams)[];

/** A decoded `SamplingParams` message in its JSON shape (every key, null where unset); undefined when the record has none. */
function samplingFromMessage(m: unknown): SamplingParams | undefined {
  if (m === undefined || m === null) return undefined;
  const o = m as Record<string, unknown>;
  const out = {} as Record<(typeof SAMPLING_FIELDS)[number], number | null>;
  for (const f of SAMPLING_FIELDS) {
    const v = o[f];
    out[f] = typeof v === 'number' ? v : null;
  }
  const defaults = o.server_defaults as string[] | undefined;
  return defaults !== undefined && defaults.length > 0 ? extend(out, { server_defaults: defaults }) : out;
}

function dropNulls<T extends object>(o: T): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) if (v !== null && v !== undefined) out[k] = v;
  return out;
}
