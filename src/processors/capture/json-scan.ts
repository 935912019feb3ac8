/**
 * Structural scanning of JSON bytes without building objects: skip a value, validate a document,
 * find the members named `key`, read an integer array. Long strings are skipped with
 * `indexOf('"')` (memchr), so the cost is in the structure, not in the text of a prompt.
 *
 * Why key search is exact: inside a JSON string every `"` is escaped, so the bytes `"key"`
 * followed by optional white space and `:`, where the first quote is not escaped, can only be a
 * member name.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

export function skipWs(buf: Buffer, i: number, end = buf.length): number {
  while (i < end) {
    const c = buf[i];
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) break;
    i++;
  }
  return i;
}

/** Index just past the string whose opening quote is at `i`, or -1. */
function skipString(buf: Buffer, i: number, end: number): number {
  let j = i + 1;
  for (;;) {
    const q = buf.indexOf(QUOTE, j);
    if (q < 0 || q >= end) return -1;
    let k = q - 1;
    while (k > i && buf[k] === BACKSLASH) k--;
    // An even number of backslashes before the quote: it closes the string.
    if ((q - 1 - k) % 2 === 0) {
      // Control characters are not allowed raw inside a string.
      return q + 1;
    }
    j = q + 1;
  }
}

function isNumberByte(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x65 || c === 0x45;
}

function literal(buf: Buffer, i: number, end: number, word: string): number {
  if (i + word.length > end) return -1;
  for (let k = 0; k < word.length; k++) if (buf[i + k] !== word.charCodeAt(k)) return -1;
  return i + word.length;
}

/**
 * Index just past the JSON value starting at `i` (after white space), or -1 when it is not a
 * well-formed value. Numbers are checked loosely (their characters), strings for termination.
 */
export function skipValue(buf: Buffer, i: number, end = buf.length): number {
  const stack: number[] = [];
  i = skipWs(buf, i, end);
  for (;;) {
    if (i >= end) return -1;
    const c = buf[i];
    let after: number;
    if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      const close = c === 0x7b ? 0x7d : 0x5d;
      const j = skipWs(buf, i + 1, end);
      if (j < end && buf[j] === close) {
        after = j + 1;
      } else {
        stack.push(close);
        i = j;
        if (close === 0x7d) {
          if (buf[i] !== QUOTE) return -1;
          const k = skipString(buf, i, end);
          if (k < 0) return -1;
          i = skipWs(buf, k, end);
          if (buf[i] !== 0x3a /* : */) return -1;
          i = skipWs(buf, i + 1, end);
        }
        continue;
      }
    } else if (c === QUOTE) {
      after = skipString(buf, i, end);
    } else if (isNumberByte(c)) {
      let j = i + 1;
      while (j < end && isNumberByte(buf[j])) j++;
      after = j;
    } else if (c === 0x74) after = literal(buf, i, end, 'true');
    else if (c === 0x66) after = literal(buf, i, end, 'false');
    else if (c === 0x6e) after = literal(buf, i, end, 'null');
    else return -1;
    if (after < 0) return -1;
    // After a value: close containers or go on to the next element / member.
    i = skipWs(buf, after, end);
    for (;;) {
      if (stack.length === 0) return after;
      const close = stack[stack.length - 1];
      if (i < end && buf[i] === close) {
        stack.pop();
        after = i + 1;
        i = skipWs(buf, after, end);
        continue;
      }
      if (i < end && buf[i] === 0x2c /* , */) {
        i = skipWs(buf, i + 1, end);
        if (close === 0x7d) {
          if (buf[i] !== QUOTE) return -1;
          const k = skipString(buf, i, end);
          if (k < 0) return -1;
          i = skipWs(buf, k, end);
          if (buf[i] !== 0x3a) return -1;
          i = skipWs(buf, i + 1, end);
        }
        break;
      }
      return -1;
    }
  }
}

/** Whether the bytes are one well-formed JSON value (white space around it allowed). */
export function isJson(buf: Buffer, start = 0, end = buf.length): boolean {
  const e = skipValue(buf, start, end);
  return e >= 0 && skipWs(buf, e, end) === end;
}

/** A member `"key": value` found in the bytes: where its name starts and its value lies. */
export interface Member {
  /** Index of the name's opening quote. */
  nameAt: number;
  valueStart: number;
  valueEnd: number;
}

/**
 * Every member named `key` in `[start, end)`, at any depth, in order. Members whose value is
 * malformed are skipped.
 */
export function findMembers(buf: Buffer, key: string, start = 0, end = buf.length): Member[] {
  const needle = Buffer.from(`"${key}"`);
  const out: Member[] = [];
  let from = start;
  for (;;) {
    const at = buf.indexOf(needle, from);
    if (at < 0 || at + needle.length > end) return out;
    from = at + needle.length;
    let k = at - 1;
    while (k >= start && buf[k] === BACKSLASH) k--;
    if ((at - 1 - k) % 2 === 1) continue;
    const colon = skipWs(buf, at + needle.length, end);
    if (colon >= end || buf[colon] !== 0x3a) continue;
    const valueStart = skipWs(buf, colon + 1, end);
    const valueEnd = skipValue(buf, valueStart, end);
    if (valueEnd < 0) continue;
    out.push({ nameAt: at, valueStart, valueEnd });
    from = valueEnd;
  }
}

/**
 * The byte range to delete to remove a member from its object: the member and one comma next to
 * it (the one before it, else the one after it).
 */
export function memberCut(buf: Buffer, m: Member): [number, number] {
  let s = m.nameAt - 1;
  while (s >= 0 && (buf[s] === 0x20 || buf[s] === 0x0a || buf[s] === 0x0d || buf[s] === 0x09)) s--;
  if (s >= 0 && buf[s] === 0x2c) return [s, m.valueEnd];
  const after = skipWs(buf, m.valueEnd);
  if (after < buf.length && buf[after] === 0x2c) return [m.nameAt, after + 1];
  return [m.nameAt, m.valueEnd];
}

/**
 * Reads a JSON array of integers from `[start, end)` into an Int32Array, or null when the bytes
 * are not exactly such an array (a float, a string, an int beyond 32 bits).
 */
export function readIntArray(buf: Buffer, start: number, end: number): Int32Array | null {
  let i = skipWs(buf, start, end);
  if (buf[i] !== 0x5b) return null;
  i++;
  // Upper bound on the count: one element per comma plus one.
  let commas = 0;
  for (let p = buf.indexOf(0x2c, i); p >= 0 && p < end; p = buf.indexOf(0x2c, p + 1)) commas++;
  const out = new Int32Array(commas + 1);
  let n = 0;
  i = skipWs(buf, i, end);
  if (buf[i] === 0x5d) return skipWs(buf, i + 1, end) === end ? new Int32Array(0) : null;
  for (;;) {
    let neg = false;
    if (buf[i] === 0x2d) {
      neg = true;
      i++;
    }
    const digits = i;
    let v = 0;
    while (i < end) {
      const c = buf[i];
      if (c < 0x30 || c > 0x39) break;
      v = v * 10 + (c - 0x30);
      i++;
    }
    if (i === digits || v > 2147483647) return null;
    out[n++] = neg ? -v : v;
    i = skipWs(buf, i, end);
    if (buf[i] === 0x2c) {
      i = skipWs(buf, i + 1, end);
      continue;
    }
    if (buf[i] === 0x5d) {
      if (skipWs(buf, i + 1, end) !== end) return null;
      return out.subarray(0, n);
    }
    return null;
  }
}
