import fc from 'fast-check';
import { namesImage } from '../../../src/formats/images';
import { firstImageName, indexIn, StreamInjector } from '../../../src/receivers/llm-proxy/inject';

const FIELDS = { return_token_ids: 'true', logprobs: 'true' };
const IMAGE_MESSAGE = '{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}';
/** A body's opening with an image message as its first member (the rest of a body follows). */
const IMAGE_TURN = `{"first":${IMAGE_MESSAGE},`;

/** Feeds `body` split at the given points; returns what went upstream and the injector. */
function feed(body: string, cuts: number[]): { sent: string; injector: StreamInjector; decidedAt: number } {
  const injector = new StreamInjector(FIELDS);
  const bytes = Buffer.from(body);
  const out: Buffer[] = [];
  let decidedAt = -1;
  let at = 0;
  for (const cut of [...cuts, bytes.length]) {
    out.push(...injector.push(bytes.subarray(at, cut)));
    if (decidedAt < 0 && injector.decided) decidedAt = cut;
    at = cut;
  }
  out.push(...injector.end());
  return { sent: Buffer.concat(out).toString(), injector, decidedAt };
}

describe('adding fields to a streamed request body', () => {
  it('writes the fields after the opening brace and passes every other byte, whatever the chunking', () => {
    const body = ' \n{ "model": "m", "messages": [{"role": "user", "content": "{\\"logprobs\\": 1}"}] }';
    for (let cut = 0; cut <= body.length; cut++) {
      const { sent, injector } = feed(body, [cut]);
      expect(sent).toBe(` \n{"return_token_ids":true,"logprobs":true, "model": "m", "messages": [{"role": "user", "content": "{\\"logprobs\\": 1}"}] }`);
      expect(Buffer.byteLength(sent)).toBe(Buffer.byteLength(body) + injector.extraBytes);
      expect(JSON.parse(sent)).toMatchObject({ return_token_ids: true, logprobs: true, model: 'm' });
    }
  });

  it('decides as soon as the first byte after the brace arrives, without holding the rest', () => {
    const body = `{"model":"m","messages":[${'{"role":"user","content":"x"},'.repeat(2000)}{"role":"user","content":"y"}]}`;
    const { decidedAt } = feed(body, [1, 2, 100, 5000]);
    expect(decidedAt).toBe(2);
  });

  it('keeps an empty object valid and leaves bodies that are not objects alone', () => {
    expect(JSON.parse(feed('{ }', [1]).sent)).toEqual({ return_token_ids: true, logprobs: true });
    for (const body of ['[1,2]', 'not json', '', '  ']) {
      const { sent, injector } = feed(body, [1]);
      expect(sent).toBe(body);
      expect(injector.extraBytes).toBe(0);
      expect(injector.injected()).toEqual([]);
    }
  });

  it('lets the agent’s own value win and does not count a field it set as injected, even split across chunks', () => {
    const body = '{"model":"m","logprobs":false,"messages":[]}';
    const at = body.indexOf('logprobs') + 3;
    for (const cuts of [[5], [at], [at - 2, at + 1]]) {
      const { sent, injector } = feed(body, cuts);
      expect(JSON.parse(sent)).toMatchObject({ logprobs: false, return_token_ids: true });
      expect(injector.injected()).toEqual(['return_token_ids']);
    }
  });
});

describe('finding the member names an agent sent', () => {
  it('finds a needle across any chunking, from any position', () => {
    const text = Buffer.from('ab"logprobs"cd"logprobs"e"x');
    const needle = Buffer.from('"logprobs"');
    for (let a = 0; a <= text.length; a++)
      for (let b = a; b <= text.length; b++) {
        const chunks = [text.subarray(0, a), text.subarray(a, b), text.subarray(b)];
        // One-byte chunks too: an occurrence spanning many chunks.
        const bytes = [...text].map((c) => Buffer.from([c]));
        for (let from = 0; from <= text.length; from++) {
          expect(indexIn(chunks, needle, from)).toBe(text.indexOf(needle, from));
          if (a === 0 && b === 0) expect(indexIn(bytes, needle, from)).toBe(text.indexOf(needle, from));
        }
      }
  });

  /** Sends `body` (in `parts` pieces) through an injector; `prior` as the journal would report it. */
  function send(body: string, parts: number, prior: { previous: { sent: Buffer; notes: unknown } | null; under?: number } = { previous: null }) {
    const injector = new StreamInjector(FIELDS);
    const bytes = Buffer.from(body);
    const out: Buffer[] = [];
    const size = Math.ceil(bytes.length / parts);
    for (let at = 0; at < bytes.length; at += size) out.push(...injector.push(bytes.subarray(at, at + size)));
    out.push(...injector.end());
    const sent = Buffer.concat(out);
    let repeats: { shared: number; notes: unknown } | null = null;
    if (prior.previous) {
      // What the journal finds: the bytes sent that equal the previous request's (or fewer).
      let shared = 0;
      while (shared < sent.length && shared < prior.previous.sent.length && sent[shared] === prior.previous.sent[shared]) shared++;
      repeats = { shared: Math.min(shared, prior.under ?? shared), notes: prior.previous.notes };
    }
    const injected = injector.injected(repeats);
    return { sent, injected, notes: injector.notes(), namesImage: injector.namesImage() };
  }

  const history = (n: number, extra = '') =>
    `{"model":"m","messages":[${Array.from({ length: n }, (_, i) => `{"role":"user","content":"turn ${i} ${'x'.repeat(50)}"}`).join(',')}]${extra}}`;

  it('gives what a full search gives when only the bytes after the previous request are searched', () => {
    const cases: [string, string][] = [
      // The agent asks at the end of each request: found past the shared part.
      [history(3, ',"logprobs":true'), history(4, ',"logprobs":true')],
      // It asked in the first request only.
      [history(3, ',"logprobs":false'), history(4)],
      // It asks first in the second.
      [history(3), history(4, ',"return_token_ids":false,"logprobs":true')],
      // A member before the history: in the shared part, known from the previous request.
      ['{"logprobs":false,' + history(3).slice(1), '{"logprobs":false,' + history(4).slice(1)],
      // A name spanning where the two part.
      ['{"model":"m","x":"a","logprobs":1}', '{"model":"m","x":"a","logprobs":2,"return_token_ids":false}'],
      // The previous request's name is cut where the two part: not in this one.
      ['{"model":"m","logprobs":1}', '{"model":"m","logprobz":1}'],
      // Unrelated bodies.
      [history(2, ',"logprobs":true'), '{"return_token_ids":true}'],
      // An image part in the shared history, and one that first comes after it.
      [IMAGE_TURN + history(2).slice(1), IMAGE_TURN + history(3).slice(1)],
      [history(2), history(2).slice(0, -2) + ',' + IMAGE_MESSAGE + ']}'],
      // An image name that the two part in the middle of, either way.
      ['{"model":"m","type":"image_ur","x":1}', '{"model":"m","type":"image_url","x":1}'],
      ['{"model":"m","type":"image","x":1}', '{"model":"m","type":"imagex","x":1}'],
      ['{"model":"m","type":"image_url"}', '{"model":"m","type":"image_ur"}'],
    ];
    for (const [first, second] of cases)
      for (const parts of [1, 3, 17])
        for (const under of [undefined, 0, 5, 40]) {
          const previous = send(first, parts);
          expect(previous.injected).toEqual(send(first, 1).injected);
          const next = send(second, parts, { previous: { sent: previous.sent, notes: previous.notes }, under });
          const full = send(second, 1);
          expect(next.injected).toEqual(full.injected);
          expect(next.notes).toEqual(full.notes);
          expect(next.namesImage).toBe(namesImage(Buffer.from(second)));
        }
  });

  it('finds the first image name across any chunking, as the search of one buffer does', () => {
    const pieces = ['"image', '"image"', '"image_url"', '"image_ur', '_url"', '"', 'image', 'x', '{"type":"text"}', 'é'];
    fc.assert(
      fc.property(fc.array(fc.constantFrom(...pieces), { maxLength: 10 }), fc.array(fc.nat(), { maxLength: 6 }), fc.nat(), (parts, cuts, start) => {
        const text = Buffer.from(parts.join(''));
        const at = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
        const chunks = [0, ...at].map((c, i, all) => text.subarray(c, i + 1 < all.length ? all[i + 1] : text.length));
        const from = start % (text.length + 1);
        let expected = -1;
        for (let i = text.indexOf('"image', from); i >= 0 && expected < 0; i = text.indexOf('"image', i + 1))
          if (namesImage(text.subarray(i, i + 11))) expected = i;
        expect(firstImageName(chunks, from)).toBe(expected);
      }),
      { numRuns: 2000 },
    );
  });

  it('does not trust notes written with other fields', () => {
    const previous = send(history(3, ',"logprobs":true'), 1);
    const forged = { ...(previous.notes as object), insertion: '"other":true,' };
    // Shared bytes claimed over the whole body, with notes that do not match the insertion: searched in full.
    const next = new StreamInjector(FIELDS);
    const body = Buffer.from(history(3));
    next.push(body);
    next.end();
    expect(next.injected({ shared: body.length + 100, notes: forged })).toEqual(['return_token_ids', 'logprobs']);
  });
});
