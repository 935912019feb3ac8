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

export type RoutingDtype = 'uint8' | 'int16' | 'uint16' | 'int32';

export type RoutingArray = Uint8Array | Int16Array | Uint16Array | Int32Array;

/** One call's routing rows: `rows × layers × topK` expert ids, row-major, covering positions `[start, start + rows)`. */
export interface RoutingRows {
  start: number;
  rows: number;
  layers: number;
  topK: number;
  data: RoutingArray;
  /**
   * vLLM v0.21's lists give one row per token, the last sampled one included (its documented
   * shapes are `[prompt_len, …]` and `[gen_len, …]`); that row decided no token of the call and is
   * not used. Unset for the forms that stop at the last token but one.
   */
  rowPerToken?: boolean;
}

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
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  if (!LITTLE_ENDIAN && dtype !== 'uint8') throw new RoutingFormatError('big-endian hosts are not supported');
  switch (dtype) {
    case 'uint8':
      return copy;
    case 'int16':
      return new Int16Array(copy.buffer, 0, count);
    case 'uint16':
      return new Uint16Array(copy.buffer, 0, count);
    case 'int32':
      return new Int32Array(copy.buffer, 0, count);
  }
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * vLLM's `choices[].routed_experts` in either of its forms: the base64 `.npy` string, or v0.21's
 * nested lists (with the response's `prompt_routed_experts` before them when given). `start` is
 * the `routed_experts_prompt_start` the request asked for (0 when it did not).
 */
export function vllmRoutedExperts(value: unknown, promptRows: unknown = null, start = 0): RoutingRows {
  if (typeof value === 'string') {
    if (promptRows !== null && promptRows !== undefined) throw new RoutingFormatError('a .npy routed_experts with prompt_routed_experts beside it');
    const { shape, data } = decodeNpy(Buffer.from(value, 'base64'));
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
  if (typeof value !== 'string') throw new RoutingFormatError(`expected a base64 string, got ${value === null ? 'null' : typeof value}`);
  if (!(Number.isInteger(layers) && layers > 0 && Number.isInteger(topK) && topK > 0))
    throw new RoutingFormatError('the model config must give layers and top_k');
  const bytes = Buffer.from(value, 'base64');
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
}

/** A trajectory's routing: one row per position but the last, with what is missing. */
export interface TrajectoryRouting {
  layers: number;
  topK: number;
  /** `(length - 1) × layers × topK`, narrowed; rows of missing positions hold 0. */
  data: RoutingArray;
  /** Position ranges `[start, end)` with no row (no call routed them, or a call's rows did not fit). */
  missing: [number, number][];
  /** Share of sampled positions whose logits' row is present (row `p - 1` for a sampled token at `p`). */
  coverage: number;
  /** Every row present and every call's rows aligned with its tokens. */
  complete: boolean;
  /** Why it is not complete, one entry a reason. */
  problems: string[];
}

/**
 * The rows of a trajectory of `length` tokens from its turns' routing. Each turn contributes the
 * rows of the positions it added: from the previous turn's last sampled token (whose row that
 * turn could not have) to its own last but one, `[previousEnd - 1, responseEnd - 1)` (from 0 for
 * the first turn), so every sampled token's row comes from the call that sampled it and a prompt
 * row from the first call that ran it. A call's rows must end exactly at its last token but one
 * (`start + rows == responseEnd - 1`), or they are not aligned with its tokens and are not used.
 * Null when no turn has routing.
 */
export function trajectoryRouting(turns: readonly RoutedTurn[], length: number): TrajectoryRouting | null {
  const shaped = turns.find((t) => t.routing !== null)?.routing;
  if (!shaped) return null;
  const { layers, topK } = shaped;
  const width = layers * topK;
  const rows = Math.max(0, length - 1);
  const data = new Int32Array(rows * width);
  const have = new Uint8Array(rows);
  const problems = new Set<string>();
  let from = 0;
  for (const t of turns) {
    const to = Math.min(rows, t.responseEnd - 1);
    const r = t.routing;
    if (r === null) problems.add('a call returned no routing');
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
  return { layers, topK, data: narrow(data), missing, coverage: sampled === 0 ? 1 : covered / sampled, complete: problems.size === 0, problems: [...problems] };
}
