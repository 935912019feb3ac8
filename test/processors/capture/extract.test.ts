import { extractFacts, resolveIds } from '../../../src/formats/extract';
import { extractBody, extractStream } from '../../../src/formats/adapters';
import { TransitionWriter } from '../../../src/exporters/transition-json';
import type { Api, CallRecord, TransitionRecord } from '../../../src/model/records';
import { buildChat, buildCompletions, type Generation } from '../../support/fake-responses';
import { callRecord } from '../../support/records';

/** Journal stand-in: frame offset → bytes. */
function store(bodies: Record<'request' | 'response', Buffer[]>) {
  const frames = new Map<number, Buffer>();
  let next = 100;
  const offsets = { request: [] as number[], response: [] as number[] };
  for (const kind of ['request', 'response'] as const) {
    for (const b of bodies[kind]) {
      frames.set(next, b);
      offsets[kind].push(next++);
    }
  }
  return { read: (o: readonly number[]) => Buffer.concat(o.map((x) => frames.get(x)!)), offsets };
}

function generation(promptLength: number, n = 1): Generation {
  return {
    serial: 7,
    model: 'policy-7',
    flavor: 'vllm',
    withIds: true,
    withLogprobs: true,
    promptIds: Array.from({ length: promptLength }, (_, i) => 100_000 + i * 37),
    choices: Array.from({ length: n }, (_, index) => ({
      index,
      content: `answer ${index}`,
      toolCalls: index === 0 ? [{ id: 'call_1', name: 'calc', arguments: '{"x":1}' }] : [],
      tokens: [5 + index, 6, 7],
    })),
    includeUsage: true,
  };
}

function captured(api: Api, streamed: boolean, request: Buffer, response: Buffer, chunk = 977): { call: CallRecord; read: (o: readonly number[]) => Buffer } {
  const parts: Buffer[] = [];
  for (let i = 0; i < response.length; i += chunk) parts.push(response.subarray(i, i + chunk));
  const { read, offsets } = store({ request: [request], response: parts });
  const base = callRecord('r', 0, 10);
  const call: CallRecord = {
    type: 'call',
    correlation: base.correlation,
    seq: 0,
    api,
    traceId: null,
    spanId: null,
    callId: 1,
    bodies: { request: offsets.request, response: offsets.response, encoding: null },
    streamed,
    status: 'ok',
    httpStatus: 200,
    error: null,
    injected: ['return_token_ids'],
    truncated: false,
    startedAt: 5,
    endedAt: 10,
    latencyMs: 5,
    ttftMs: 1,
  };
  return { call, read };
}

/** The transition JSON the writer produces for the first choice, parsed. */
function written(call: CallRecord, read: (o: readonly number[]) => Buffer, choice = 0): Record<string, unknown> {
  const { facts } = extractFacts(call, read);
  const c = facts.choices[choice];
  const t = {
    transition_id: 'r/0/0',
    request: facts.request,
    response: facts.response,
    prompt_token_ids: c.promptTokenIds ?? facts.promptTokenIds,
    response_token_ids: c.responseTokenIds,
    source: call.bodies,
  } as unknown as TransitionRecord;
  return JSON.parse(new TransitionWriter(read).json(t).toString('utf8')) as Record<string, unknown>;
}

describe('extracting a captured call from its journaled bodies', () => {
  const request = Buffer.from(JSON.stringify({ model: 'policy-7', messages: [{ role: 'user', content: 'hi "there"' }], return_token_ids: true }));

  it('gives the same facts as parsing the whole body, with big id arrays left as byte ranges', () => {
    for (const [api, build] of [
      ['chat.completions', buildChat],
      ['completions', buildCompletions],
    ] as const) {
      const g = generation(400, 2);
      const body = build(g, false).body;
      const { call, read } = captured(api, false, request, Buffer.from(JSON.stringify(body)));
      const { facts, responseBytes } = extractFacts(call, read);
      const whole = extractBody(api, body);
      expect(facts.model).toBe('policy-7');
      expect(facts.usage).toEqual(whole.usage);
      const ids = (v: Parameters<typeof resolveIds>[0]) => Array.from(resolveIds(v, responseBytes) ?? []);
      expect(facts.choices.map((c) => [c.finishReason, ids(c.responseTokenIds), c.responseLogprobs, c.toolCalls])).toEqual(
        whole.choices.map((c) => [c.finishReason, c.responseTokenIds, c.responseLogprobs, c.toolCalls]),
      );
      // The prompt's 400 ids are not parsed at extraction: a range of the response body.
      expect(Array.isArray(facts.promptTokenIds ?? facts.choices[0].promptTokenIds)).toBe(false);
      const out = written(call, read);
      expect(out.prompt_token_ids).toEqual(g.promptIds);
      expect(out.request).toEqual(JSON.parse(request.toString()));
    }
  });

  it('leaves the lifted members out of the recorded response and keeps every other byte', () => {
    const g = generation(300);
    const body = buildChat(g, false).body as Record<string, unknown>;
    const raw = Buffer.from(JSON.stringify(body, null, 1));
    const { call, read } = captured('chat.completions', false, request, raw);
    const out = written(call, read);
    const expected = structuredClone(body);
    delete expected.prompt_token_ids;
    for (const c of expected.choices as Record<string, unknown>[]) {
      delete c.token_ids;
      delete c.logprobs;
    }
    expect(out.response).toEqual(expected);
    expect(out.prompt_token_ids).toEqual(g.promptIds);
    expect(out.response_token_ids).toEqual([5, 6, 7]);
  });

  it('reads a stream whose first event carries the prompt ids, split at any chunk size', () => {
    const g = generation(500);
    const text = buildChat(g, true).events.join('') + 'data: [DONE]\n\n';
    const whole = extractStream('chat.completions', text);
    for (const chunk of [1, 7, 4096]) {
      const { call, read } = captured('chat.completions', true, request, Buffer.from(text), chunk);
      const { facts } = extractFacts(call, read);
      expect(facts.status).toBe('ok');
      expect(facts.choices[0].responseTokenIds).toEqual(whole.choices[0].responseTokenIds);
      expect(facts.choices[0].toolCalls).toEqual(whole.choices[0].toolCalls);
      const out = written(call, read);
      expect(out.prompt_token_ids).toEqual(g.promptIds);
      const response = out.response as { prompt_token_ids?: unknown; choices: Record<string, unknown>[] };
      expect(response.prompt_token_ids).toBeUndefined();
      expect(response.choices[0].token_ids).toBeUndefined();
      expect(response.choices[0].logprobs).toBeUndefined();
    }
  });

  it('records an answer that is not JSON, or an unreadable body, as an error with the reason', () => {
    const { call, read } = captured('chat.completions', false, request, Buffer.from('<html>bad gateway</html>'));
    expect(extractFacts(call, read).facts).toMatchObject({ status: 'error', error: 'response body is not JSON', model: 'policy-7', choices: [] });
    const gone = extractFacts(call, () => {
      throw new Error('segment released');
    }).facts;
    expect(gone.status).toBe('error');
    expect(gone.error).toMatch(/unreadable from the journal: segment released/);
  });

  it('reads chat logprobs from the bytes, and leaves to the parse what it does not read plainly', () => {
    const body = buildChat(generation(3), false).body as { choices: { logprobs: { content: { logprob: number }[] } }[] };
    const want = body.choices[0].logprobs.content.map((e) => e.logprob);
    const text = JSON.stringify(body);
    const facts = (raw: string) => {
      const { call, read } = captured('chat.completions', false, request, Buffer.from(raw));
      return extractFacts(call, read).facts;
    };
    expect(facts(text).choices[0].responseLogprobs).toEqual(want);
    // An escaped member name is read by the parse, with the same result.
    expect(facts(text.replace('"content":[', '"con\\u0074ent":[')).choices[0].responseLogprobs).toEqual(want);
    // A logprob outside JSON's grammar, or any other fault inside the object, makes the answer what it is: not JSON.
    expect(facts(text.replace(/"logprob":-?/, '"logprob":+'))).toMatchObject({ status: 'error', error: 'response body is not JSON' });
    expect(facts(text.replace('"bytes":null', '"bytes":[1e+-.]'))).toMatchObject({ status: 'error', error: 'response body is not JSON' });
    expect(facts(text.replace(/"token":"/, '"token":"\u0001'))).toMatchObject({ status: 'error', error: 'response body is not JSON' });
  });

  it('reads only choices their own logprobs from the bytes: other logprobs members and look-alike strings are parsed as they are', () => {
    const body = buildChat(generation(3, 2), false).body as {
      choices: { logprobs: unknown; message: { tool_calls?: { function: { arguments: unknown } }[] } }[];
    };
    const want = (body.choices[0].logprobs as { content: { logprob: number }[] }).content.map((e) => e.logprob);
    // Tool-call arguments given as an object (not a string) that holds a logprobs member.
    body.choices[0].message.tool_calls![0].function.arguments = { logprobs: { content: [{ logprob: -1 }] } };
    // A server string in the shape of the sidecar's markers.
    body.choices[1].logprobs = '\u0000logprobs:0';
    const { call, read } = captured('chat.completions', false, request, Buffer.from(JSON.stringify(body)));
    const facts = extractFacts(call, read).facts;
    expect(facts.status).toBe('ok');
    expect(facts.choices[0].responseLogprobs).toEqual(want);
    expect(JSON.parse(facts.choices[0].toolCalls[0].arguments!)).toEqual({ logprobs: { content: [{ logprob: -1 }] } });
    expect(facts.choices[1].responseLogprobs).toBeNull();
  });

  it('writes a request that is not JSON as null rather than breaking the transition', () => {
    const { call, read } = captured(
      'chat.completions',
      false,
      Buffer.from('{"model": "x", oops'),
      Buffer.from(JSON.stringify(buildChat(generation(3), false).body)),
    );
    expect(written(call, read).request).toBeNull();
  });
});
