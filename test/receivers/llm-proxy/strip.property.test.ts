import fc from 'fast-check';
import { findMembers, findMembersOfEach } from '../../../src/formats/json-scan';
import { SseEventFramer } from '../../../src/formats/sse';
import { nullMemberParts, nullMembers, SseStripper } from '../../../src/receivers/llm-proxy/strip';
import { splitAt } from '../../support/chunks';

/*
 * The strip works on every event the agent receives: its bytes must stay exactly what the first
 * implementation (one `findMembers` pass per member, the stripper joining held reads with
 * `Buffer.concat`) gave, for any bytes, however they are split into reads. That implementation is
 * kept here as the reference.
 */

function referenceParts(buf: Buffer, members: readonly string[]): Buffer[] {
  const cuts: [number, number][] = [];
  for (const m of members)
    for (const f of findMembers(buf, m)) if (!(buf[f.valueStart] === 0x6e && f.valueEnd - f.valueStart === 4)) cuts.push([f.valueStart, f.valueEnd]);
  if (cuts.length === 0) return [buf];
  cuts.sort((a, b) => a[0] - b[0]);
  const parts: Buffer[] = [];
  let at = 0;
  for (const [s, e] of cuts) {
    if (s < at) continue;
    parts.push(buf.subarray(at, s), Buffer.from('null'));
    at = e;
  }
  parts.push(buf.subarray(at));
  return parts;
}

function referenceNull(buf: Buffer, members: readonly string[]): Buffer {
  const parts = referenceParts(buf, members);
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}

class ReferenceStripper {
  private held: Buffer[] = [];
  private readonly framer = new SseEventFramer();
  constructor(private readonly members: readonly string[]) {}
  push(chunk: Buffer): Buffer[] {
    if (chunk.length === 0) return [];
    const ends = this.framer.push(chunk);
    if (ends.length === 0) {
      this.held.push(chunk);
      return [];
    }
    const end = ends[ends.length - 1];
    const event = this.held.length === 0 ? chunk.subarray(0, end) : Buffer.concat([...this.held, chunk.subarray(0, end)]);
    this.held = end < chunk.length ? [chunk.subarray(end)] : [];
    return [referenceNull(event, this.members)];
  }
  end(): Buffer[] {
    const rest = this.held.length === 1 ? this.held[0] : Buffer.concat(this.held);
    this.held = [];
    return rest.length > 0 ? [referenceNull(rest, this.members)] : [];
  }
}

const VLLM = ['prompt_token_ids', 'token_ids', 'logprobs'];
/** Member lists: vLLM's, one with keys sharing a first byte, a repeated key, keys that are not plain (searched key by key). */
const MEMBER_LISTS: string[][] = [
  VLLM,
  ['token_ids', 'top_logprobs', 'logprobs', 'prompt_token_ids'],
  ['token_ids', 'token_ids', 'a'],
  ['to"ken', 'token_ids'],
  ['é', 'logprobs'],
  [],
];

/** Tokens of JSON-ish text: member names (quoted, with and without a colon, escaped), structure, white space, values, escapes. */
const TOKEN = fc.oneof(
  fc.constantFrom(
    '"token_ids"',
    '"token_ids":',
    '"prompt_token_ids": ',
    '"logprobs"',
    '"logprobs" :',
    '"top_logprobs":',
    '\\"token_ids\\":',
    '\\\\"logprobs":',
    '"a"',
    '"to"ken":',
    '"é":',
    '"',
    '\\',
    ':',
    ',',
    '[',
    ']',
    '{',
    '}',
    ' ',
    '\n',
    '\t',
    '\r',
    'null',
    'nul',
    'true',
    '-0.5',
    '12',
    '[1,2,3]',
    '[ 4 , 5 ]',
    '[]',
    '{}',
    '"x\\"y"',
    '"token_ids\\""',
    'data: ',
    '\n\n',
    '\r\n\r\n',
  ),
  fc.string({ maxLength: 4 }),
);

const soup = fc.array(TOKEN, { maxLength: 60 }).map((t) => t.join(''));

/** A vLLM-like chunk with random white space, member order, values and escaped look-alikes in its strings. */
const ws = fc.constantFrom('', ' ', '\n', '  \t');
const value: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  v: fc.oneof(
    { depthSize: 'small' },
    fc.constant(null),
    fc.integer(),
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.constantFrom('token_ids', '"logprobs": [1]', 'a \\"token_ids\\": b', '\\', ''),
    fc.array(fc.integer({ min: 0, max: 99999 }), { maxLength: 5 }),
    fc.array(tie('v'), { maxLength: 3 }),
    fc.dictionary(fc.constantFrom('token_ids', 'logprobs', 'content', 'token', 'prompt_token_ids', 'x'), tie('v'), { maxKeys: 4 }),
  ),
})).v;

function spaced(v: unknown, sp: string[], at = { i: 0 }): string {
  const s = (): string => sp[at.i++ % sp.length];
  if (Array.isArray(v)) return `[${s()}${v.map((x) => spaced(x, sp, at)).join(`${s()},${s()}`)}${s()}]`;
  if (v !== null && typeof v === 'object')
    return `{${s()}${Object.entries(v)
      .map(([k, x]) => `${JSON.stringify(k)}${s()}:${s()}${spaced(x, sp, at)}`)
      .join(`${s()},${s()}`)}${s()}}`;
  return JSON.stringify(v);
}

const event = fc
  .tuple(
    fc.dictionary(fc.constantFrom('id', 'choices', 'prompt_token_ids', 'token_ids', 'logprobs', 'usage'), value, { maxKeys: 5 }),
    fc.array(ws, { minLength: 1, maxLength: 8 }),
  )
  .map(([obj, sp]) => spaced(obj, sp));

const eol = fc.constantFrom('\n\n', '\r\n\r\n', '\r\r', '\n\r\n');
const stream = fc
  .array(
    fc.tuple(fc.oneof(event, soup), eol).map(([e, end]) => `data: ${e}${end}`),
    { maxLength: 6 },
  )
  .chain((events) => {
    const buf = Buffer.from(events.join(''));
    return fc.tuple(fc.constant(buf), fc.uniqueArray(fc.integer({ min: 1, max: Math.max(1, buf.length - 1) }), { maxLength: 8 }));
  })
  .map(([buf, cuts]) => ({
    buf,
    reads: splitAt(
      buf,
      [...cuts].filter((c) => c < buf.length).sort((a, b) => a - b),
    ),
  }));

function pushes(s: { push(c: Buffer): Buffer[]; end(): Buffer[] }, reads: Buffer[]): string[][] {
  const out = reads.map((r) => s.push(r).map((p) => p.toString('latin1')));
  out.push(s.end().map((p) => p.toString('latin1')));
  return out;
}

describe('the strip gives the same bytes as the one-pass-per-member strip it replaced', () => {
  it('finds the same members as findMembers for each key', () => {
    fc.assert(
      fc.property(fc.oneof(soup, event), fc.constantFrom(...MEMBER_LISTS), (text, members) => {
        const buf = Buffer.from(text);
        const sorted = (m: { nameAt: number; valueStart: number; valueEnd: number }[]): string[] =>
          m.map((x) => `${x.nameAt},${x.valueStart},${x.valueEnd}`).sort();
        expect(sorted(findMembersOfEach(buf, members))).toEqual(sorted(members.flatMap((k) => findMembers(buf, k))));
      }),
      { numRuns: 3000 },
    );
  });

  it('nulls the same bytes in one buffer (JSON, event text, malformed text)', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          soup,
          event,
          stream.map((s) => s.buf.toString()),
        ),
        fc.constantFrom(...MEMBER_LISTS),
        (text, members) => {
          const buf = Buffer.from(text);
          expect(nullMembers(buf, members).toString('latin1')).toBe(referenceNull(buf, members).toString('latin1'));
          expect(Buffer.concat(nullMemberParts(buf, members)).toString('latin1')).toBe(Buffer.concat(referenceParts(buf, members)).toString('latin1'));
        },
      ),
      { numRuns: 3000 },
    );
  });

  it('sends the same bytes in the same writes, however the stream is split into reads', () => {
    fc.assert(
      fc.property(stream, fc.constantFrom(...MEMBER_LISTS), ({ reads }, members) => {
        expect(pushes(new SseStripper(members), reads)).toEqual(pushes(new ReferenceStripper(members), reads));
      }),
      { numRuns: 2000 },
    );
  });

  it('finds every key of a long list, the ninth and later as the first (one bit a key)', () => {
    const members = Array.from({ length: 30 }, (_, i) => `k${i}`);
    const buf = Buffer.from(`{${members.map((k, i) => `"${k}":[${i}]`).join(',')}}`);
    const found = findMembersOfEach(buf, members);
    expect(found).toHaveLength(30);
    expect(nullMembers(buf, members).toString()).toBe(`{${members.map((k) => `"${k}":null`).join(',')}}`);
  });

  it('follows a list of members changed after its first use', () => {
    const members = ['token_ids'];
    const buf = Buffer.from('{"token_ids":[1],"logprobs":{"content":[]}}');
    expect(nullMembers(buf, members).toString()).toBe('{"token_ids":null,"logprobs":{"content":[]}}');
    members.push('logprobs');
    expect(nullMembers(buf, members).toString()).toBe('{"token_ids":null,"logprobs":null}');
    members[1] = 'to"ken';
    expect(nullMembers(buf, members).toString()).toBe('{"token_ids":null,"logprobs":{"content":[]}}');
  });

  it('the same for events around and past the size searched in one walk, with member names at its edge', () => {
    const ids = (n: number): string => Array.from({ length: n }, (_, i) => 1000 + i).join(',');
    for (const n of [600, 800, 816, 817, 818, 820, 830, 2000]) {
      const text = `data: {"prompt_token_ids":[${ids(n)}],"choices":[{"logprobs":{"content":[{"token":"\\"token_ids\\":","logprob":-1}]},"token_ids":[1, 2]}],"logprobs":null}\n\n`;
      for (const cut of [1, 100, text.length - 30, text.length - 2, text.length - 1]) {
        const reads = splitAt(Buffer.from(text), [cut]);
        expect(pushes(new SseStripper(VLLM), reads)).toEqual(pushes(new ReferenceStripper(VLLM), reads));
      }
      for (let end = 4080; end <= 4110; end++) {
        const buf = Buffer.from(text).subarray(0, Math.min(end, text.length));
        expect(nullMembers(buf, VLLM).toString()).toBe(referenceNull(buf, VLLM).toString());
      }
    }
  });
});
