/**
 * Routed experts (MoE routing replay, "R3"): which experts the inference engine chose, per
 * position, per MoE layer, top-k of them. The engines return them in three wire forms, decoded
 * here into one shape; nothing else in the sidecar needs to know the wire forms.
 *
 * - vLLM, current (about v0.22 on): `choices[].routed_experts` is a string, base64 of a whole
 *   `.npy` file (`np.save`), shape `(rows, layers, top_k)`, dtype narrowed to the expert count
 *   (`|u1`, `<u2`, `<i2`, `<i4`).
 * - vLLM v0.21: nested JSON integer lists, `[rows][layers][top_k]` (int16 values; prefix-cached
 *   positions hold -1), the prompt's rows in a response-level `prompt_routed_experts`, one row
 *   per token (its documented shapes; the row of the last sampled token is not used).
 * - SGLang: `meta_info.routed_experts`, base64 of raw little-endian int32 with no header; the
 *   layer and top-k sizes come from the model's config, not the answer.
 *
 * Rows: row `i` is the forward pass over position `start + i` (it chose the experts that produced
 * the logits of the token at `start + i + 1`), so a call whose prompt and output hold `n` tokens
 * has `n - 1 - start` rows: the last sampled token was never fed back and has none.
 */

import type { RoutingArray, RoutingDtype, RoutingRows, TrajectoryRouting } from '../model/records';

export type { RoutingArray, RoutingDtype, RoutingRows, TrajectoryRouting };

/** An answer's routing could not be read as its engine writes it; the message says what was wrong. */
export class RoutingFormatError extends Error {
  constructor(message: string) {
    super(`routed_experts: ${message}`);
    this.name = 'RoutingFormatError';
  }
}

const NPY_MAGIC = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]);

/** The `.npy` element types the engines write, with their typed arrays. */
const NPY_TYPES: Record<string, { dtype: RoutingDtype; bytes: number }> = {
  '|u1': { dtype: 'uint8', bytes: 1 },
  '<u1': { dtype: 'uint8', bytes: 1 },
  '<i2': { dtype: 'int16', bytes: 2 },
  '<u2': { dtype: 'uint16', bytes: 2 },
  '<i4': { dtype: 'int32', bytes: 4 },
};

/**
 * A `.npy` file (format versions 1 to 3) holding a C-order 3-D integer array of one of the types
 * above: its shape and values. Anything else is a `RoutingFormatError` naming what it found.
 */
export function decodeNpy(file: Buffer): { dtype: RoutingDtype; shape: [number, number, number]; data: RoutingArray } {
  if (file.length < 10 || !file.subarray(0, 6).equals(NPY_MAGIC)) throw new RoutingFormatError('not an .npy file (no \\x93NUMPY magic)');
  const major = file[6];
  let headerLength: number;
  let at: number;
  if (major === 1) {
    headerLength = file.readUInt16LE(8);
    at = 10;
  } else if (major === 2 || major === 3) {
    if (file.length < 12) throw new RoutingFormatError('.npy header cut short');
    headerLength = file.readUInt32LE(8);
    at = 12;
  } else throw new RoutingFormatError(`.npy format version ${major} is not known`);
  if (at + headerLength > file.length) throw new RoutingFormatError('.npy header cut short');
  const header = file.toString(major === 3 ? 'utf8' : 'latin1', at, at + headerLength);
  const descr = /'descr'\s*:\s*'([^']*)'/.exec(header)?.[1];
  const fortran = /'fortran_order'\s*:\s*(True|False)/.exec(header)?.[1];
  const shapeText = /'shape'\s*:\s*\(([^)]*)\)/.exec(header)?.[1];
  if (descr === undefined || fortran === undefined || shapeText === undefined) throw new RoutingFormatError(`.npy header not understood: ${header.trim()}`);
  const type = NPY_TYPES[descr];
  if (!type) throw new RoutingFormatError(`.npy element type ${descr} is not an expert id type (|u1, <u2, <i2, <i4)`);
  if (fortran === 'True') throw new RoutingFormatError('.npy array in Fortran order (the engines write C order)');
  const dims = shapeText
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '')
    .map(Number);
  if (dims.length !== 3 || !dims.every((d) => Number.isSafeInteger(d) && d >= 0))
    throw new RoutingFormatError(`.npy shape (${shapeText}) is not (rows, layers, top_k)`);
  const count = dims[0] * dims[1] * dims[2];
  const body = file.subarray(at + headerLength);
  if (body.length !== count * type.bytes)
    throw new RoutingFormatError(`.npy data holds ${body.length} bytes, shape (${dims.join(', ')}) needs ${count * type.bytes}`);
  return { dtype: type.dtype, shape: dims as [number, number, number], data: typedCopy(body, type.dtype, count) };
}

/** Little-endian bytes as a typed array of their own (aligned; this machine's byte order is checked). */
function typedCopy(bytes: Buffer, dtype: RoutingDtype, count: number): RoutingArray {
  if (!LITTLE_ENDIAN && dtype !== 'uint8') throw new RoutingFormatError('big-endian hosts are not supported');
  // The bytes are the decoder's own (decoded from base64 here): viewed in place when aligned, copied only when not.
  const size = BYTES[dtype];
  const copy = bytes.byteOffset % size === 0 ? new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length) : Uint8Array.from(bytes);
  switch (dtype) {
    case 'uint8':
      return copy;
    case 'int16':
      return new Int16Array(copy.buffer, copy.byteOffset, count);
    case 'uint16':
      return new Uint16Array(copy.buffer, copy.byteOffset, count);
    case 'int32':
      return new Int32Array(copy.buffer, copy.byteOffset, count);
  }
}

const BYTES: Record<RoutingDtype, number> = { uint8: 1, int16: 2, uint16: 2, int32: 4 };

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * vLLM's `choices[].routed_experts` in either of its forms: the base64 `.npy` string, or v0.21's
 * nested lists (with the response's `prompt_routed_experts` before them when given). `start` is
 * the `routed_experts_prompt_start` the request asked for (0 when it did not).
 */
export function vllmRoutedExperts(value: unknown, promptRows: unknown = null, start = 0): RoutingRows {
  // A base64 string, or its bytes decoded already (`base64Range`).
  if (typeof value === 'string' || Buffer.isBuffer(value)) {
    if (promptRows !== null && promptRows !== undefined) throw new RoutingFormatError('a .npy routed_experts with prompt_routed_experts beside it');
    const { shape, data } = decodeNpy(Buffer.isBuffer(value) ? value : Buffer.from(value, 'base64'));
    return { start, rows: shape[0], layers: shape[1], topK: shape[2], data };
  }
  if (!Array.isArray(value)) throw new RoutingFormatError(`expected a base64 .npy string or nested lists, got ${value === null ? 'null' : typeof value}`);
  const prompt = promptRows === null || promptRows === undefined ? [] : promptRows;
  if (!Array.isArray(prompt)) throw new RoutingFormatError('prompt_routed_experts is not a list');
  return nestedRows([...(prompt as unknown[]), ...(value as unknown[])], start);
}

/** v0.21's nested `[rows][layers][top_k]` lists, checked rectangular and integer. */
function nestedRows(rows: unknown[], start: number): RoutingRows {
  const first: unknown[] = Array.isArray(rows[0]) ? (rows[0] as unknown[]) : [];
  const layers = first.length;
  const topK = Array.isArray(first[0]) ? (first[0] as unknown[]).length : 0;
  const data = new Int32Array(rows.length * layers * topK);
  let at = 0;
  rows.forEach((row, r) => {
    if (!Array.isArray(row) || row.length !== layers) throw new RoutingFormatError(`row ${r} does not have ${layers} layers`);
    for (let l = 0; l < layers; l++) {
      const experts: unknown = row[l];
      if (!Array.isArray(experts) || experts.length !== topK) throw new RoutingFormatError(`row ${r} layer ${l} does not have ${topK} experts`);
      for (const e of experts) {
        if (!Number.isInteger(e) || (e as number) < -1 || (e as number) > 0x7fffffff)
          throw new RoutingFormatError(`row ${r} layer ${l}: ${String(e)} is not an expert id`);
        data[at++] = e as number;
      }
    }
  });
  return { start, rows: rows.length, layers, topK, data: narrow(data), rowPerToken: true };
}

/**
 * SGLang's `meta_info.routed_experts`: base64 of raw little-endian int32, `[rows, layers, top_k]`
 * with `layers` and `topK` from the model's config; `start` is the request's `routed_experts_start_len`.
 */
export function sglangRoutedExperts(value: unknown, layers: number, topK: number, start = 0): RoutingRows {
  if (typeof value !== 'string' && !Buffer.isBuffer(value))
    throw new RoutingFormatError(`expected a base64 string, got ${value === null ? 'null' : typeof value}`);
  if (!(Number.isInteger(layers) && layers > 0 && Number.isInteger(topK) && topK > 0))
    throw new RoutingFormatError('the model config must give layers and top_k');
  const bytes = Buffer.isBuffer(value) ? value : Buffer.from(value, 'base64');
  const perRow = layers * topK * 4;
  if (bytes.length % perRow !== 0) throw new RoutingFormatError(`${bytes.length} bytes are not whole rows of ${layers} layers × ${topK} int32 experts`);
  const rows = bytes.length / perRow;
  return { start, rows, layers, topK, data: narrow(typedCopy(bytes, 'int32', rows * layers * topK)) };
}

/**
 * The smallest type that holds every value: `uint8` up to 255, `int16` when -1 (not routed) is
 * among values below 32,768, `uint16` up to 65,535, else `int32`. 48 layers × top-8 is 384 bytes
 * a token in `uint8` (up to 256 experts), against 1,536 in int32.
 */
export function narrow(values: RoutingArray): RoutingArray {
  let min = 0;
  let max = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v < min) min = v;
    if (v > max) max = v;
  }
  const dtype: RoutingDtype = min >= 0 && max <= 0xff ? 'uint8' : min >= -0x8000 && max <= 0x7fff ? 'int16' : min >= 0 && max <= 0xffff ? 'uint16' : 'int32';
  if (dtypeOf(values) === dtype) return values;
  const out =
    dtype === 'uint8'
      ? new Uint8Array(values.length)
      : dtype === 'int16'
        ? new Int16Array(values.length)
        : dtype === 'uint16'
          ? new Uint16Array(values.length)
          : new Int32Array(values.length);
  out.set(values);
  return out;
}

export function dtypeOf(a: RoutingArray): RoutingDtype {
  if (a instanceof Uint8Array) return 'uint8';
  if (a instanceof Int16Array) return 'int16';
  if (a instanceof Uint16Array) return 'uint16';
  return 'int32';
}

/** One turn of a trajectory and the routing its call returned (null: none). */
export interface RoutedTurn {
  /** Where its sampled ids lie in the trajectory's `token_ids`: `[responseStart, responseEnd)`. */
  responseStart: number;
  responseEnd: number;
  routing: RoutingRows | null;
  /** Why its call's routing could not be read (then `routing` is null). */
  error?: string;
}

/**
 * The rows of a trajectory of `length` tokens from its turns' routing. Each turn contributes the
 * rows of the positions it added: from the previous turn's last sampled token (whose row that
 * turn could not have) to its own last but one, `[previousEnd - 1, responseEnd - 1)` (from 0 for
 * the first turn), so every sampled token's row comes from the call that sampled it and a prompt
 * row from the first call that ran it. A call's rows must end exactly at its last token but one
 * (`start + rows == responseEnd - 1`), or they are not aligned with its tokens and are not used.
 * Null when no turn has routing or routing it could not read (a trajectory none of whose calls
 * returned any); when none could be read, the shape is `0 × 0` and every position missing.
 */
export function trajectoryRouting(turns: readonly RoutedTurn[], length: number): TrajectoryRouting | null {
  // One call whose rows cover the whole trajectory as they are: its array is the trajectory's (no copy).
  const only = turns.length === 1 ? turns[0].routing : null;
  if (only !== null && only.start === 0 && only.rows === length - 1 && !only.rowPerToken && only.rows * only.layers * only.topK === only.data.length)
    return { rows: only.rows, layers: only.layers, topK: only.topK, data: narrow(only.data), missing: [], coverage: 1, complete: true, problems: [] };
  const shaped = turns.find((t) => t.routing !== null)?.routing;
  // Routing the server sent but that could not be read is flagged, never left out as if none came.
  if (!shaped && !turns.some((t) => t.error !== undefined)) return null;
  const layers = shaped?.layers ?? 0;
  const topK = shaped?.topK ?? 0;
  const width = layers * topK;
  const rows = Math.max(0, length - 1);
  // In the widest type of the calls' rows (not int32 for all: 32k × 48 × 8 rows are 12 MiB as uint8, 48 as int32).
  const data = arrayOf(widest(turns), rows * width);
  const have = new Uint8Array(rows);
  const problems = new Set<string>();
  let from = 0;
  for (const t of turns) {
    const to = Math.min(rows, t.responseEnd - 1);
    const r = t.routing;
    if (r === null) problems.add(t.error ? `a call's routing could not be read (${t.error})` : 'a call returned no routing');
    else if (r.layers !== layers || r.topK !== topK) problems.add(`a call's rows are ${r.layers} × ${r.topK}, not ${layers} × ${topK}`);
    else if (r.start + r.rows - (r.rowPerToken ? 1 : 0) !== t.responseEnd - 1)
      problems.add(
        `a call's rows cover positions [${r.start}, ${r.start + r.rows}), not up to its last token${r.rowPerToken ? '' : ' but one'} (${t.responseEnd - (r.rowPerToken ? 0 : 1)})`,
      );
    else {
      for (let p = Math.max(from, r.start); p < to; p++) {
        data.set(r.data.subarray((p - r.start) * width, (p - r.start + 1) * width), p * width);
        have[p] = 1;
      }
    }
    from = Math.max(from, to);
  }
  const missing: [number, number][] = [];
  for (let p = 0; p < rows; p++) {
    if (have[p]) continue;
    const last = missing[missing.length - 1];
    if (last && last[1] === p) last[1] = p + 1;
    else missing.push([p, p + 1]);
  }
  if (missing.length > 0) problems.add('positions without a row');
  let sampled = 0;
  let covered = 0;
  for (const t of turns)
    for (let p = Math.max(1, t.responseStart); p < t.responseEnd; p++) {
      sampled++;
      if (have[p - 1]) covered++;
    }
  return {
    rows,
    layers,
    topK,
    data: narrow(data),
    missing,
    coverage: sampled === 0 ? 1 : covered / sampled,
    complete: problems.size === 0,
    problems: [...problems],
  };
}

/** The type that holds the values of every turn's rows. */
function widest(turns: readonly RoutedTurn[]): RoutingDtype {
  const types = new Set(turns.flatMap((t) => (t.routing ? [dtypeOf(t.routing.data)] : [])));
  if (types.has('int32') || (types.has('int16') && types.has('uint16'))) return 'int32';
  if (types.has('int16')) return 'int16';
  if (types.has('uint16')) return 'uint16';
  return 'uint8';
}

function arrayOf(dtype: RoutingDtype, length: number): RoutingArray {
  switch (dtype) {
    case 'uint8':
      return new Uint8Array(length);
    case 'int16':
      return new Int16Array(length);
    case 'uint16':
      return new Uint16Array(length);
    case 'int32':
      return new Int32Array(length);
  }
}

/**
 * Base64 characters decoded at a time (a multiple of 4): no string of the whole value is made, and
 * each is small enough for V8's young generation (strings of MiBs go to its large-object space,
 * freed only by a full collection).
 */
const BASE64_CHUNK = 64 << 10;

/**
 * The bytes a JSON string of base64 at `[start, end)` of `json` (quotes included) stands for,
 * decoded a few MiB at a time into one buffer. A string with escapes (`\/`) is parsed first.
 */
export function base64Range(json: Buffer, start: number, end: number): Buffer {
  if (json[start] !== 0x22 || json[end - 1] !== 0x22) throw new RoutingFormatError('not a JSON string');
  const from = start + 1;
  const to = end - 1;
  if (json.subarray(from, to).includes(0x5c)) return Buffer.from(JSON.parse(json.toString('utf8', start, end)) as string, 'base64');
  const out = Buffer.allocUnsafe(Math.floor(((to - from) * 3) / 4));
  let written = 0;
  for (let at = from; at < to; at += BASE64_CHUNK) written += out.write(json.toString('latin1', at, Math.min(to, at + BASE64_CHUNK)), written, 'base64');
  return out.subarray(0, written);
}
