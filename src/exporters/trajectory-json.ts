import { dtypeOf } from '../formats/routed-experts';
import type { RoutedExpertsJson, Trajectory, TrajectoryImages, TrajectoryRecord, TrajectoryRouting, TrajectorySamplingMask } from '../model/records';
import { joinPieces, type JsonPiece, type TransitionWriter } from './transition-json';
import { extend } from '../model/extend';

/** `0,0,…` shared by every zero run of the logprobs (grown as needed). */
let zeros = Buffer.alloc(0);
function zeroRun(n: number): Buffer {
  if (zeros.length < 2 * n - 1) zeros = Buffer.alloc(Math.max(2 * n, 2 * zeros.length), '0,');
  return zeros.subarray(0, 2 * n - 1);
}

/** Bytes to be written as their base64 text (a routing's values), a few tens of KiB at a time, never one string. */
class Base64Of implements JsonPiece {
  constructor(private readonly bytes: Buffer) {}

  get length(): number {
    return 4 * Math.ceil(this.bytes.length / 3);
  }

  copy(out: Buffer, at: number): number {
    let written = 0;
    for (let i = 0; i < this.bytes.length; i += BASE64_STEP) written += out.write(this.bytes.toString('base64', i, i + BASE64_STEP), at + written, 'latin1');
    return written;
  }

  /** The text as buffers of its own (32k positions × 48 × 8 are 16 MiB of base64). */
  buffers(): Buffer[] {
    const out: Buffer[] = [];
    for (let i = 0; i < this.bytes.length; i += BASE64_STEP) out.push(Buffer.from(this.bytes.toString('base64', i, i + BASE64_STEP), 'latin1'));
    return out;
  }
}

/**
 * A trajectory's JSON as pieces: the small fields through JSON.stringify, `token_ids` copied from
 * the last call's journaled bytes (its prompt ids, then its answer's), `loss_mask` and `logprobs`
 * written from the turns. Key order is the contract's (docs/output-contract.md).
 */
export function trajectoryJsonParts(writer: TransitionWriter, t: TrajectoryRecord, bulk = true): (string | Buffer)[] {
  return pieces(writer, t, bulk).flatMap((p) => (p instanceof Base64Of ? p.buffers() : [p]));
}

/** The trajectory's JSON bytes in one buffer, written into it piece by piece (no buffer per piece). */
export function trajectoryJson(writer: TransitionWriter, t: TrajectoryRecord): Buffer {
  return joinPieces(pieces(writer, t, true));
}

/** The pieces both writers take, the routing values still bytes (`Base64Of`). */
function pieces(writer: TransitionWriter, t: TrajectoryRecord, bulk: boolean): (string | Buffer | Base64Of)[] {
  const {
    last,
    length: _length,
    turnLogprobs,
    routing,
    weightVersions,
    samplingMask,
    logprobsMode,
    images,
    turns,
    token_rewards,
    reward,
    final_reward,
    episode_status,
    policy_versions,
    started_at,
    ended_at,
    ...head
  } = t;
  const parts: (string | Buffer | Base64Of)[] = [];
  const headText = JSON.stringify(head);
  parts.push(headText.slice(0, -1), ',"token_ids":');
  const prompt = writer.idsBytes(last, last.prompt_token_ids);
  const response = writer.idsBytes(last, last.response_token_ids);
  if (prompt === null || response === null) throw new Error(`trajectory ${t.trajectory_id}: the ids of ${last.transition_id} cannot be read`);
  // The last call's prompt is empty only when its turn starts the segment at 0.
  if (turns[turns.length - 1].response_start === 0) parts.push(response);
  else parts.push(trimEnd(prompt), ',', trimStart(response));
  parts.push(',"loss_mask":', lossMask(t), ',"logprobs":');
  if (turnLogprobs.every((l) => l === null)) parts.push('null');
  else {
    parts.push('[');
    let at = 0;
    let sep = '';
    for (let i = 0; i < turns.length; i++) {
      const { response_start: s, response_end: e } = turns[i];
      const lp = turnLogprobs[i];
      const gapEnd = lp === null ? e : s;
      if (gapEnd > at) {
        parts.push(sep, zeroRun(gapEnd - at));
        sep = ',';
      }
      if (lp !== null) {
        parts.push(sep, JSON.stringify(lp).slice(1, -1));
        sep = ',';
      }
      at = e;
    }
    parts.push(']');
  }
  // Without `bulk` (the viewer): routing rows and mask ids are left out, their coverage kept.
  if (routing !== null && !bulk) parts.push(`,"routing_coverage":${routing.coverage},"routing_complete":${routing.complete}`);
  if (routing !== null && bulk) {
    parts.push(`,"routed_experts":{"dtype":"${dtypeOf(routing.data)}","shape":[${routing.rows},${routing.layers},${routing.topK}],"data":"`);
    parts.push(new Base64Of(routingBytes(routing)));
    parts.push(`","missing":${JSON.stringify(routing.missing)}},"routing_coverage":${routing.coverage},"routing_complete":${routing.complete}`);
  }
  if (weightVersions !== null) parts.push(',"weight_versions":', JSON.stringify(weightVersions));
  // The mask's four fields as `materializeTrajectory` gives them (one list of their names and order).
  if (samplingMask !== null) {
    const coverage = {
      sampling_mask_coverage: samplingMask.coverage,
      sampling_mask_complete: samplingMask.complete,
      sampling_mask_violations: samplingMask.violations,
    };
    parts.push(',', JSON.stringify(bulk ? samplingMaskFields(samplingMask) : coverage).slice(1, -1));
  }
  if (logprobsMode !== null) parts.push(',"logprobs_mode":', JSON.stringify(logprobsMode));
  // A record built before images were recorded has no member at all.
  if (images !== null && images !== undefined) parts.push(',', JSON.stringify(imageFields(images)).slice(1, -1));
  const tail = JSON.stringify({ turns, token_rewards, reward, final_reward, episode_status, policy_versions, started_at, ended_at });
  parts.push(',', tail.slice(1));
  return parts;
}

/**
 * The trajectory as a plain object, its arrays read from the journal (protobuf, dead letters,
 * tests); without its routing fields when `withRouting` is false (protobuf takes the raw bytes).
 */
export function materializeTrajectory(writer: TransitionWriter, t: TrajectoryRecord, withRouting = true): Trajectory {
  const { last, length, turnLogprobs, routing, weightVersions, samplingMask, logprobsMode, images, ...rest } = t;
  const prompt = writer.ids(last, last.prompt_token_ids);
  const response = writer.ids(last, last.response_token_ids);
  if (prompt === null || response === null) throw new Error(`trajectory ${t.trajectory_id}: the ids of ${last.transition_id} cannot be read`);
  const mask = new Array<number>(length).fill(0);
  const logprobs = turnLogprobs.every((l) => l === null) ? null : new Array<number>(length).fill(0);
  t.turns.forEach((turn, i) => {
    mask.fill(1, turn.response_start, turn.response_end);
    const lp = turnLogprobs[i];
    if (logprobs && lp) for (let k = 0; k < lp.length; k++) logprobs[turn.response_start + k] = lp[k];
  });
  const { turns, token_rewards, reward, final_reward, episode_status, policy_versions, started_at, ended_at, ...head } = rest;
  return extend(head, {
    token_ids: prompt.concat(response),
    loss_mask: mask,
    logprobs,
    ...(routing !== null && withRouting ? routingFields(routing) : {}),
    ...(weightVersions !== null ? { weight_versions: weightVersions } : {}),
    ...(samplingMask !== null ? samplingMaskFields(samplingMask) : {}),
    ...(logprobsMode !== null ? { logprobs_mode: logprobsMode } : {}),
    ...(images !== null && images !== undefined ? imageFields(images) : {}),
    turns,
    token_rewards,
    reward,
    final_reward,
    episode_status,
    policy_versions,
    started_at,
    ended_at,
  });
}

/** A trajectory's images as their four JSON fields (docs/images.md), in one order for both writers. */
export function imageFields(i: TrajectoryImages): Pick<Trajectory, 'images' | 'images_complete' | 'images_error' | 'image_processor'> {
  return { images: i.images, images_complete: i.complete, images_error: i.error, image_processor: i.processor };
}

/** A trajectory's routing as its three JSON fields (docs/output-contract.md#routed-experts). */
export function routingFields(r: TrajectoryRouting): { routed_experts: RoutedExpertsJson; routing_coverage: number; routing_complete: boolean } {
  return {
    routed_experts: { dtype: dtypeOf(r.data), shape: [r.rows, r.layers, r.topK], data: routingBytes(r).toString('base64'), missing: r.missing },
    routing_coverage: r.coverage,
    routing_complete: r.complete,
  };
}

/** A trajectory's sampling masks as their four JSON fields (docs/output-contract.md#sampling-masks). */
export function samplingMaskFields(
  m: TrajectorySamplingMask,
): Pick<Trajectory, 'sampling_mask' | 'sampling_mask_coverage' | 'sampling_mask_complete' | 'sampling_mask_violations'> {
  return {
    sampling_mask: { offsets: Array.from(m.offsets), ids: Array.from(m.ids), missing: m.missing },
    sampling_mask_coverage: m.coverage,
    sampling_mask_complete: m.complete,
    sampling_mask_violations: m.violations,
  };
}

/** The routing values' bytes (little-endian: the typed array's own, on the little-endian hosts the decoder accepts). */
export function routingBytes(r: TrajectoryRouting): Buffer {
  return Buffer.from(r.data.buffer, r.data.byteOffset, r.data.byteLength);
}

/**
 * Bytes of routing turned into base64 at a time: a multiple of 3, so the pieces join into one
 * base64 text; 64 KiB of text, small enough for V8's young generation (strings of MiBs go to its
 * large-object space, freed only by a full collection).
 */
const BASE64_STEP = 3 << 14;

/** `[…]` as `[…` (the closing bracket and any white space before it dropped). */
function trimEnd(array: Buffer): Buffer {
  let end = array.length - 1;
  while (end > 1 && (array[end - 1] === 0x20 || array[end - 1] === 0x0a || array[end - 1] === 0x0d || array[end - 1] === 0x09)) end--;
  return array.subarray(0, end);
}

/** `[…]` as `…]`. */
function trimStart(array: Buffer): Buffer {
  return array.subarray(1);
}

/** `[0,0,1,1,0,1]`: 1 on each turn's sampled ids. */
function lossMask(t: TrajectoryRecord): Buffer {
  const out = Buffer.allocUnsafe(2 * t.length + 1);
  out[0] = 0x5b;
  out.fill('0,', 1, 1 + 2 * t.length);
  for (const turn of t.turns) out.fill('1,', 1 + 2 * turn.response_start, 1 + 2 * turn.response_end);
  out[2 * t.length] = 0x5d;
  return out;
}
