import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled } from '@openai/agents';
import { CallCapture } from '../../../src/receivers/llm-proxy/capture';
import { planTranslation, serveTranslated, type TranslatedApi, type TranslatedOutcome } from '../../../src/receivers/llm-proxy/translated-call';
import { SseSplitter } from '../../../src/formats/sse';
import { UpstreamPool } from '../../../src/receivers/llm-proxy/upstream-pool';
import { routingSchema } from '../../../src/config/schema';
import { silentLogger } from '../../../src/telemetry/logger';
import { createMetrics } from '../../../src/telemetry/metrics';
import { extractFacts, resolveIds } from '../../../src/formats/extract';
import { parseSse } from '../../../src/formats/sse';
import type { CallRecord } from '../../../src/model/records';
import { compileRedaction } from '../../../src/processors/capture/redact';
import { memoryCapture } from '../../support/memory-capture';
import { startFakeModelServer, type Fault, type FakeModelServer, type ReceivedRequest, type Turn } from '../../support/fake-model-server';
import { calculatorAgentTool, calculatorAnthropicTool, vllmCalculatorScript } from '../../support/calculator';

/** One call through the gateway: what was planned, what was captured, how it ended. */
interface Served {
  api: TranslatedApi;
  agentBody: Buffer;
  reason: string | null;
  capture: CallCapture | null;
  read: ReturnType<typeof memoryCapture>['read'];
  outcome: Promise<TranslatedOutcome>;
  /** The outcome handed to `settled`, and whether the agent's response had completed by then. */
  settledEarly: boolean | null;
}

const FIELDS = { return_token_ids: 'true', logprobs: 'true' };
const upstreamPools = new Map<number, UpstreamPool>();
/** The proxy's upstream for a port (one each, as the proxy keeps one). */
function poolFor(port: number): UpstreamPool {
  let pool = upstreamPools.get(port);
  if (!pool) {
    pool = new UpstreamPool([`http://127.0.0.1:${port}/v1`], routingSchema.parse({}), { logger: silentLogger, metrics: createMetrics() });
    upstreamPools.set(port, pool);
  }
  return pool;
}

let upstream: FakeModelServer;
let script: ((r: ReceivedRequest) => Turn) | null = null;
let fault: ((r: ReceivedRequest) => Fault | null) | null = null;
/** Where the gateway sends chat completions (a test may point it elsewhere). */
let target: { port: number; timeoutMs: number };
let redact: ((body: unknown) => unknown) | null = null;
let gateway: http.Server;
let gatewayUrl: string;
const served: Served[] = [];
const gatewaySockets = new Set<Socket>();

/** A tiny proxy: the module under test in front of the vLLM-like server, as proxy.ts uses it. */
function handle(req: IncomingMessage, res: ServerResponse, body: Buffer): void {
  const path = (req.url ?? '').split('?')[0];
  const api: TranslatedApi | null = path === '/v1/responses' ? 'responses' : path === '/v1/messages' ? 'anthropic.messages' : null;
  if (!api) {
    res.writeHead(404).end();
    return;
  }
  const mem = memoryCapture();
  const plan = planTranslation(api, body);
  const call: Served = { api, agentBody: body, reason: null, capture: null, read: mem.read, outcome: Promise.resolve(null as never), settledEarly: null };
  served.push(call);
  if (!plan.ok) {
    call.reason = plan.reason;
    res.writeHead(501, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: `not translated: ${plan.reason}` } }));
    return;
  }
  const capture = new CallCapture(
    api,
    { rolloutId: 'r1', attemptId: '0', groupId: null, agentName: null, source: 'path' },
    served.length,
    null,
    null,
    Date.now(),
    1 << 26,
    mem.sink,
  );
  capture.callId = mem.sink.callStarted({ type: 'call_start', correlation: capture.correlation, seq: capture.seq, traceId: null, at: capture.startedAt });
  call.capture = capture;
  call.outcome = serveTranslated(res, plan, {
    body,
    agentHeaders: req.rawHeaders,
    upstream: poolFor(target.port),
    fields: FIELDS,
    timeoutMs: target.timeoutMs,
    capture,
    redact,
    settled: () => {
      call.settledEarly = !res.writableFinished;
    },
  });
}

beforeAll(async () => {
  upstream = await startFakeModelServer({ strict: true, script: (r) => (script ? script(r) : vllmCalculatorScript(r)), fault: (r) => fault?.(r) ?? null });
  gateway = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => handle(req, res, Buffer.concat(parts)));
  });
  gateway.on('connection', (s: Socket) => {
    gatewaySockets.add(s);
    s.once('close', () => gatewaySockets.delete(s));
  });
  await new Promise<void>((resolve) => gateway.listen(0, '127.0.0.1', resolve));
  gatewayUrl = `http://127.0.0.1:${(gateway.address() as AddressInfo).port}`;
  setTracingDisabled(true);
});
afterAll(async () => {
  for (const s of gatewaySockets) s.destroy();
  await new Promise<void>((resolve) => gateway.close(() => resolve()));
  for (const p of upstreamPools.values()) p.close();
  await upstream.close();
});
beforeEach(() => {
  script = null;
  fault = null;
  target = { port: upstream.port, timeoutMs: 5_000 };
  redact = null;
  served.length = 0;
  upstream.requests.length = 0;
});

const openai = () => new OpenAI({ baseURL: `${gatewayUrl}/v1`, apiKey: 'sk-test-openai', maxRetries: 0 });
const anthropic = () => new Anthropic({ baseURL: gatewayUrl, apiKey: 'sk-ant-test', maxRetries: 0 });
const chatRequests = () => upstream.requests.filter((r) => r.path === '/v1/chat/completions');

/** The call's end record, as the proxy journals it, and the facts extraction reads from it. */
async function finished(call: Served) {
  const outcome = await call.outcome;
  const capture = call.capture!;
  const record: CallRecord = capture.finish({ status: outcome.status, error: outcome.error, endedAt: Date.now(), endedMono: performance.now() }, 0);
  const { facts, responseBytes } = extractFacts(record, call.read);
  const bytes = (frames: number[]) => call.read(frames);
  return {
    outcome,
    record,
    facts,
    promptIds: Array.from(resolveIds(facts.promptTokenIds, responseBytes) ?? []),
    completionIds: Array.from(resolveIds(facts.choices[0]?.responseTokenIds ?? null, responseBytes) ?? []),
    agentRequest: bytes(capture.agentRequestFrames),
    request: bytes(capture.requestFrames),
    response: bytes(capture.responseFrames),
    agentResponse: bytes(capture.agentResponseFrames),
  };
}

/** Settles once every call the gateway took has ended. */
const allOutcomes = () => Promise.all(served.map((c) => c.outcome));

describe('a Responses call served over chat completions, read by the real openai SDK', () => {
  it('responses.create: the upstream gets a chat completion with the fields added, the agent none of what they bring', async () => {
    const r = await openai().responses.create({ model: 'fake-model', instructions: 'Be brief.', input: 'Say hello.' });
    expect(r.output_text).toBe('Hello from vLLM.');
    expect(r.id).toMatch(/^resp_/);
    const [sent] = chatRequests();
    expect(sent.json).toMatchObject({
      return_token_ids: true,
      logprobs: true,
      model: 'fake-model',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Say hello.' },
      ],
    });
    expect(sent.headers['content-length']).toBe(String(sent.body.length));
    expect(sent.headers.authorization).toBe('Bearer sk-test-openai');
    expect(sent.headers['accept-encoding']).toBe('identity');

    const f = await finished(served[0]);
    expect(f.outcome).toEqual({ status: 'ok', error: null, httpStatus: 200, streamed: false, failure: null });
    expect(served[0].settledEarly).toBe(true);
    expect(f.agentRequest.equals(served[0].agentBody)).toBe(true);
    expect(f.request.equals(sent.body)).toBe(true);
    expect(JSON.parse(f.response.toString())).toMatchObject({ object: 'chat.completion', prompt_token_ids: expect.any(Array) });
    const toAgent = JSON.parse(f.agentResponse.toString()) as Record<string, unknown>;
    expect(toAgent.id).toBe(r.id);
    expect(f.agentResponse.toString()).not.toMatch(/token_ids|"logprobs"/);
    expect(f.record).toMatchObject({
      translation: { upstreamApi: 'chat.completions', notes: [] },
      injected: ['return_token_ids', 'logprobs'],
      httpStatus: 200,
    });
    expect(f.record.ttftMs).not.toBeNull();
    // Exact ids from the upstream answer, for the call the agent made in the Responses API.
    expect(f.promptIds.length).toBeGreaterThan(0);
    expect(f.completionIds.length).toBe(r.usage!.output_tokens);
  });

  it('a field the agent asked for itself keeps its value and is not counted as added', async () => {
    const r = await openai().responses.create({ model: 'fake-model', input: 'Say hello.', include: ['message.output_text.logprobs'], top_logprobs: 2 });
    const part = r.output[0].type === 'message' ? r.output[0].content[0] : null;
    expect(part?.type === 'output_text' && part.logprobs?.length).toBeGreaterThan(0);
    expect(chatRequests()[0].json).toMatchObject({ logprobs: true, top_logprobs: 2, return_token_ids: true });
    expect((await finished(served[0])).record.injected).toEqual(['return_token_ids']);
  });

  it('responses.stream: events reach the SDK as they are translated; the capture holds both streams', async () => {
    const deltas: string[] = [];
    const stream = openai().responses.stream({ model: 'fake-model', input: 'Say hello.' });
    stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
    const final = await stream.finalResponse();
    expect(final.output_text).toBe('Hello from vLLM.');
    expect(deltas.join('')).toBe('Hello from vLLM.');
    expect(chatRequests()[0].json).toMatchObject({ stream: true, stream_options: { include_usage: true }, return_token_ids: true, logprobs: true });
    expect(chatRequests()[0].headers.accept).toBe('text/event-stream');

    const f = await finished(served[0]);
    expect(f.outcome).toEqual({ status: 'ok', error: null, httpStatus: 200, streamed: true, failure: null });
    expect(served[0].settledEarly).toBe(true);
    expect(f.response.toString()).toMatch(/data: \[DONE\]\n\n$/);
    const events = parseSse(f.agentResponse.toString()).events;
    expect(events[0].event).toBe('response.created');
    expect(events[events.length - 1].event).toBe('response.completed');
    expect(f.agentResponse.toString()).not.toMatch(/token_ids/);
    expect(f.record.streamed).toBe(true);
    expect(f.facts.status).toBe('ok');
    expect(f.promptIds.length).toBeGreaterThan(0);
    expect(f.completionIds.length).toBe(final.usage!.output_tokens);
  });

  it('@openai/agents, default model via setDefaultOpenAIClient: a two-turn tool loop, streamed and not, every call translated', async () => {
    setDefaultOpenAIClient(openai());
    const calc = calculatorAgentTool();
    const agent = new Agent({ name: 'calc', instructions: 'Use the calculator.', tools: [calc] });
    for (const stream of [false, true]) {
      served.length = 0;
      upstream.requests.length = 0;
      let finalOutput: unknown;
      if (stream) {
        const result = await run(agent, 'What is 2+2?', { stream: true });
        await result.completed;
        finalOutput = result.finalOutput;
      } else {
        finalOutput = (await run(agent, 'What is 2+2?')).finalOutput;
      }
      expect(finalOutput).toBe('The answer is 4.');
      expect(served.map((c) => c.reason)).toEqual([null, null]);
      const [req1, req2] = chatRequests();
      expect(req1.json).toMatchObject({ return_token_ids: true, logprobs: true });
      expect((req2.json!.messages as { role: string }[]).map((m) => m.role)).toEqual(['system', 'user', 'assistant', 'tool']);
      const [f1, f2] = [await finished(served[0]), await finished(served[1])];
      expect([f1.outcome.streamed, f2.outcome.streamed]).toEqual([stream, stream]);
      // The second prompt continues the first prompt and answer, token for token.
      expect(f2.promptIds.slice(0, f1.promptIds.length + f1.completionIds.length)).toEqual([...f1.promptIds, ...f1.completionIds]);
      expect(f1.facts.choices[0].toolCalls).toEqual([expect.objectContaining({ name: 'calculator' })]);
    }
  });
});

describe('an Anthropic Messages call served over chat completions, read by the real @anthropic-ai/sdk', () => {
  it.each([false, true])('a two-turn tool loop (streamed: %s), with the API key sent upstream as a bearer token', async (stream) => {
    const c = anthropic();
    const ask = (params: Anthropic.MessageCreateParamsNonStreaming) => (stream ? c.messages.stream(params).finalMessage() : c.messages.create(params));
    const messages: Anthropic.MessageParam[] = [{ role: 'user', content: 'What is 2+2?' }];
    const first = await ask({ model: 'fake-model', max_tokens: 256, system: 'Use tools.', messages, tools: [calculatorAnthropicTool] });
    expect(first.stop_reason).toBe('tool_use');
    const use = first.content[0] as Anthropic.ToolUseBlock;
    expect(use).toMatchObject({ type: 'tool_use', name: 'calculator', input: { expression: '2+2' } });
    messages.push({ role: 'assistant', content: first.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '4' }] });
    const second = await ask({ model: 'fake-model', max_tokens: 256, system: 'Use tools.', messages, tools: [calculatorAnthropicTool] });
    expect(second.content).toEqual([{ type: 'text', text: 'The answer is 4.' }]);

    const [req1, req2] = chatRequests();
    expect(req1.json).toMatchObject({ return_token_ids: true, logprobs: true, max_tokens: 256, ...(stream ? { stream: true } : {}) });
    expect(req1.headers.authorization).toBe('Bearer sk-ant-test');
    expect(Object.keys(req1.headers).filter((h) => h === 'x-api-key' || h.startsWith('anthropic-'))).toEqual([]);
    expect(req2.json!.messages).toContainEqual({ role: 'tool', tool_call_id: use.id, content: '4' });
    const [f1, f2] = [await finished(served[0]), await finished(served[1])];
    expect(f1.outcome).toEqual({ status: 'ok', error: null, httpStatus: 200, streamed: stream, failure: null });
    expect(f1.agentRequest.equals(served[0].agentBody)).toBe(true);
    if (stream) expect(parseSse(f1.agentResponse.toString()).events.map((e) => e.event)).toEqual(expect.arrayContaining(['message_start', 'message_stop']));
    else expect(JSON.parse(f1.agentResponse.toString())).toMatchObject({ type: 'message', id: first.id });
    expect(f2.promptIds.slice(0, f1.promptIds.length + f1.completionIds.length)).toEqual([...f1.promptIds, ...f1.completionIds]);
  });

  it('an agent that sends its own authorization header keeps it (the x-api-key is not turned into a second one)', async () => {
    await new Anthropic({ baseURL: gatewayUrl, apiKey: 'sk-ant-test', maxRetries: 0, defaultHeaders: { authorization: 'Bearer own-token' } }).messages.create({
      model: 'fake-model',
      max_tokens: 16,
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(chatRequests()[0].rawHeaders.filter((h) => h.toLowerCase() === 'authorization')).toHaveLength(1);
    expect(chatRequests()[0].headers.authorization).toBe('Bearer own-token');
  });
});

describe('redaction', () => {
  it('journals both request bodies redacted when configured; the upstream still gets the real one', async () => {
    redact = compileRedaction(['user']);
    await openai().responses.create({ model: 'fake-model', input: 'Say hello.', user: 'secret-user' });
    expect(chatRequests()[0].json).toMatchObject({ user: 'secret-user' });
    const f = await finished(served[0]);
    expect(JSON.parse(f.agentRequest.toString())).toMatchObject({ user: '[REDACTED]', input: 'Say hello.' });
    expect(JSON.parse(f.request.toString())).toMatchObject({ user: '[REDACTED]', return_token_ids: true });
  });
});

describe('requests that do not map', () => {
  it('are planned as not translatable with the reason, and nothing is sent upstream', async () => {
    await expect(openai().responses.create({ model: 'fake-model', input: 'x', previous_response_id: 'resp_1' })).rejects.toMatchObject({ status: 501 });
    expect(served[0].reason).toBe('previous_response_id');
    expect(planTranslation('anthropic.messages', Buffer.from('{not json'))).toEqual({ ok: false, reason: 'not_json' });
    expect(upstream.requests).toHaveLength(0);
  });
});

describe('bad upstream answers reach the SDK as the errors it expects, never a hang', () => {
  const contextError = JSON.stringify({
    error: { message: "This model's maximum context length is 32768 tokens.", type: 'BadRequestError', param: null, code: 400 },
  });

  it.each([false, true])('an upstream 400 keeps its status and message (streamed: %s)', async (stream) => {
    fault = () => ({ kind: 'status', status: 400, body: contextError });
    const o = openai().responses;
    await expect(stream ? o.stream({ model: 'fake-model', input: 'x' }).finalResponse() : o.create({ model: 'fake-model', input: 'x' })).rejects.toBeInstanceOf(
      OpenAI.BadRequestError,
    );
    const c = anthropic().messages;
    const params = { model: 'fake-model', max_tokens: 8, messages: [{ role: 'user' as const, content: 'x' }] };
    await expect(stream ? c.stream(params).finalMessage() : c.create(params)).rejects.toMatchObject({
      status: 400,
      error: { type: 'error', error: { type: 'invalid_request_error', message: expect.stringContaining('maximum context length') } },
    });
    const [f] = await Promise.all([finished(served[0]), allOutcomes()]);
    expect(f.outcome).toEqual({ status: 'ok', error: null, httpStatus: 400, streamed: false, failure: null });
    expect(f.response.toString()).toBe(contextError);
    expect(f.facts.status).toBe('error');
  });

  it('an upstream 500 with a text body is an InternalServerError with that text', async () => {
    fault = () => ({ kind: 'status', status: 500, body: 'Internal Server Error', contentType: 'text/plain' });
    await expect(openai().responses.create({ model: 'fake-model', input: 'x' })).rejects.toBeInstanceOf(OpenAI.InternalServerError);
    await expect(anthropic().messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] })).rejects.toBeInstanceOf(
      Anthropic.InternalServerError,
    );
    expect((await allOutcomes()).map((o) => o.httpStatus)).toEqual([500, 500]);
  });

  it.each([false, true])('a 200 that is not a chat completion is a 502 in the agent API shape (streamed: %s)', async (stream) => {
    fault = () => ({ kind: 'non-json', body: '<html>proxy error</html>' });
    const o = openai().responses;
    await expect(stream ? o.stream({ model: 'fake-model', input: 'x' }).finalResponse() : o.create({ model: 'fake-model', input: 'x' })).rejects.toMatchObject({
      status: 502,
      message: expect.stringContaining('lightning-sidecar'),
    });
    const c = anthropic().messages;
    const params = { model: 'fake-model', max_tokens: 8, messages: [{ role: 'user' as const, content: 'x' }] };
    await expect(stream ? c.stream(params).finalMessage() : c.create(params)).rejects.toMatchObject({ status: 502, error: { type: 'error' } });
    const outcomes = await allOutcomes();
    expect(outcomes.map((o) => [o.status, o.httpStatus, o.failure])).toEqual([
      ['error', 502, 'untranslatable_answer'],
      ['error', 502, 'untranslatable_answer'],
    ]);
    const f = await finished(served[0]);
    expect(f.response.toString()).toBe('<html>proxy error</html>');
  });

  it('an error chunk in the stream ends it with the error event each SDK raises', async () => {
    fault = () => ({ kind: 'stream-error', afterEvents: 3, message: 'engine died' });
    await expect(openai().responses.stream({ model: 'fake-model', input: 'Say hello.' }).finalResponse()).rejects.toThrow('engine died');
    await expect(
      anthropic()
        .messages.stream({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'Say hello.' }] })
        .finalMessage(),
    ).rejects.toThrow('engine died');
    const outcomes = await allOutcomes();
    expect(outcomes.map((o) => [o.status, o.error, o.streamed, o.failure])).toEqual([
      ['error', 'engine died', true, 'stream_failed'],
      ['error', 'engine died', true, 'stream_failed'],
    ]);
  });

  it('a connection reset mid-stream ends the stream with an error event, and the call is recorded with the reason', async () => {
    fault = () => ({ kind: 'reset-mid-stream', afterEvents: 2 });
    await expect(openai().responses.stream({ model: 'fake-model', input: 'Say hello.' }).finalResponse()).rejects.toThrow(/closed the stream before its end/);
    await expect(
      anthropic()
        .messages.stream({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'Say hello.' }] })
        .finalMessage(),
    ).rejects.toThrow(/closed the stream before its end/);
    const f = await finished(served[0]);
    expect(f.outcome).toMatchObject({ status: 'error', streamed: true, failure: 'stream_failed' });
    expect(f.record.error).toMatch(/closed the stream before its end/);
  });

  it('an unreachable upstream is a 502 naming it, in each API shape', async () => {
    const closed = http.createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    target = { port: (closed.address() as AddressInfo).port, timeoutMs: 5_000 };
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    await expect(openai().responses.create({ model: 'fake-model', input: 'x' })).rejects.toMatchObject({
      status: 502,
      message: expect.stringMatching(/unreachable: ECONNREFUSED/),
    });
    await expect(
      anthropic()
        .messages.stream({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] })
        .finalMessage(),
    ).rejects.toMatchObject({ status: 502, error: { error: { type: 'api_error' } } });
    expect((await allOutcomes()).map((o) => o.failure)).toEqual(['upstream_unreachable', 'upstream_unreachable']);
  });
});

/** An upstream that answers a stream's head and first event, then says nothing more. */
async function stallingUpstream(): Promise<{ port: number; closedByPeer: Promise<void>; close(): Promise<void> }> {
  let peerClosed!: () => void;
  const closedByPeer = new Promise<void>((r) => (peerClosed = r));
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    req.resume();
    req.socket.once('close', () => peerClosed());
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(
      `data: ${JSON.stringify({ id: 'chatcmpl-stall', choices: [{ index: 0, delta: { role: 'assistant', content: 'Hel' }, finish_reason: null }] })}\n\n`,
    );
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    closedByPeer,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

describe('time and the agent going away', () => {
  it('an upstream that goes idle mid-stream past the timeout ends the stream with an error event', async () => {
    const stall = await stallingUpstream();
    target = { port: stall.port, timeoutMs: 300 };
    try {
      const deltas: string[] = [];
      const stream = openai().responses.stream({ model: 'fake-model', input: 'Say hello.' });
      stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
      await expect(stream.finalResponse()).rejects.toThrow(/idle for 300 ms/);
      expect(deltas).toEqual(['Hel']);
      expect(await served[0].outcome).toMatchObject({ status: 'error', streamed: true, failure: 'stream_failed' });
    } finally {
      await stall.close();
    }
  });

  it('an upstream that never answers is a 504 after the timeout', async () => {
    const silent = http.createServer(() => {});
    const sockets = new Set<Socket>();
    silent.on('connection', (s: Socket) => sockets.add(s));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    target = { port: (silent.address() as AddressInfo).port, timeoutMs: 300 };
    try {
      await expect(anthropic().messages.create({ model: 'fake-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] })).rejects.toMatchObject({
        status: 504,
        error: { error: { type: 'timeout_error' } },
      });
      expect(await served[0].outcome).toMatchObject({ status: 'error', httpStatus: 504, failure: 'upstream_timeout' });
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  });

  it('an agent that goes away mid-stream aborts the upstream call, and the outcome says so', async () => {
    const stall = await stallingUpstream();
    target = { port: stall.port, timeoutMs: 5_000 };
    try {
      const controller = new AbortController();
      const stream = openai().responses.stream({ model: 'fake-model', input: 'Say hello.' }, { signal: controller.signal });
      stream.on('response.output_text.delta', () => controller.abort());
      await expect(stream.finalResponse()).rejects.toThrow();
      expect(await served[0].outcome).toMatchObject({ status: 'aborted', failure: 'client_abort', streamed: true });
      await stall.closedByPeer;
    } finally {
      await stall.close();
    }
  });
});

describe('SseSplitter', () => {
  const text =
    'event: first\r\ndata: {"a":"h\u00e9 ✓"}\r\n\r\n' +
    ': a comment\n' +
    'data: line one\ndata: line two\n\n' +
    'data:no-space\r\rdata: [DONE]\n\n' +
    'data: {"cut":true}';
  const bytes = Buffer.from(text);
  const expected = [
    { event: 'first', data: '{"a":"hé ✓"}' },
    { event: 'message', data: 'line one\nline two' },
    { event: 'message', data: 'no-space' },
    { event: 'message', data: '[DONE]' },
    { event: 'message', data: '{"cut":true}' },
  ];

  it('gives the same events whatever the chunk boundaries: inside CRLF, inside a multi-byte character, one byte at a time', () => {
    for (let size = 1; size <= bytes.length; size++) {
      const s = new SseSplitter();
      const events = [];
      for (let at = 0; at < bytes.length; at += size) events.push(...s.push(bytes.subarray(at, at + size)));
      events.push(...s.end());
      expect(events).toEqual(expected);
    }
  });

  it('refuses an event longer than its bound', () => {
    const s = new SseSplitter(16);
    expect(() => s.push(Buffer.from(`data: ${'x'.repeat(32)}`))).toThrow(/exceeds 16 characters/);
    const t = new SseSplitter(16);
    expect(() => t.push(Buffer.from(`data: ${'x'.repeat(10)}\ndata: ${'x'.repeat(10)}\n`))).toThrow(/exceeds 16 characters/);
  });
});
