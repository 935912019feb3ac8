import OpenAI from 'openai';
import type { Trajectory } from '../../src/model/records';
import { CALCULATOR_TOOLS, standInExpert, startQwen3Server, type ChatMessage, type Qwen3Server, type RoutingStandIn } from '../support/qwen3-server';
import { sglangStandInExpert, startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { rewardedTrajectories as trajectoriesOf, startSidecar, type TestSidecar } from '../support/sidecar';

// MoE routing replay through the sidecar: a vLLM stand-in with Qwen3's real template answers
// every non-streamed call with routed experts in vLLM's wire form (base64 .npy, or v0.21's nested
// lists), an agent on the real `openai` SDK runs a multi-turn tool loop, and every trajectory's
// rows must be, position by position, what the server returned for that position: each sampled
// token's row from the answer that sampled it, a prompt row from the first answer that ran it.

const QUERIES = ['Compute 3*4 and 7+8.', 'Now compute 10-2.'];

async function runAgent(baseURL: string, stream: boolean): Promise<number> {
  const client = new OpenAI({ baseURL, apiKey: 'sk-test', maxRetries: 0 });
  const messages: ChatMessage[] = [{ role: 'system', content: 'You are a careful calculator agent.' }];
  let calls = 0;
  for (const q of QUERIES) {
    messages.push({ role: 'user', content: q });
    for (let step = 0; step < 6; step++) {
      calls++;
      const body = { model: 'Qwen/Qwen3-8B', messages: messages as never, tools: CALCULATOR_TOOLS };
      let content: string | null = null;
      let toolCalls: { id: string; type: 'function'; function: { name: string; arguments: string } }[] = [];
      if (stream) {
        for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
          const d = chunk.choices[0]?.delta;
          if (d?.content) content = (content ?? '') + d.content;
          for (const t of d?.tool_calls ?? [])
            toolCalls[t.index] = { id: t.id!, type: 'function', function: { name: t.function!.name!, arguments: t.function!.arguments! } };
        }
      } else {
        const m = (await client.chat.completions.create(body)).choices[0].message;
        content = m.content;
        toolCalls = (m.tool_calls ?? []).flatMap((t) => (t.type === 'function' ? [{ id: t.id, type: 'function' as const, function: t.function }] : []));
      }
      messages.push({ role: 'assistant', content, ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}) });
      if (toolCalls.length === 0) break;
      for (const c of toolCalls) {
        const [a, op, b] = /(\d+)\s*([-+*/])\s*(\d+)/.exec((JSON.parse(c.function.arguments) as { expression: string }).expression)!.slice(1);
        const x = Number(a);
        const y = Number(b);
        messages.push({ role: 'tool', tool_call_id: c.id, content: String(op === '+' ? x + y : op === '-' ? x - y : op === '*' ? x * y : x / y) });
      }
    }
  }
  return calls;
}

/**
 * Checks a trajectory's rows against the stand-in: the row of position p is from the first of its
 * turns whose answer ran p and decided a token after it (responseEnd - 1 > p); `answers` maps a
 * turn's seq to the stand-in's answer number. Returns the positions with no row.
 */
function checkRows(t: Trajectory, r: RoutingStandIn, answers: (seq: number) => number): number[] {
  const re = t.routed_experts!;
  expect(re.dtype).toBe('uint8');
  expect(re.shape).toEqual([t.token_ids.length - 1, r.layers, r.topK]);
  const data = Buffer.from(re.data, 'base64');
  expect(data.length).toBe((t.token_ids.length - 1) * r.layers * r.topK);
  const missing = new Set(re.missing.flatMap(([s, e]) => Array.from({ length: e - s }, (_, i) => s + i)));
  for (let p = 0; p < t.token_ids.length - 1; p++) {
    const turn = t.turns.find((x) => x.response_end - 1 > p)!;
    const answer = answers(turn.seq);
    const returned = r.returned[answer];
    if (returned.values === null) {
      expect(missing.has(p)).toBe(true);
      continue;
    }
    // The answer saw the trajectory's ids up to p.
    expect(returned.ids[p]).toBe(t.token_ids[p]);
    for (let l = 0; l < r.layers; l++)
      for (let k = 0; k < r.topK; k++) expect(data[(p * r.layers + l) * r.topK + k]).toBe(standInExpert(r, answer, p, t.token_ids[p], l, k));
  }
  return [...missing];
}

describe('routed experts (MoE routing replay) from vLLM answers to trajectories', () => {
  let server: Qwen3Server;
  let nestedServer: Qwen3Server;
  const routing: RoutingStandIn = { layers: 4, topK: 2, experts: 64, returned: [], skip: () => false };
  const nested: RoutingStandIn = { layers: 3, topK: 2, experts: 40, returned: [], form: 'nested' };
  let plain: TestSidecar;
  let tokenIn: TestSidecar;
  let v021: TestSidecar;

  beforeAll(async () => {
    [server, nestedServer] = await Promise.all([startQwen3Server({ routing }), startQwen3Server({ routing: nested })]);
    const vllm = (tokenInOn: boolean) => ({ receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: tokenInOn } } } });
    [plain, tokenIn, v021] = await Promise.all([
      startSidecar(server.url, vllm(false)),
      startSidecar(server.url, vllm(true)),
      startSidecar(nestedServer.url, vllm(false)),
    ]);
  }, 30_000);
  afterAll(async () => {
    await Promise.all([plain?.stop(), tokenIn?.stop(), v021?.stop()]);
    await Promise.all([server?.close(), nestedServer?.close()]);
  });

  it('chat calls: every row is what the server returned for its position, in every segment; complete, full coverage', async () => {
    const first = routing.returned.length;
    const calls = await runAgent(`${plain.origin}/rollout/re-chat/v1`, false);
    const trajectories = await trajectoriesOf(plain, 're-chat');
    expect(routing.returned.length - first).toBe(calls);
    // Reasoning dropped by the agent: Qwen3's template re-renders, so the rollout has several segments.
    expect(trajectories.length).toBeGreaterThan(1);
    for (const t of trajectories) {
      expect(t.routing_complete).toBe(true);
      expect(t.routing_coverage).toBe(1);
      expect(checkRows(t, routing, (seq) => first + seq)).toEqual([]);
    }
  }, 60_000);

  it('token-in (completions answers): one segment, every row from the answer that ran it', async () => {
    const first = routing.returned.length;
    await runAgent(`${tokenIn.origin}/rollout/re-token-in/v1`, false);
    const [t, ...more] = await trajectoriesOf(tokenIn, 're-token-in');
    expect(more).toEqual([]);
    expect(t.routing_complete).toBe(true);
    expect(checkRows(t, routing, (seq) => first + seq)).toEqual([]);
    // Later answers ran the earlier positions again, with other experts: the rows came from the first.
    expect(t.turns.length).toBeGreaterThan(2);
  }, 60_000);

  it("vLLM v0.21's nested lists, a row per token: the same rows, the last token's row unused", async () => {
    const first = nested.returned.length;
    await runAgent(`${v021.origin}/rollout/re-nested/v1`, false);
    for (const t of await trajectoriesOf(v021, 're-nested')) {
      expect(t.routing_complete).toBe(true);
      expect(checkRows(t, nested, (seq) => first + seq)).toEqual([]);
    }
  }, 60_000);

  it('one answer without routing: its positions are missing, the trajectory is flagged incomplete, counted and logged', async () => {
    const first = routing.returned.length;
    routing.skip = (answer) => answer === first + 1;
    try {
      await runAgent(`${tokenIn.origin}/rollout/re-missing/v1`, false);
    } finally {
      routing.skip = () => false;
    }
    const [t] = await trajectoriesOf(tokenIn, 're-missing');
    expect(t.routing_complete).toBe(false);
    expect(t.routing_coverage).toBeGreaterThan(0);
    expect(t.routing_coverage).toBeLessThan(1);
    const missing = checkRows(t, routing, (seq) => first + seq);
    // The second answer's own positions: from the first turn's last sampled token to its last but one.
    expect(missing).toEqual(Array.from({ length: t.turns[1].response_end - t.turns[0].response_end }, (_, i) => t.turns[0].response_end - 1 + i));
    const metrics = await tokenIn.app.metrics.registry.metrics();
    expect(metrics).toMatch(/lightning_sidecar_trajectory_routing_total\{complete="false"\} 1/);
    expect(metrics).toMatch(/lightning_sidecar_trajectory_routing_total\{complete="true"\} [1-9]/);
    const warning = tokenIn.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => String(l.msg).includes('routed experts are incomplete'));
    expect(warning).toMatchObject({ level: 'warn', trajectory_id: t.trajectory_id, problems: ['a call returned no routing', 'positions without a row'] });
  }, 60_000);

  it('streamed calls (vLLM gives no routing on streams): no routing fields at all, as before', async () => {
    await runAgent(`${plain.origin}/rollout/re-stream/v1`, true);
    for (const t of await trajectoriesOf(plain, 're-stream')) {
      expect(Object.keys(t)).not.toEqual(expect.arrayContaining(['routed_experts']));
      expect('routing_complete' in t || 'routing_coverage' in t).toBe(false);
    }
  }, 60_000);
});

describe('routed experts from SGLang (asked for, raw int32 shaped by processors.routed_experts.sglang)', () => {
  const SHAPE = { layers: 3, topK: 2 };
  let server: FakeModelServer;
  const sidecars: TestSidecar[] = [];
  beforeAll(async () => {
    server = await startFakeModelServer({ flavor: 'sglang', sglangRouting: SHAPE });
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await server?.close();
  });
  const sidecarWith = async (routedExperts: Record<string, unknown>): Promise<TestSidecar> => {
    const s = await startSidecar(server.url, { receivers: { llm_proxy: { upstream_flavor: 'sglang' } }, processors: { routed_experts: routedExperts } });
    sidecars.push(s);
    return s;
  };
  /** A tool call, then the answer; the agent gets what it got (the raw answers are returned). */
  const twoCalls = async (sidecar: TestSidecar, rollout: string): Promise<Record<string, unknown>[]> => {
    const answers: Record<string, unknown>[] = [];
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rollout}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const tools = [
      { type: 'function' as const, function: { name: 'calculator', parameters: { type: 'object', properties: { expression: { type: 'string' } } } } },
    ];
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 2+2?' }];
    const first = await client.chat.completions.create({ model: 'fake-model', messages, tools }).asResponse();
    const a = (await first.json()) as { choices: { message: OpenAI.ChatCompletionMessage }[] };
    answers.push(a);
    const call = a.choices[0].message.tool_calls![0];
    messages.push(a.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '4' });
    answers.push((await (await client.chat.completions.create({ model: 'fake-model', messages, tools }).asResponse()).json()) as Record<string, unknown>);
    return answers;
  };

  it('asked for, read, and not passed to the agent, which did not ask: every row as the server wrote it', async () => {
    const sidecar = await sidecarWith({ sglang: { layers: SHAPE.layers, top_k: SHAPE.topK } });
    const before = server.requests.length;
    const answers = await twoCalls(sidecar, 're-sglang');
    const asked = server.requests.slice(before).filter((r) => r.path.startsWith('/v1/chat/completions'));
    expect(asked.map((r) => r.json?.return_routed_experts)).toEqual([true, true]);
    for (const a of answers) expect(a.sglext).toEqual({ routed_experts: null });
    const [t, ...more] = await trajectoriesOf(sidecar, 're-sglang');
    expect(more).toEqual([]);
    expect(t.routing_complete).toBe(true);
    const re = t.routed_experts!;
    expect(re.shape).toEqual([t.token_ids.length - 1, SHAPE.layers, SHAPE.topK]);
    expect(re.dtype).toBe('uint8');
    const data = Buffer.from(re.data, 'base64');
    const expected = Buffer.alloc(data.length);
    for (let p = 0; p < t.token_ids.length - 1; p++)
      for (let l = 0; l < SHAPE.layers; l++)
        for (let k = 0; k < SHAPE.topK; k++) expected[(p * SHAPE.layers + l) * SHAPE.topK + k] = sglangStandInExpert(p, t.token_ids[p], l, k);
    expect(data.equals(expected)).toBe(true);
  }, 30_000);

  it('without the setting nothing is asked for and no trajectory has routing fields; a wrong shape is flagged, not published as complete', async () => {
    const off = await sidecarWith({});
    const before = server.requests.length;
    await twoCalls(off, 're-sglang-off');
    expect(server.requests.slice(before).some((r) => 'return_routed_experts' in (r.json ?? {}))).toBe(false);
    for (const t of await trajectoriesOf(off, 're-sglang-off')) expect('routed_experts' in t).toBe(false);
    // A model config read wrong: 5 × 2 experts a row where the server writes 3 × 2.
    const wrong = await sidecarWith({ sglang: { layers: 5, top_k: 2 } });
    await twoCalls(wrong, 're-sglang-wrong');
    const [t] = await trajectoriesOf(wrong, 're-sglang-wrong');
    expect(t.routing_complete).toBe(false);
    const warning = wrong.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => String(l.msg).includes('routed experts are incomplete'));
    expect(JSON.stringify(warning?.problems)).toMatch(/not whole rows of 5 layers × 2 int32 experts|not up to its last token but one/);
  }, 30_000);
});
