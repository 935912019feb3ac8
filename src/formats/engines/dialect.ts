import type { Api, ChoiceCapture, RoutingRows, SamplingMaskRows, WeightVersionSpan, WireRouting } from '../../model/records';

export type { WireRouting } from '../../model/records';

/**
 * What the sidecar knows of one inference engine's wire dialect, in one place: which request
 * members make it return token ids and logprobs, routed experts and sampling masks; which members
 * of its answer those bring (given back to the agent as null when the agent did not ask); where in
 * its answer routing, weight versions and masks are; how its routing is encoded. Adding a third
 * engine is one more module implementing this, and its tests (docs/architecture.md).
 */
export interface EngineDialect {
  /** The flavor name (`receivers.llm_proxy.upstream_flavor`), also its `owned_by` in `GET /v1/models`. */
  readonly name: EngineName;
  /** Request members, as JSON text, that make the server return token ids and logprobs, by API. */
  readonly idsFields: Partial<Record<Api, Record<string, string>>>;
  /** Request members that make it return routed experts (null: it returns them when started with its flag, unasked). */
  readonly routingFields: Record<string, string> | null;
  /**
   * Request members that make it return sampling masks for a call of this API (streamed or not);
   * null when it gives none there.
   */
  maskFields(api: Api, streamed: boolean): Record<string, string> | null;
  /** Where masks come from, for the start-up line and /readyz when they are asked for. */
  readonly maskRoutes: string;
  /** Answer members each request member brings (the agent gets null for those it did not ask for). */
  readonly brought: Record<string, readonly string[]>;
  /**
   * Reads the choice's engine extras (routing as written, weight versions, sampling mask) from its
   * answer object `c` and the whole answer `res`; false when none of this engine's fields is there.
   */
  readChoice(choice: ChoiceCapture, c: Record<string, unknown>, res: Record<string, unknown>): boolean;
  /** Decodes routing as `readChoice` kept it (`value`: the wire string's bytes or its parsed value). */
  decodeRouting(value: unknown, kept: WireRouting, request: RoutingRequest): RoutingRows;
}

export type EngineName = 'vllm' | 'sglang';

/** What decoding routing needs besides the answer: the request's own numbers, and the model's shape where the wire form has none. */
export interface RoutingRequest {
  /** A non-negative integer top-level member of the request the server got (0 when absent). */
  requested(key: string): number;
  /** SGLang's routing shape (`processors.routed_experts.sglang`); null when not configured. */
  shape: { layers: number; topK: number } | null;
}

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Weight-version spans as both engines write them (`[{version, start, end}]` over output-token
 * indexes): in order, non-overlapping, with a string or number version; anything else is none.
 */
export function versionSpans(spans: unknown): WeightVersionSpan[] | null {
  if (!Array.isArray(spans)) return null;
  const out: WeightVersionSpan[] = [];
  let at = 0;
  for (const s of spans) {
    if (!isRecord(s) || !Number.isSafeInteger(s.start) || !Number.isSafeInteger(s.end)) return null;
    const [start, end] = [s.start as number, s.end as number];
    if (start < at || end < start || (typeof s.version !== 'string' && typeof s.version !== 'number')) return null;
    out.push({ version: String(s.version), start, end });
    at = end;
  }
  return out;
}

/**
 * A sampling mask as both engines write it (one list of kept token ids per generated token) in
 * compressed rows: `offsets` (rows + 1) into `ids`. Sets `samplingMaskError` instead when it is
 * not a list of lists of non-negative integers.
 */
export function readSamplingMask(choice: ChoiceCapture, v: unknown): void {
  if (v === undefined || v === null) return;
  if (!Array.isArray(v)) {
    choice.samplingMaskError = `the sampling mask is ${typeof v}, not a list per token`;
    return;
  }
  let n = 0;
  for (const row of v) {
    if (!Array.isArray(row)) {
      choice.samplingMaskError = 'a sampling mask row is not a list of token ids';
      return;
    }
    n += row.length;
  }
  const offsets = new Int32Array(v.length + 1);
  const ids = new Int32Array(n);
  let at = 0;
  for (let r = 0; r < v.length; r++) {
    for (const id of v[r] as unknown[]) {
      if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id > 0x7fffffff) {
        choice.samplingMaskError = `sampling mask row ${r} holds ${JSON.stringify(id)}, not a token id`;
        return;
      }
      ids[at++] = id;
    }
    offsets[r + 1] = at;
  }
  choice.samplingMask = { offsets, ids } satisfies SamplingMaskRows;
}
