import fc from 'fast-check';
import { parseSse, SseEventFramer, SseLineEnds, SseSplitter, type SseEvent } from '../../src/formats/sse';
import { splitAt } from '../support/chunks';

const RUN = { seed: 20261122, numRuns: 300 };

/** Where the framer says events end, as offsets into the whole stream, for these reads. */
function framedEnds(chunks: Buffer[]): number[] {
  const framer = new SseEventFramer();
  const ends: number[] = [];
  let at = 0;
  for (const c of chunks) {
    for (const e of framer.push(c)) ends.push(at + e);
    at += c.length;
  }
  return ends;
}

function splitEvents(chunks: Buffer[]): SseEvent[] {
  const s = new SseSplitter();
  const events = chunks.flatMap((c) => s.push(c));
  return [...events, ...s.end()];
}

/** Every line's [content, terminator] as the rule reads them, fed in these pieces. */
function lines(pieces: (string | Buffer)[]): { text: string; blank: boolean }[] {
  const rule = new SseLineEnds();
  const out: { text: string; blank: boolean }[] = [];
  let open = '';
  for (const p of pieces) {
    const rest = rule.scan(p, (start, end, _next, blank) => {
      out.push({ text: open + p.slice(start, end).toString(), blank });
      open = '';
    });
    open += p.slice(rest).toString();
  }
  return out;
}

describe('the line-ending rule (CRLF, LF or CR end a line; an empty line ends an event)', () => {
  it.each([
    ['LF', 'data: a\n\n', [9]],
    ['CRLF', 'data: a\r\n\r\n', [11]],
    ['CR', 'data: a\r\r', [9]],
    ['LF then CR (a CR after an LF is an empty line)', 'data: a\n\r', [9]],
    ['CRLF then LF', 'data: a\r\n\n', [10]],
    ['LF then CRLF', 'data: a\n\r\n', [10]],
    ['CR CR LF (the LF belongs to the second CR)', 'data: a\r\r\n', [10]],
    ['LF CRLF LF: two blank lines', 'a\n\r\n\n', [4, 5]],
    ['no blank line', 'data: a\r\ndata: b\n', []],
    ['a blank line opening the stream', '\ndata: a\n\n', [1, 10]],
  ])('%s', (_name, text, ends) => {
    const buf = Buffer.from(text);
    expect(framedEnds([buf])).toEqual(ends);
    // Bytes and text read the same.
    expect(lines([text])).toEqual(lines([buf]));
  });

  it('reads a CRLF split across two pieces as one line end, in bytes and in text', () => {
    expect(lines(['data: a\r', '\ndata: b\r\n'])).toEqual([
      { text: 'data: a', blank: false },
      { text: 'data: b', blank: false },
    ]);
    expect(lines([Buffer.from('data: a\r'), Buffer.from('\n\r'), Buffer.from('\n')])).toEqual([
      { text: 'data: a', blank: false },
      { text: '', blank: true },
    ]);
    // The CR of a blank line ends the event at once; the LF that completes it opens the next range.
    expect(framedEnds([Buffer.from('data: a\r\n\r'), Buffer.from('\ndata: b\r\n\r\n')])).toEqual([10, 22]);
    expect(splitEvents([Buffer.from('data: a\r\n\r'), Buffer.from('\ndata: b\r\n\r\n')])).toEqual([
      { event: 'message', data: 'a' },
      { event: 'message', data: 'b' },
    ]);
  });

  it('a line split inside its content is one line, not blank', () => {
    expect(lines(['da', 'ta: a', '\n', '\n'])).toEqual([
      { text: 'data: a', blank: false },
      { text: '', blank: true },
    ]);
  });

  const mixed = Buffer.from(': hi\r\nevent: e\rdata: {"a":"h\u00e9 ✓"}\r\n\r\ndata: 1\ndata: 2\n\ndata: x\r\rdata: [DONE]\n\r\n');
  const whole = framedEnds([mixed]);
  const events = parseSse(mixed.toString()).events;

  it('frames and parses an event split at every byte, and at every pair of bytes, as the whole', () => {
    expect(whole).toEqual([mixed.indexOf('data: 1'), mixed.indexOf('data: x'), mixed.indexOf('data: [DONE]'), mixed.length]);
    expect(events).toHaveLength(4);
    const one = splitAt(
      mixed,
      [...Array(mixed.length - 1).keys()].map((i) => i + 1),
    );
    // Every CRLF that ends a blank line is cut between its CR and LF: each such event ends at its CR.
    expect(framedEnds(one)).toEqual(whole.map((e) => (mixed[e - 2] === 13 && mixed[e - 1] === 10 ? e - 1 : e)));
    expect(splitEvents(one)).toEqual(events);
    for (let a = 1; a < mixed.length; a++)
      for (let b = a; b < mixed.length; b++) {
        const chunks = splitAt(mixed, [a, b]);
        expect(splitEvents(chunks)).toEqual(events);
        // A CRLF ending a blank line, cut between its CR and LF, ends the event at the CR.
        const cutCrlf = [a, b].filter((c) => mixed[c - 1] === 13 && mixed[c] === 10 && whole.includes(c + 1));
        expect(framedEnds(chunks)).toEqual(whole.map((e) => (cutCrlf.includes(e - 1) ? e - 1 : e)));
      }
  });

  it('any stream of CR, LF and CRLF lines, in any reads: the framed ranges hold the events, the splitter gives them', () => {
    const line = fc.constantFrom('data: a', 'data: é✓', 'event: x', ': c', 'data:', 'id: 1', '');
    const eol = fc.constantFrom('\r', '\n', '\r\n');
    fc.assert(
      fc.property(fc.array(fc.tuple(line, eol), { maxLength: 30 }), fc.array(fc.nat(), { maxLength: 8 }), (ls, rawCuts) => {
        const buf = Buffer.from(ls.map(([l, e]) => l + e).join(''));
        const cuts = [...new Set(rawCuts.map((c) => c % (buf.length + 1)))].sort((x, y) => x - y);
        const chunks = splitAt(buf, cuts);
        const expected = parseSse(buf.toString()).events;
        expect(splitEvents(chunks)).toEqual(expected);
        // Each framed range is whole events (blank line included); together they are the stream's.
        const ends = framedEnds(chunks);
        const ranges = [0, ...ends].map((s, i) => buf.subarray(s, ends[i] ?? buf.length).toString());
        for (const r of ranges.slice(0, ends.length)) expect(parseSse(r).complete).toBe(true);
        expect(ranges.flatMap((r) => parseSse(r).events)).toEqual(expected);
      }),
      RUN,
    );
  });
});
