import { resolveIds, type CallFacts } from '../../formats/extract';
import type { ChoiceCapture, TrajectorySamplingMask } from '../../model/records';

/**
 * Checks each choice's sampling mask against its answer: one row per output token (else the mask
 * is dropped, with why, in `samplingMaskError`), and counts the sampled ids that are not among their
 * row's kept ids (`samplingMaskViolations`). `response`: the decoded answer the ids are read from.
 */
export function checkSamplingMasks(call: CallFacts, response: Buffer | null): void {
  for (const c of call.choices) {
    const m = c.samplingMask;
    if (m === undefined) continue;
    const ids = resolveIds(c.responseTokenIds, response);
    const rows = m.offsets.length - 1;
    if (ids === null) {
      c.samplingMaskError = 'the answer has a sampling mask but no token ids to check it against';
      c.samplingMask = undefined;
      continue;
    }
    if (ids.length !== rows) {
      c.samplingMaskError = `the sampling mask has ${rows} rows for ${ids.length} output tokens`;
      c.samplingMask = undefined;
      continue;
    }
    let violations = 0;
    for (let r = 0; r < rows; r++) if (!includes(m.ids, m.offsets[r], m.offsets[r + 1], ids[r])) violations++;
    c.samplingMaskViolations = violations;
  }
}

function includes(ids: Int32Array, from: number, to: number, id: number): boolean {
  for (let i = from; i < to; i++) if (ids[i] === id) return true;
  return false;
}

/** One turn of a segment: where its sampled ids lie in `token_ids`, and its choice. */
export interface MaskedTurn {
  responseStart: number;
  responseEnd: number;
  choice: ChoiceCapture | undefined;
}

/**
 * A segment's sampling masks over `token_ids` positions, in compressed rows: row `p` holds the ids
 * kept when position `p` was sampled, and is empty where nothing was sampled (the prompt, tool
 * output) or no mask came (those sampled ranges are `missing`). Null when no turn's answer had a
 * mask, unless `wanted` (masks were asked for: their absence is then flagged, not silent).
 */
export function trajectorySamplingMask(turns: readonly MaskedTurn[], length: number, wanted: boolean): TrajectorySamplingMask | null {
  if (!wanted && !turns.some((t) => t.choice?.samplingMask !== undefined || t.choice?.samplingMaskError !== undefined)) return null;
  let total = 0;
  for (const t of turns) {
    const m = t.choice?.samplingMask;
    if (m !== undefined) total += m.offsets[m.offsets.length - 1];
  }
  const offsets = new Int32Array(length + 1);
  const ids = new Int32Array(total);
  const missing: [number, number][] = [];
  const problems = new Set<string>();
  let violations = 0;
  let sampled = 0;
  let covered = 0;
  let at = 0;
  let p = 0;
  for (const t of turns) {
    // Positions before the turn's sampled ids (the prompt, what the agent appended): empty rows.
    for (; p < t.responseStart; p++) offsets[p + 1] = at;
    const m = t.choice?.samplingMask;
    sampled += t.responseEnd - t.responseStart;
    if (m === undefined) {
      if (t.responseEnd > t.responseStart) missing.push([t.responseStart, t.responseEnd]);
      problems.add(t.choice?.samplingMaskError ? `a call's sampling mask is unusable (${t.choice.samplingMaskError})` : 'a call returned no sampling mask');
      for (; p < t.responseEnd; p++) offsets[p + 1] = at;
      continue;
    }
    covered += t.responseEnd - t.responseStart;
    violations += t.choice?.samplingMaskViolations ?? 0;
    const base = m.offsets[0];
    ids.set(m.ids.subarray(base, m.offsets[m.offsets.length - 1]), at);
    for (let r = 0; p < t.responseEnd; p++, r++) offsets[p + 1] = at + m.offsets[r + 1] - base;
    at = offsets[p];
  }
  for (; p < length; p++) offsets[p + 1] = at;
  if (violations > 0) problems.add(`${violations} sampled ids are not in their kept set`);
  return {
    offsets,
    ids: ids.subarray(0, at),
    missing,
    coverage: sampled === 0 ? 1 : covered / sampled,
    complete: problems.size === 0,
    violations,
    problems: [...problems],
  };
}
