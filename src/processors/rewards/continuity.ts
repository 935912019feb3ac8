import type { TokenIds } from '../../model/records';
import { countIntArray, startsWithConcat, startsWithRangeThen } from '../../formats/json-scan';
import { resolveIds } from '../../formats/extract';

/** A call's prompt and answer ids and the response body their ranges point into. */
export interface Ids {
  body: Buffer | null;
  prompt: TokenIds | null;
  response: TokenIds | null;
}

/** Whether `cur`'s prompt starts with `prev`'s prompt and answer: by bytes when the text decides, else by numbers. */
export function continuesFrom(cur: Ids, prev: Ids): boolean {
  if (cur.prompt === null || prev.prompt === null || prev.response === null) return false;
  if (!Array.isArray(cur.prompt) && !Array.isArray(prev.prompt) && !Array.isArray(prev.response) && cur.body && prev.body) {
    const byBytes = startsWithConcat(
      cur.body,
      cur.prompt.start,
      cur.prompt.end,
      prev.body,
      [prev.prompt.start, prev.prompt.end],
      [prev.response.start, prev.response.end],
    );
    if (byBytes !== null) return byBytes;
  }
  // A streamed answer's ids are numbers (assembled from its events): the prompts are still
  // compared as bytes, and only the answer's stretch of the current prompt is read.
  if (!Array.isArray(cur.prompt) && !Array.isArray(prev.prompt) && Array.isArray(prev.response) && cur.body && prev.body) {
    const byBytes = startsWithRangeThen(cur.body, cur.prompt.start, cur.prompt.end, prev.body, [prev.prompt.start, prev.prompt.end], prev.response);
    if (byBytes !== null) return byBytes;
  }
  const prompt = resolveIds(cur.prompt, cur.body);
  const p = resolveIds(prev.prompt, prev.body);
  const r = resolveIds(prev.response, prev.body);
  return prompt !== null && p !== null && r !== null && startsWith(prompt, concatIds(p, r));
}

/** Whether two id arrays are the same ids: equal bytes settle it, else the numbers are compared. */
export function sameIds(a: TokenIds, aBody: Buffer | null, b: TokenIds, bBody: Buffer | null): boolean {
  if (!Array.isArray(a) && !Array.isArray(b) && aBody && bBody) {
    if (a.end - a.start === b.end - b.start && aBody.compare(bBody, b.start, b.end, a.start, a.end) === 0) return true;
  }
  const x = resolveIds(a, aBody);
  const y = resolveIds(b, bBody);
  return x !== null && y !== null && x.length === y.length && startsWith(x, y);
}

/** How many ids an array holds (a range is counted from its text, not read). */
export function idsLength(ids: TokenIds, body: Buffer | null): number | null {
  if (Array.isArray(ids)) return ids.length;
  return body === null ? null : countIntArray(body, ids.start, ids.end);
}

export function concatIds(a: ArrayLike<number>, b: ArrayLike<number>): Int32Array {
  const out = new Int32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** Whether `ids` starts with `prefix` (an empty prefix starts nothing). */
export function startsWith(ids: ArrayLike<number>, prefix: ArrayLike<number>): boolean {
  if (prefix.length === 0 || prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}
