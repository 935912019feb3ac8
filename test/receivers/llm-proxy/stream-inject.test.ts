import { StreamInjector } from '../../../src/receivers/llm-proxy/inject';

const FIELDS = { return_token_ids: 'true', logprobs: 'true' };

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
