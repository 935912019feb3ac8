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
    if ((q - 1 - k) % 2 === 0) return q + 1;
    j = q + 1;
  }
}

/** Index just past the string at `i`, or -1 when `JSON.parse` would refuse it (a raw control byte, an unknown escape). */
function strictStringEnd(buf: Buffer, i: number, end: number): number {
  for (let j = i + 1; j < end; j++) {
    const c = buf[j];
    if (c === QUOTE) return j + 1;
    if (c < 0x20) return -1;
    if (c !== BACKSLASH) continue;
    const e = buf[++j];
    if (e === 0x75 /* u */) {
      for (let k = 1; k <= 4; k++) if (!isHex(buf[j + k])) return -1;
      j += 4;
    } else if (!ESCAPES.includes(e)) return -1;
  }
  return -1;
}

/** What may follow a backslash in a JSON string, but `u`: `" \ / b f n r t`. */
const ESCAPES = [0x22, 0x5c, 0x2f, 0x62, 0x66, 0x6e, 0x72, 0x74];

function isHex(c: number | undefined): boolean {
  return c !== undefined && ((c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66));
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
 * well-formed value. Numbers are checked loosely (their characters), strings for termination;
 * `strict` checks both as `JSON.parse` does (for values taken out of a body before it is parsed).
 */
export function skipValue(buf: Buffer, i: number, end = buf.length, strict = false): number {
  const str = strict ? strictStringEnd : skipString;
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
          const k = str(buf, i, end);
          if (k < 0) return -1;
          i = skipWs(buf, k, end);
          if (buf[i] !== 0x3a /* : */) return -1;
          i = skipWs(buf, i + 1, end);
        }
        continue;
      }
    } else if (c === QUOTE) {
      after = str(buf, i, end);
    } else if (isNumberByte(c)) {
      let j = i + 1;
      while (j < end && isNumberByte(buf[j])) j++;
      after = strict && numberEnd(buf, i, end) !== j ? -1 : j;
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
          const k = str(buf, i, end);
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

/**
 * Names of the top-level members of the JSON object in `buf`, walking member by member and
 * skipping each value (long strings by memchr); null when `buf` is not one well-formed object.
 */
export function topLevelKeys(buf: Buffer): Set<string> | null {
  const members = topLevelMembers(buf);
  return members === null ? null : new Set(members.keys());
}

/**
 * The top-level members of the JSON object in `buf`: each name and where its value lies (the last
 * of a repeated name, as JSON parsers keep it); null when `buf` is not one well-formed object.
 */
export function topLevelMembers(buf: Buffer): Map<string, [number, number]> | null {
  let i = skipWs(buf, 0);
  if (buf[i] !== 0x7b) return null;
  const keys = new Map<string, [number, number]>();
  i = skipWs(buf, i + 1);
  if (buf[i] === 0x7d) return skipWs(buf, i + 1) === buf.length ? keys : null;
  for (;;) {
    if (buf[i] !== QUOTE) return null;
    const k = skipString(buf, i, buf.length);
    if (k < 0) return null;
    const name = JSON.parse(buf.toString('utf8', i, k)) as string;
    i = skipWs(buf, k);
    if (buf[i] !== 0x3a) return null;
    const start = skipWs(buf, i + 1);
    const v = skipValue(buf, start);
    if (v < 0) return null;
    keys.delete(name);
    keys.set(name, [start, v]);
    i = skipWs(buf, v);
    if (buf[i] === 0x2c) {
      i = skipWs(buf, i + 1);
      continue;
    }
    if (buf[i] === 0x7d && skipWs(buf, i + 1) === buf.length) return keys;
    return null;
  }
}

/** `"key"` as bytes, made once per key (the capture path looks for the same few keys on every call). */
const needles = new Map<string, Buffer>();
function needleOf(key: string): Buffer {
  let n = needles.get(key);
  if (n === undefined) {
    n = Buffer.from(`"${key}"`);
    if (needles.size < 256) needles.set(key, n);
  }
  return n;
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
 * malformed are skipped. `skip`: members, sorted by position, whose values hold no `"` (from
 * `quoteFree`), such as a long prompt's ids between an answer's members. A name begins and ends
 * with a quote, so none begins or ends in such a value, and one that begins before it and ends
 * after it holds all of it: a value at least as long as the name is not searched. The members
 * found are the same as without `skip`.
 */
export function findMembers(
  buf: Buffer,
  key: string,
  start = 0,
  end = buf.length,
  valueEnd: ValueEnd = plainValueEnd,
  skip: readonly Member[] = NO_MEMBERS,
): Member[] {
  const needle = needleOf(key);
  const out: Member[] = [];
  let from = start;
  let s = 0;
  for (;;) {
    while (s < skip.length && (skip[s].valueEnd <= from || skip[s].valueEnd - skip[s].valueStart < needle.length)) s++;
    if (s < skip.length && skip[s].valueStart <= from) {
      from = skip[s].valueEnd;
      continue;
    }
    // Up to the next value skipped (a view: its indices are the buffer's).
    const at = s < skip.length ? buf.subarray(0, skip[s].valueStart).indexOf(needle, from) : buf.indexOf(needle, from);
    if (at < 0) {
      if (s >= skip.length) return out;
      from = skip[s].valueEnd;
      continue;
    }
    if (at + needle.length > end) return out;
    from = at + needle.length;
    let k = at - 1;
    while (k >= start && buf[k] === BACKSLASH) k--;
    if ((at - 1 - k) % 2 === 1) continue;
    const colon = skipWs(buf, at + needle.length, end);
    if (colon >= end || buf[colon] !== 0x3a) continue;
    const valueStart = skipWs(buf, colon + 1, end);
    const stop = valueEnd(buf, valueStart, end);
    if (stop < 0) continue;
    out.push({ nameAt: at, valueStart, valueEnd: stop });
    from = stop;
  }
}

const NO_MEMBERS: readonly Member[] = [];

/** Values shorter than this are searched anyway: skipping one costs more than reading it. */
const SKIP_MIN_BYTES = 1024;

/**
 * Of `members`, those whose values hold no `"` and are at least `minBytes` long (a long array of
 * numbers), sorted by position: what `findMembers` may leave unsearched (its `skip`).
 */
export function quoteFree(buf: Buffer, members: readonly Member[], minBytes = SKIP_MIN_BYTES): Member[] {
  return members
    .filter((m) => m.valueEnd - m.valueStart >= minBytes && buf.subarray(m.valueStart, m.valueEnd).indexOf(QUOTE) < 0)
    .sort((a, b) => a.valueStart - b.valueStart);
}

/** Finds where the value at `i` ends (index past it, or -1 when malformed); may read it on the way. */
export type ValueEnd = (buf: Buffer, i: number, end: number) => number;

function plainValueEnd(buf: Buffer, i: number, end: number): number {
  return flatArrayEnd(buf, i, end) ?? skipValue(buf, i, end);
}

/**
 * The chosen tokens' logprobs in a chat answer's `logprobs` object at `i`
 * (`{"content": [{"token": .., "logprob": -0.1, "bytes": [..], "top_logprobs": [..]}, ..]}`), read
 * from the bytes without building an object per token. `values` is what parsing the object and
 * taking each entry's `logprob` gives: null when `content` is absent, not a list or empty, or when
 * an entry has no finite number there; the last of repeated members counts, as in `JSON.parse`.
 * Returns null when the bytes are not plainly that shape (an escaped member name) or not JSON
 * (every string and number in the object is checked as `JSON.parse` does): the caller then parses
 * them.
 */
export function readChosenLogprobs(buf: Buffer, i: number, end = buf.length): { values: number[] | null; end: number } | null {
  // Nothing past `end` is read: a view ends there (its indices are the buffer's).
  if (end < buf.length) buf = buf.subarray(0, end);
  i = skipWs(buf, i, end);
  if (buf[i] !== 0x7b) return null;
  let values: number[] | null = null;
  i = skipWs(buf, i + 1, end);
  if (buf[i] === 0x7d) return { values, end: i + 1 };
  for (;;) {
    const name = i;
    const v = memberValueAt(buf, i, end);
    if (v < 0) return null;
    if (nameIs(buf, name, 'content')) {
      if (buf[v] === 0x5b) {
        const list: number[] = [];
        i = chosenLogprobs(buf, v, end, list);
        if (i < 0) return null;
        values = list.length > 0 && !list.some(Number.isNaN) ? list : null;
      } else {
        i = skipValue(buf, v, end, true);
        if (i < 0) return null;
        values = null;
      }
    } else {
      i = skipValue(buf, v, end, true);
      if (i < 0) return null;
    }
    i = skipWs(buf, i, end);
    if (buf[i] === 0x2c) {
      i = skipWs(buf, i + 1, end);
      continue;
    }
    return buf[i] === 0x7d ? { values, end: i + 1 } : null;
  }
}

/** Reads the entries of the array at `i` into `out` (NaN for an entry without a finite `logprob`); index past the array, or -1. */
function chosenLogprobs(buf: Buffer, i: number, end: number, out: number[]): number {
  i = skipWs(buf, i + 1, end);
  if (buf[i] === 0x5d) return i + 1;
  for (;;) {
    if (buf[i] === 0x7b) {
      i = entryLogprob(buf, i, end, out);
    } else {
      i = skipValue(buf, i, end, true);
      out.push(NaN);
    }
    if (i < 0) return -1;
    i = skipWs(buf, i, end);
    if (buf[i] === 0x2c) {
      i = skipWs(buf, i + 1, end);
      continue;
    }
    return buf[i] === 0x5d ? i + 1 : -1;
  }
}

/** Pushes the `logprob` of the entry object at `i` (NaN when absent or not a finite number); index past the object, or -1. */
function entryLogprob(buf: Buffer, i: number, end: number, out: number[]): number {
  let value = NaN;
  i = skipWs(buf, i + 1, end);
  if (buf[i] !== 0x7d) {
    for (;;) {
      const name = i;
      const v = memberValueAt(buf, i, end);
      if (v < 0) return -1;
      const logprob = nameIs(buf, name, 'logprob');
      if (logprob && isNumberByte(buf[v])) {
        i = numberEnd(buf, v, end);
        if (i < 0) return -1;
        const x = Number(buf.toString('latin1', v, i));
        value = Number.isFinite(x) ? x : NaN;
      } else {
        // An entry's other members: its token (a string), its bytes (a flat list), its top logprobs.
        i = buf[v] === QUOTE ? strictStringEnd(buf, v, end) : skipValue(buf, v, end, true);
        if (i < 0) return -1;
        if (logprob) value = NaN;
      }
      i = skipWs(buf, i, end);
      if (buf[i] === 0x2c) {
        i = skipWs(buf, i + 1, end);
        continue;
      }
      if (buf[i] !== 0x7d) return -1;
      break;
    }
  }
  out.push(value);
  return i + 1;
}

/** At a member name's opening quote: where its value starts, or -1 (malformed, or a name with escapes). */
function memberValueAt(buf: Buffer, i: number, end: number): number {
  if (buf[i] !== QUOTE) return -1;
  const k = strictStringEnd(buf, i, end);
  if (k < 0) return -1;
  for (let j = i + 1; j < k - 1; j++) if (buf[j] === BACKSLASH) return -1;
  const colon = skipWs(buf, k, end);
  if (buf[colon] !== 0x3a) return -1;
  return skipWs(buf, colon + 1, end);
}

/** Whether the name whose opening quote is at `i` is `word` (a name without escapes). */
function nameIs(buf: Buffer, i: number, word: string): boolean {
  for (let k = 0; k < word.length; k++) if (buf[i + 1 + k] !== word.charCodeAt(k)) return false;
  return buf[i + 1 + word.length] === QUOTE;
}

/** Index just past the JSON number at `i` (JSON's grammar: no `+`, leading zero or bare `.`), or -1. */
function numberEnd(buf: Buffer, i: number, end: number): number {
  if (buf[i] === 0x2d) i++;
  if (i >= end || !isDigit(buf[i])) return -1;
  if (buf[i] === 0x30) i++;
  else while (i < end && isDigit(buf[i])) i++;
  if (i < end && buf[i] === 0x2e) {
    i++;
    if (i >= end || !isDigit(buf[i])) return -1;
    while (i < end && isDigit(buf[i])) i++;
  }
  if (i < end && (buf[i] === 0x65 || buf[i] === 0x45)) {
    i++;
    if (i < end && (buf[i] === 0x2b || buf[i] === 0x2d)) i++;
    if (i >= end || !isDigit(buf[i])) return -1;
    while (i < end && isDigit(buf[i])) i++;
  }
  return i;
}

/**
 * End of an array with no nested array, object or string (token ids, logprobs), found with
 * memchr instead of a byte loop; null when the value is not such an array. Its elements are
 * checked by whoever reads them (`readIntArray`).
 */
function flatArrayEnd(buf: Buffer, i: number, end: number): number | null {
  if (buf[i] !== 0x5b) return null;
  const close = buf.indexOf(0x5d, i + 1);
  if (close < 0 || close >= end) return null;
  const inner = buf.subarray(i + 1, close);
  if (inner.indexOf(0x5b) >= 0 || inner.indexOf(0x7b) >= 0 || inner.indexOf(QUOTE) >= 0) return null;
  return close + 1;
}

/**
 * Whether the int array at `cur` starts with the arrays at `a` then `b` (all JSON text ranges),
 * compared as bytes: true or false when the text decides it, null when it cannot (different
 * spelling, such as spaces after commas, or an empty part): then compare the numbers.
 */
export function startsWithConcat(cur: Buffer, curStart: number, curEnd: number, prev: Buffer, a: [number, number], b: [number, number]): boolean | null {
  const at = concatPrefixEnd(cur, curStart, curEnd, prev, a, b);
  return typeof at === 'number' ? true : at;
}

/**
 * As `startsWithConcat`, with where the prefix ends when it holds: the index in `cur` of the `,`
 * or `]` right after the prefix's last number. What lies there and beyond has not been read.
 */
export function concatPrefixEnd(cur: Buffer, curStart: number, curEnd: number, prev: Buffer, a: [number, number], b: [number, number]): number | false | null {
  const aBody = elementsOf(prev, a);
  const bBody = elementsOf(prev, b);
  if (aBody === null || bBody === null || cur[curStart] !== 0x5b) return null;
  const need = 1 + aBody.length + 1 + bBody.length;
  if (curEnd - curStart < need + 1) return false;
  let at = curStart + 1;
  if (cur.compare(aBody, 0, aBody.length, at, at + aBody.length) !== 0) return null;
  at += aBody.length;
  if (cur[at] !== 0x2c) return null;
  at++;
  if (cur.compare(bBody, 0, bBody.length, at, at + bBody.length) !== 0) return null;
  at += bBody.length;
  // The last number must end where the prefix ends (`...,3` is not a prefix of `...,30`).
  return cur[at] === 0x2c || cur[at] === 0x5d ? at : null;
}

/** The bytes between the brackets of the array at `range` of `buf`; null when it is not an array or is empty. */
function elementsOf(buf: Buffer, range: [number, number]): Buffer | null {
  const body = buf.subarray(range[0] + 1, range[1] - 1);
  return buf[range[0]] === 0x5b && body.length > 0 ? body : null;
}

/**
 * Whether the int array at `cur` starts with the array at `a` (a JSON text range of `prev`) and
 * then the numbers `b` (a streamed answer's ids, assembled from its events): the first part
 * compared as bytes, the second as numbers read from `cur` only as far as `b` goes. true or false
 * when that settles it, null when it cannot (a different spelling, an empty part, a number it
 * cannot read within that stretch): then compare all the numbers. As with `startsWithConcat`,
 * what lies beyond the stretch is not read, so a number there that `readIntArray` would refuse
 * does not make it false.
 */
export function startsWithRangeThen(cur: Buffer, curStart: number, curEnd: number, prev: Buffer, a: [number, number], b: ArrayLike<number>): boolean | null {
  const aBody = elementsOf(prev, a);
  if (aBody === null || b.length === 0 || cur[curStart] !== 0x5b) return null;
  let at = curStart + 1;
  if (curEnd - at < aBody.length + 1 || cur.compare(aBody, 0, aBody.length, at, at + aBody.length) !== 0) return null;
  at += aBody.length;
  if (cur[at] === 0x5d) return false;
  if (cur[at] !== 0x2c) return null;
  for (let k = 0; k < b.length; k++) {
    at = skipWs(cur, at + 1, curEnd);
    let c = cur[at];
    const neg = c === 0x2d;
    if (neg) c = cur[++at];
    if (at >= curEnd || !isDigit(c) || (c === 0x30 && isDigit(cur[at + 1]))) return null;
    let v = 0;
    while (at < curEnd && isDigit(cur[at])) v = v * 10 + (cur[at++] - 0x30);
    if (v > 2147483647) return null;
    at = skipWs(cur, at, curEnd);
    // Anything but the end of an integer: not text this can read.
    if (cur[at] !== 0x2c && cur[at] !== 0x5d) return null;
    if ((neg ? -v : v) !== b[k]) return false;
  }
  return true;
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
 * Bytes of other JSON values that cannot occur in an array of integers (fractions, exponents,
 * literals, strings, nested containers).
 */
const NOT_INT = Buffer.from('.eE+"tfnINa[{]');

/**
 * Whether `[start, end)` holds a flat JSON array whose elements can only be integers (the array is
 * copied into output records as it is). Checked with memchr for every byte of another JSON value,
 * and the array must begin and end with an element (`[,1]`, `[1,]`, `[-]` are refused). Not looked
 * for, because finding them costs a pass over every byte (~300 µs for a 150 KB prompt, measured):
 * an empty element or a sign inside (`[1,,2]`, `[1-2]`), a leading zero (`[01]`), and bytes that
 * belong to no JSON value (`:`); a model server does not send them, and the rest of its answer is
 * parsed. Cheap enough for big arrays on every call.
 */
export function looksLikeIntArray(buf: Buffer, start: number, end: number): boolean {
  if (end - start < 2 || buf[start] !== 0x5b || buf[end - 1] !== 0x5d) return false;
  return intElements(buf.subarray(start + 1, end - 1), true);
}

/**
 * `looksLikeIntArray` for the rest of an array whose start was already found to be one (a
 * prompt that repeats the previous call's prompt and answer, `concatPrefixEnd`): `[at, end)` is
 * `]`, or a comma, integers and `]`. Only the rest is read.
 */
export function looksLikeIntArrayRest(buf: Buffer, at: number, end: number): boolean {
  if (end - at < 1 || buf[end - 1] !== 0x5d) return false;
  if (at === end - 1) return true;
  if (buf[at] !== 0x2c) return false;
  return intElements(buf.subarray(at + 1, end - 1), false);
}

/** Whether `inner` (an array's text between its brackets) holds only integer elements; blank: `empty`. */
function intElements(inner: Buffer, empty: boolean): boolean {
  for (let i = 0; i < NOT_INT.length; i++) if (inner.indexOf(NOT_INT[i]) >= 0) return false;
  const first = skipWs(inner, 0);
  if (first === inner.length) return empty;
  let last = inner.length - 1;
  while (last > first && (inner[last] === 0x20 || inner[last] === 0x0a || inner[last] === 0x0d || inner[last] === 0x09)) last--;
  return (isDigit(inner[first]) || inner[first] === 0x2d) && isDigit(inner[last]);
}

export function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

/**
 * Reads a JSON array of integers from `[start, end)` into an Int32Array, or null when the bytes
 * are not exactly such an array (a float, a string, an int beyond 32 bits).
 */
export function readIntArray(buf: Buffer, start: number, end: number): Int32Array | null {
  let i = skipWs(buf, start, end);
  if (buf[i] !== 0x5b) return null;
  i = skipWs(buf, i + 1, end);
  // At most one element per two bytes ("d,").
  const out = new Int32Array(((end - i) >> 1) + 1);
  let n = 0;
  if (buf[i] === 0x5d) return skipWs(buf, i + 1, end) === end ? out.subarray(0, 0) : null;
  for (;;) {
    let c = buf[i];
    let neg = false;
    if (c === 0x2d) {
      neg = true;
      c = buf[++i];
    }
    if (c < 0x30 || c > 0x39) return null;
    // JSON allows no leading zero (`01`).
    if (c === 0x30 && isDigit(buf[i + 1])) return null;
    let v = 0;
    while (c >= 0x30 && c <= 0x39) {
      v = v * 10 + (c - 0x30);
      c = buf[++i];
    }
    if (v > 2147483647) return null;
    out[n++] = neg ? -v : v;
    if (c === 0x2c) {
      c = buf[++i];
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i = skipWs(buf, i, end);
      continue;
    }
    if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) {
      i = skipWs(buf, i, end);
      c = buf[i];
      if (c === 0x2c) {
        i = skipWs(buf, i + 1, end);
        continue;
      }
    }
    if (c === 0x5d && i < end) return skipWs(buf, i + 1, end) === end ? out.subarray(0, n) : null;
    return null;
  }
}

/**
 * How many elements the flat int array at `[start, end)` holds (one that `looksLikeIntArray`
 * accepts: no strings or nested values, so every comma separates two elements). Counted without
 * reading the numbers.
 */
export function countIntArray(buf: Buffer, start: number, end: number): number {
  if (skipWs(buf, start + 1, end - 1) === end - 1) return 0;
  return countCommas(buf, start + 1, end - 1) + 1;
}

/**
 * The commas in `[start, end)`. A byte loop: with a comma every few bytes (an id array), it costs
 * well under half of what a memchr call per comma does.
 */
export function countCommas(buf: Buffer, start: number, end: number): number {
  let n = 0;
  for (let i = start; i < end; i++) if (buf[i] === 0x2c) n++;
  return n;
}

/** Buffers up to this size are searched for several keys in one walk over their bytes (`findMembersOfEach`). */
const ONE_WALK_MAX = 4096;

/** Keys ready for one walk, made once per list: by the byte after a name's opening quote, which keys may start there (a bit each). */
interface WalkKeys {
  /** The keys it was made for (a list changed since is prepared again). */
  names: string[];
  /** null: keys that are not plain. */
  first: Uint32Array | null;
  /** Where each key's search has reached (reset on each call). */
  from: Int32Array;
}
const walkKeys = new WeakMap<readonly string[], WalkKeys>();

/**
 * The members `findMembers(buf, key)` finds for each of `keys`, all together: in order of position
 * when found in one walk over the bytes instead of one `indexOf` pass per key (a streamed answer's
 * events are small and many, and each pass cost a native call or several), else key by key. Each
 * key keeps its own resume point, as its own search does, so the members are the same for any
 * bytes. Bigger buffers, and keys that are not plain (empty, a byte that is not printable ASCII, a
 * quote or a backslash, more than 30 keys), are searched key by key.
 */
export function findMembersOfEach(buf: Buffer, keys: readonly string[]): Member[] {
  let walk = walkKeys.get(keys);
  if (walk === undefined || !sameKeys(walk.names, keys)) {
    walk = prepareWalk(keys);
    walkKeys.set(keys, walk);
  }
  const { first, from } = walk;
  const n = buf.length;
  if (n > ONE_WALK_MAX || first === null) return keys.flatMap((k) => findMembers(buf, k));
  from.fill(0);
  const out: Member[] = [];
  for (let q = 0; q < n - 1; q++) {
    if (buf[q] !== QUOTE) continue;
    const maybe = first[buf[q + 1]];
    if (maybe === 0) continue;
    for (let k = 0; k < keys.length; k++) {
      if ((maybe & (1 << k)) === 0) continue;
      const key = keys[k];
      const len = key.length;
      // `"key"` at q, not before where this key's search has reached.
      if (q < from[k] || q + len + 2 > n || buf[q + len + 1] !== QUOTE || !sameBytes(buf, q + 1, key)) continue;
      from[k] = q + len + 2;
      let b = q - 1;
      while (b >= 0 && buf[b] === BACKSLASH) b--;
      if ((q - 1 - b) % 2 === 1) continue;
      const colon = skipWs(buf, q + len + 2, n);
      if (colon >= n || buf[colon] !== 0x3a) continue;
      const valueStart = skipWs(buf, colon + 1, n);
      const stop = shortFlatArrayEnd(buf, valueStart, n) ?? skipValue(buf, valueStart, n);
      if (stop < 0) continue;
      out.push({ nameAt: q, valueStart, valueEnd: stop });
      from[k] = stop;
    }
  }
  return out;
}

function prepareWalk(keys: readonly string[]): WalkKeys {
  const walk: WalkKeys = { names: [...keys], first: null, from: new Int32Array(keys.length) };
  if (keys.length > 30) return walk;
  const first = new Uint32Array(256);
  for (let k = 0; k < keys.length; k++) {
    const key = keys[k];
    if (key.length === 0) return walk;
    for (let i = 0; i < key.length; i++) {
      const c = key.charCodeAt(i);
      if (c < 0x20 || c > 0x7e || c === QUOTE || c === BACKSLASH) return walk;
    }
    first[key.charCodeAt(0)] |= 1 << k;
  }
  walk.first = first;
  return walk;
}

function sameKeys(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function sameBytes(buf: Buffer, at: number, key: string): boolean {
  for (let j = 1; j < key.length; j++) if (buf[at + j] !== key.charCodeAt(j)) return false;
  return true;
}

/** `flatArrayEnd` by a walk over the bytes (cheaper than its native calls for a short array). */
function shortFlatArrayEnd(buf: Buffer, i: number, end: number): number | null {
  if (buf[i] !== 0x5b) return null;
  for (let j = i + 1; j < end; j++) {
    const c = buf[j];
    if (c === 0x5d) return j + 1;
    if (c === 0x5b || c === 0x7b || c === QUOTE) return null;
  }
  return null;
}
