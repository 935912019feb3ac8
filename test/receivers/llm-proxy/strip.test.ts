import { nullMembers, SseStripper } from '../../../src/receivers/llm-proxy/strip';
import { splitAt } from '../../support/chunks';

const MEMBERS = ['prompt_token_ids', 'token_ids', 'logprobs'];

/** Events as vLLM streams them when asked for ids and logprobs, with every kind of line end. */
function stream(eol: string): { sent: string; expected: string } {
  const events = [
    [
      `{"id":"c","prompt_token_ids":[1,2,3,4,5],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"token_ids":[]}]}`,
      `{"id":"c","prompt_token_ids":null,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"token_ids":null}]}`,
    ],
    [
      `{"id":"c","choices":[{"index":0,"delta":{"content":"a \\"token_ids\\" b"},"logprobs":{"content":[{"token":"x","logprob":-0.5}]},"token_ids":[7]}]}`,
      `{"id":"c","choices":[{"index":0,"delta":{"content":"a \\"token_ids\\" b"},"logprobs":null,"token_ids":null}]}`,
    ],
    [
      `{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop","token_ids":[8,9]}]}`,
      `{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop","token_ids":null}]}`,
    ],
  ];
  let sent = `: comment${eol}${eol}`;
  let expected = sent;
  for (const [input, output] of events) {
    sent += `data: ${input}${eol}${eol}`;
    expected += `data: ${output}${eol}${eol}`;
  }
  sent += `data: [DONE]${eol}${eol}`;
  expected += `data: [DONE]${eol}${eol}`;
  return { sent, expected };
}

function run(stripper: SseStripper, chunks: Buffer[]): { out: string; pushes: string[][] } {
  const pushes: string[][] = [];
  let out = '';
  for (const c of chunks) {
    const parts = stripper.push(c).map((p) => p.toString('utf8'));
    pushes.push(parts);
    out += parts.join('');
  }
  out += stripper
    .end()
    .map((p) => p.toString('utf8'))
    .join('');
  return { out, pushes };
}

describe('giving back the members the sidecar asked for, in a stream', () => {
  for (const [name, eol] of [
    ['LF', '\n'],
    ['CRLF', '\r\n'],
    ['CR', '\r'],
  ] as const) {
    it(`nulls them in every event and keeps every other byte, wherever the reads split the stream (${name})`, () => {
      const { sent, expected } = stream(eol);
      const buf = Buffer.from(sent);
      expect(run(new SseStripper(MEMBERS), [buf]).out).toBe(expected);
      // Every byte its own read.
      expect(
        run(
          new SseStripper(MEMBERS),
          splitAt(
            buf,
            [...Array(buf.length - 1).keys()].map((i) => i + 1),
          ),
        ).out,
      ).toBe(expected);
      // Every pair of split points (three reads).
      for (let a = 1; a < buf.length; a++)
        for (let b = a; b < buf.length; b += 7) expect(run(new SseStripper(MEMBERS), splitAt(buf, [a, b])).out).toBe(expected);
    });
  }

  it('sends an event out with the read that completes it, even when its blank line is split across reads', () => {
    const event = Buffer.from('data: {"token_ids":[1]}\r\n\r\n');
    for (let cut = 1; cut < event.length; cut++) {
      const { pushes, out } = run(new SseStripper(MEMBERS), [event.subarray(0, cut), event.subarray(cut)]);
      // Out once both reads are in (a CR already ends a line: a last LF may follow with the next event).
      expect(pushes.flat().join('')).toMatch(/^data: \{"token_ids":null\}\r\n\r\n?$/);
      expect(out).toBe('data: {"token_ids":null}\r\n\r\n');
    }
  });

  it('holds a big first event across many reads and sends it once, whole, without the prompt ids', () => {
    const ids = Array.from({ length: 50_000 }, (_, i) => 1000 + i).join(',');
    const event = Buffer.from(
      `data: {"prompt_token_ids":[${ids}],"choices":[{"delta":{"content":""},"token_ids":[]}]}\n\ndata: {"choices":[{"delta":{"content":"hi"}`,
    );
    const reads = splitAt(
      event,
      Array.from({ length: Math.floor(event.length / 4096) }, (_, i) => (i + 1) * 4096),
    );
    const { pushes, out } = run(new SseStripper(MEMBERS), reads);
    const sentAt = pushes.findIndex((p) => p.length > 0);
    expect(pushes.filter((p) => p.length > 0)).toHaveLength(1);
    expect(sentAt).toBe(reads.findIndex((_, i) => Buffer.concat(reads.slice(0, i + 1)).includes('\n\n')));
    expect(pushes[sentAt].join('')).toBe('data: {"prompt_token_ids":null,"choices":[{"delta":{"content":""},"token_ids":null}]}\n\n');
    // The next event, cut short, is still given back at the end (with nothing to strip in it).
    expect(out.endsWith('data: {"choices":[{"delta":{"content":"hi"}')).toBe(true);
  });

  it('strips a JSON body the same way', () => {
    const body = Buffer.from('{"prompt_token_ids":[1,2],"choices":[{"logprobs":{"content":[]},"token_ids":[3],"message":{"content":"token_ids"}}]}');
    expect(nullMembers(body, MEMBERS).toString()).toBe(
      '{"prompt_token_ids":null,"choices":[{"logprobs":null,"token_ids":null,"message":{"content":"token_ids"}}]}',
    );
  });
});
