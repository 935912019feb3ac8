import fc from 'fast-check';
import {
  findMembers,
  isJson,
  looksLikeIntArray,
  memberCut,
  quoteFree,
  readChosenLogprobs,
  readIntArray,
  skipValue,
  startsWithConcat,
  startsWithRangeThen,
  topLevelKeys,
} from '../../../src/formats/json-scan';
import { logprobList } from '../../../src/formats/adapters/shape';
import { idArrays } from '../../../src/formats/extract';

/** Fixed seed: CI runs the same cases every time; change it to explore. */
const RUN = { seed: 20261123, numRuns: 400 };

/** JSON text with random white space between tokens (what servers and agents may send). */
function spaced(value: unknown, ws: string[]): string {
  let k = 0;
  const w = () => ws[k++ % ws.length];
  const go = (v: unknown): string => {
    if (Array.isArray(v)) return `[${w()}${v.map((x) => go(x)).join(`${w()},${w()}`)}${w()}]`;
    if (v !== null && typeof v === 'object')
      return `{${w()}${Object.entries(v)
        .map(([key, x]) => `${JSON.stringify(key)}${w()}:${w()}${go(x)}`)
        .join(`${w()},${w()}`)}${w()}}`;
    return JSON.stringify(v);
  };
  return go(value);
}

const whitespace = fc.array(fc.constantFrom('', ' ', '\n', '\t', '\r\n'), { minLength: 1, maxLength: 5 });
/** Keys that collide with the ones the capture looks for, and hostile ones (quotes, backslashes). */
const key = fc.oneof(fc.constantFrom('prompt_token_ids', 'token_ids', 'logprobs', 'model', 'a\\"token_ids', 'x"'), fc.string({ maxLength: 6 }));
const value = fc.letrec((tie) => ({
  leaf: fc.oneof(
    fc.integer(),
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.boolean(),
    fc.constant(null),
    fc.string({ maxLength: 8 }),
    fc.constantFrom('"prompt_token_ids":[1,2]', '\\', '"token_ids"'),
  ),
  arr: fc.array(tie('node'), { maxLength: 4 }),
  obj: fc.dictionary(key, tie('node'), { maxKeys: 4 }),
  node: fc.oneof({ depthSize: 'small' }, tie('leaf'), tie('arr'), tie('obj')),
})).node;

/** Every member named `name`, at any depth, by walking the parsed value (document order). */
function membersOf(v: unknown, name: string, out: unknown[] = []): unknown[] {
  if (Array.isArray(v)) v.forEach((x) => membersOf(x, name, out));
  else if (v !== null && typeof v === 'object') {
    for (const [k, x] of Object.entries(v)) {
      if (k === name) out.push(x);
      membersOf(x, name, out);
    }
  }
  return out;
}

describe('structural JSON scanning agrees with JSON.parse', () => {
  it('skips every well-formed value exactly, whatever the white space', () => {
    fc.assert(
      fc.property(value, whitespace, (v, ws) => {
        const text = spaced(v, ws);
        const buf = Buffer.from(` ${text} `);
        expect(isJson(buf)).toBe(true);
        expect(skipValue(buf, 0)).toBe(1 + Buffer.byteLength(text));
      }),
      RUN,
    );
  });

  it('finds exactly the members of a name, never text inside strings that looks like one', () => {
    fc.assert(
      fc.property(value, whitespace, fc.constantFrom('prompt_token_ids', 'token_ids', 'logprobs'), (v, ws, name) => {
        const buf = Buffer.from(spaced(v, ws));
        const found = findMembers(buf, name).map((m) => JSON.parse(buf.toString('utf8', m.valueStart, m.valueEnd)) as unknown);
        // Nested members of the same name inside a found value are skipped with it.
        const expected = membersOf(v, name);
        expect(expected).toEqual(expect.arrayContaining(found));
        expect(found.length).toBeGreaterThanOrEqual(Math.min(1, expected.length));
      }),
      RUN,
    );
  });

  it('finds the same members when it goes around values without a quote, in any bytes', () => {
    // Documents, and text that is not JSON: the pieces a member search meets, in any order.
    const piece = fc.constantFrom('"', '\\', ':', ' ', ',', '[', ']', '{', '}', '1', '23', '"token_ids"', '"prompt_token_ids"', '"logprobs"', 'a');
    const bytes = fc.oneof(
      // A name that holds a whole short value without a quote: `":[1]"` from the `"` closing
      // `"prompt_token_ids"` on; one not longer than the needle is searched.
      fc.constantFrom('{"prompt_token_ids":[1]":1}', '{"prompt_token_ids":[1,2]":1}'),
      value.map((v) => spaced(v, [''])),
      fc.tuple(value, whitespace).map(([v, ws]) => spaced(v, ws)),
      fc.array(piece, { maxLength: 60 }).map((p) => p.join('')),
      fc
        .tuple(fc.array(fc.integer({ min: 0, max: 99 }), { maxLength: 40 }), fc.array(piece, { maxLength: 20 }))
        .map(([ints, p]) => `{"prompt_token_ids":[${ints.join(',')}],${p.join('')}"token_ids":[${ints.slice(0, 3).join(',')}]}`),
    );
    fc.assert(
      fc.property(bytes, fc.constantFrom('prompt_token_ids', 'token_ids', 'logprobs', 'model', '1,2', 'a', ':[1]'), fc.nat(8), (text, name, minBytes) => {
        const buf = Buffer.from(text);
        // Skipped: the values of the id members without a quote, however short (the needle's
        // length decides then), or long.
        const skip = quoteFree(buf, [...findMembers(buf, 'prompt_token_ids'), ...findMembers(buf, 'token_ids')], minBytes);
        expect(findMembers(buf, name, 0, buf.length, undefined, skip)).toEqual(findMembers(buf, name));
        const old = ['prompt_token_ids', 'token_ids'].flatMap((k) => findMembers(buf, k).filter((m) => buf[m.valueStart] === 0x5b));
        expect(idArrays(buf, ['prompt_token_ids', 'token_ids']).members).toEqual(old);
      }),
      { ...RUN, numRuns: 1500 },
    );
  });

  it('goes around a long array of ids: a member after it is found, none inside it', () => {
    const ids = Array.from({ length: 3000 }, (_, i) => (i * 7919) % 151_000);
    const buf = Buffer.from(`{"choices":[{"token_ids":[5,6],"logprobs":null}],"prompt_token_ids":[${ids.join(',')}],"routed_experts":"QUJD"}`);
    const { members, skip } = idArrays(buf, ['prompt_token_ids', 'token_ids']);
    expect(members.map((m) => buf.toString('latin1', m.nameAt, m.nameAt + 12))).toEqual(['"prompt_toke', '"token_ids":']);
    expect(skip).toHaveLength(1);
    expect(skip[0].valueEnd - skip[0].valueStart).toBeGreaterThan(10_000);
    const [routed] = findMembers(buf, 'routed_experts', 0, buf.length, undefined, skip);
    expect(buf.toString('latin1', routed.valueStart, routed.valueEnd)).toBe('"QUJD"');
    expect(findMembers(buf, 'logprobs', 0, buf.length, undefined, skip)).toHaveLength(1);
  });

  it('cuts a member out and leaves a document equal to the value without it', () => {
    const others = fc.dictionary(
      fc.string({ maxLength: 6 }).filter((k) => k !== 'token_ids'),
      value.filter((v) => membersOf(v, 'token_ids').length === 0),
      { maxKeys: 4 },
    );
    fc.assert(
      fc.property(others, value, fc.nat(), whitespace, (rest, ids, at, ws) => {
        const entries = Object.entries(rest);
        entries.splice(at % (entries.length + 1), 0, ['token_ids', ids]);
        const doc = Object.fromEntries(entries);
        const buf = Buffer.from(spaced(doc, ws));
        expect(topLevelKeys(buf)).toEqual(new Set(Object.keys(doc)));
        const [m] = findMembers(buf, 'token_ids');
        const [s, e] = memberCut(buf, m);
        expect(JSON.parse(Buffer.concat([buf.subarray(0, s), buf.subarray(e)]).toString('utf8'))).toEqual(JSON.parse(JSON.stringify(rest)));
      }),
      RUN,
    );
  });

  it('reads integer arrays as JSON.parse does and refuses anything else', () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: -(2 ** 31) + 1, max: 2 ** 31 - 1 }), { maxLength: 50 }), whitespace, (ids, ws) => {
        const buf = Buffer.from(spaced(ids, ws));
        expect(Array.from(readIntArray(buf, 0, buf.length) ?? [-1])).toEqual(ids.length === 0 ? [] : ids);
      }),
      RUN,
    );
    for (const bad of ['[1.5]', '[1,]', '["1"]', '[1e3]', '[null]', '[2147483648]', '{}', '[1 2]'])
      expect(readIntArray(Buffer.from(bad), 0, bad.length)).toBeNull();
  });

  it('takes bytes for an integer array (copied into records as they are) only where JSON.parse reads one, but for the shapes it does not look for', () => {
    // Every byte an array of numbers can hold, arranged at random: most arrangements are not JSON.
    const bytes = fc.array(fc.constantFrom('0', '1', '7', '9', ',', '-', ' ', ']'), { maxLength: 12 });
    // What looksLikeIntArray leaves unchecked (a pass over every byte): empty elements, signs
    // inside, leading zeros.
    const unchecked = /,\s*,|-\s*[,\-\s]|\d\s*-|(^|[^\d])0\d|\d\s+\d/;
    fc.assert(
      fc.property(bytes, (chars) => {
        const text = `[${chars.join('')}]`;
        const buf = Buffer.from(text);
        let parsed: unknown = undefined;
        try {
          parsed = JSON.parse(text);
        } catch {
          // Not JSON.
        }
        const ints = Array.isArray(parsed) && parsed.every((x) => Number.isInteger(x));
        if (looksLikeIntArray(buf, 0, buf.length) && !ints) expect(text).toMatch(unchecked);
        const read = readIntArray(buf, 0, buf.length);
        if (read !== null) expect(Array.from(read)).toEqual((parsed as number[]).map((x) => (x === 0 ? 0 : x)));
      }),
      { ...RUN, numRuns: 4000 },
    );
    fc.assert(
      fc.property(fc.array(fc.integer({ min: -(2 ** 31) + 1, max: 2 ** 31 - 1 }), { maxLength: 40 }), whitespace, (ids, ws) => {
        const buf = Buffer.from(spaced(ids, ws));
        expect(looksLikeIntArray(buf, 0, buf.length)).toBe(true);
      }),
      RUN,
    );
    for (const bad of ['[,1]', '[1,]', '[-]', '[1]2]', '[1, ]', '[ -]', '[1.5]', '[true]'])
      expect([bad, looksLikeIntArray(Buffer.from(bad), 0, bad.length)]).toEqual([bad, false]);
  });

  it('decides prefix continuity by bytes only when the text settles it, and then as the numbers do', () => {
    const ints = fc.array(fc.integer({ min: 0, max: 300 }), { minLength: 1, maxLength: 12 });
    fc.assert(
      fc.property(ints, ints, ints, fc.boolean(), (a, b, extra, spacedOut) => {
        const prev = Buffer.from(`${JSON.stringify(a)}${JSON.stringify(b)}`);
        const cont = [...a, ...b, ...extra];
        const cur = Buffer.from(spacedOut ? cont.join(', ').replace(/^/, '[').concat(']') : JSON.stringify(cont));
        const aEnd = JSON.stringify(a).length;
        const r = startsWithConcat(cur, 0, cur.length, prev, [0, aEnd], [aEnd, prev.length]);
        if (r !== null) expect(r).toBe(true);
        // A prompt that only shares a spelling prefix is not a continuation.
        const other = Buffer.from(JSON.stringify([...a, ...b.slice(0, -1), b[b.length - 1] * 10 + 1, ...extra]));
        const r2 = startsWithConcat(other, 0, other.length, prev, [0, aEnd], [aEnd, prev.length]);
        expect(r2 === true).toBe(false);
      }),
      RUN,
    );
  });

  it('never reads a logprobs object that JSON.parse refuses', () => {
    // Valid objects with one byte inserted, changed or deleted: most are not JSON any more.
    const lp = fc.record({
      content: fc.array(
        fc.record({
          token: fc.string({ maxLength: 4 }),
          logprob: fc.double({ noNaN: true, noDefaultInfinity: true }),
          bytes: fc.array(fc.nat(255), { maxLength: 3 }),
        }),
        { minLength: 1, maxLength: 4 },
      ),
    });
    const noise = fc.constantFrom(...'{}[]:,"\\-+.eE0123456789 \n\u0001tfnu'.split(''));
    let declined = 0;
    fc.assert(
      fc.property(lp, fc.nat(), noise, fc.constantFrom('insert', 'replace', 'delete'), (v, at, ch, how) => {
        const text = JSON.stringify(v);
        const k = at % text.length;
        const bad =
          how === 'insert'
            ? text.slice(0, k) + ch + text.slice(k)
            : how === 'replace'
              ? text.slice(0, k) + ch + text.slice(k + 1)
              : text.slice(0, k) + text.slice(k + 1);
        const buf = Buffer.from(bad);
        const r = readChosenLogprobs(buf, 0, buf.length);
        let parsed: unknown;
        try {
          parsed = JSON.parse(bad);
        } catch {
          parsed = undefined;
        }
        // Read only where the whole text is one JSON value that parses.
        if (r !== null && r.end === buf.length) {
          expect(parsed).toBeDefined();
          const content = (parsed as { content?: unknown }).content;
          expect(r.values).toEqual(
            logprobList(content, (e) => (e !== null && typeof e === 'object' && !Array.isArray(e) ? (e as Record<string, unknown>).logprob : undefined)),
          );
        } else declined++;
      }),
      { ...RUN, numRuns: 3000 },
    );
    expect(declined).toBeGreaterThan(300);
  });

  it('decides continuity after a streamed answer (its ids numbers, the prompts bytes) as the numbers do, when it decides', () => {
    const ints = fc.array(fc.integer({ min: -3, max: 300 }), { minLength: 0, maxLength: 10 });
    const startsWith = (ids: number[], prefix: number[]) => prefix.length > 0 && prefix.length <= ids.length && prefix.every((x, i) => ids[i] === x);
    let decided = 0;
    fc.assert(
      fc.property(ints, ints, ints, fc.nat(3), fc.integer({ min: -1, max: 12 }), fc.boolean(), (a, b, extra, how, at, spacedOut) => {
        // The current prompt: a continuation, a truncated one, one with a number changed, or another.
        let cur = [...a, ...b, ...extra];
        if (how === 1) cur = cur.slice(0, Math.max(0, a.length + b.length - 1));
        if (how === 2 && cur.length > 0) cur[Math.max(0, Math.min(cur.length - 1, at))] += 10;
        if (how === 3) cur = [...a.slice(0, at), ...extra];
        const prev = Buffer.from(`xx${JSON.stringify(a)}`);
        const text = Buffer.from(`y${spacedOut ? `[ ${cur.join(' , ')} ]` : JSON.stringify(cur)}`);
        const r = startsWithRangeThen(text, 1, text.length, prev, [2, prev.length], b);
        const expected = startsWith(cur, [...a, ...b]);
        if (r !== null) {
          decided++;
          expect(r).toBe(expected);
        }
      }),
      { ...RUN, numRuns: 2000 },
    );
    // Not vacuous: the cases spelled alike with both parts non-empty (about a third) are settled by
    // the bytes and the answer's stretch alone.
    expect(decided).toBeGreaterThan(400);
  });

  it('reads the chosen logprobs of a chat logprobs object as parsing it does, or declines', () => {
    // Entries as servers send them, and the odd ones: no logprob, a string or null there, a
    // repeated logprob (the last counts), a non-object entry, extra members at either level.
    const number = fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), fc.integer(), fc.constantFrom(-0, -9999, 1e-30, -1.5e300));
    const entry = fc.oneof(
      fc.record({
        token: fc.string({ maxLength: 6 }),
        logprob: number,
        bytes: fc.array(fc.nat(255), { maxLength: 4 }),
        top_logprobs: fc.array(fc.record({ token: fc.string({ maxLength: 4 }), logprob: number }), { maxLength: 2 }),
      }),
      fc.record({ token: fc.string({ maxLength: 6 }) }),
      fc.record({ logprob: fc.oneof(fc.string({ maxLength: 3 }), fc.constant(null), fc.array(number, { maxLength: 2 })) }),
      value,
    );
    const logprobs = fc.oneof(
      fc.record({ content: fc.array(entry, { maxLength: 6 }) }),
      fc.record({ content: fc.array(entry, { maxLength: 6 }), refusal: value }),
      fc.record({ refusal: value, content: fc.oneof(fc.constant(null), value) }),
      fc.dictionary(key, value, { maxKeys: 3 }),
    );
    fc.assert(
      fc.property(logprobs, whitespace, (lp, ws) => {
        const text = spaced(lp, ws);
        const buf = Buffer.from(` ${text},`);
        const r = readChosenLogprobs(buf, 0, buf.length);
        const parsed = JSON.parse(text) as { content?: unknown };
        const expected = logprobList(parsed.content, (e) =>
          e !== null && typeof e === 'object' && !Array.isArray(e) ? (e as Record<string, unknown>).logprob : undefined,
        );
        // Declining (the caller parses instead) is only for escaped member names.
        if (r === null) expect(text).toContain('\\');
        else {
          expect(r.end).toBe(skipValue(buf, 0));
          expect(r.values).toEqual(expected);
          if (r.values !== null) r.values.forEach((x, i) => expect(Object.is(x, expected![i])).toBe(true));
        }
      }),
      { ...RUN, numRuns: 1000 },
    );
    // Repeated members: the last one counts, as in JSON.parse.
    const twice = Buffer.from('{"content":[{"logprob":-1,"logprob":-2}],"content":[{"logprob":-3}]}');
    expect(readChosenLogprobs(twice, 0)?.values).toEqual([-3]);
    expect(readChosenLogprobs(Buffer.from('{"content":[{"logprob":-1,"logprob":"x"}]}'), 0)?.values).toBeNull();
    // A number too big for a double parses to Infinity, which is no logprob.
    expect(readChosenLogprobs(Buffer.from('{"content":[{"logprob":-1e999}]}'), 0)?.values).toBeNull();
    // Nothing past `end` is read.
    expect(readChosenLogprobs(Buffer.from('{}'), 0, 1)).toBeNull();
    // Numbers outside JSON's grammar, and malformed objects: declined, for the parse to judge.
    for (const bad of [
      '{"content":[{"logprob":01}]}',
      '{"content":[{"logprob":-.5}]}',
      '{"content":[{"logprob":1.}]}',
      '{"content":[{"logprob":+1}]}',
      '{"content":[{"logprob":1e}]}',
      '{"content":[{"logprob":-1}]',
      '{"content":[{"logprob" -1}]}',
      '{"con\\u0074ent":[]}',
    ])
      expect(readChosenLogprobs(Buffer.from(bad), 0)).toBeNull();
  });
});
