import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import OpenAI from 'openai';
import type { Trajectory, Transition } from '../../src/model/records';
import { CALCULATOR_TOOLS as TOOLS, startQwen3Server, type ChatMessage, type Qwen3Server } from '../support/qwen3-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';
import { inToolSpan } from '../support/tool-span';

/**
 * Token-in and AIR together: a tool-using agent on the real `openai` SDK, its tools in OTel
 * `execute_tool` spans (the division tool fails), runs the same rollout through a sidecar with
 * token-in off and one with it on, in front of a vLLM stand-in with Qwen3's real template. The
 * records must say what the agent received (finish reasons, tool calls with the ids it got), and
 * the tool spans must join those calls, so the intermediate rewards and the trajectories'
 * token rewards are the same with token-in on as off, streamed or not, for the rollout's first
 * (rendered) call as for the spliced ones.
 */

const QUERIES = ['Compute 3*4 and 7+8.', 'Now compute 10/2.', 'Finally 2*5 and 9-1.'];

/** The calculator the agent runs: it cannot divide (a failing tool, an ERROR span). */
function calculator(expression: string): string {
  const m = /^(-?\d+)\s*([-+*/])\s*(-?\d+)$/.exec(expression.trim());
  if (!m) throw new Error(`cannot parse ${expression}`);
  const [a, b] = [Number(m[1]), Number(m[3])];
  if (m[2] === '/') throw new Error('division is not supported');
  return String(m[2] === '+' ? a + b : m[2] === '-' ? a - b : a * b);
}

/** What the agent received on each call: finish reason and tool calls (with their ids). */
interface Received {
  finish: string | null;
  toolCalls: { id: string; name: string; arguments: string }[];
}

async function complete(client: OpenAI, messages: ChatMessage[], stream: boolean): Promise<Received & { content: string | null }> {
  const body = { model: 'Qwen/Qwen3-8B', messages: messages as never, tools: TOOLS };
  if (!stream) {
    const c = (await client.chat.completions.create(body)).choices[0];
    const calls = (c.message.tool_calls ?? []).flatMap((t) =>
      t.type === 'function' ? [{ id: t.id, name: t.function.name, arguments: t.function.arguments }] : [],
    );
    return { finish: c.finish_reason, toolCalls: calls, content: c.message.content };
  }
  const s = await client.chat.completions.create({ ...body, stream: true });
  const out: Received & { content: string | null } = { finish: null, toolCalls: [], content: null };
  for await (const chunk of s) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.finish_reason) out.finish = c.finish_reason;
    if (c.delta.content) out.content = (out.content ?? '') + c.delta.content;
    for (const t of c.delta.tool_calls ?? []) {
      out.toolCalls[t.index] ??= { id: '', name: '', arguments: '' };
      if (t.id) out.toolCalls[t.index].id = t.id;
      if (t.function?.name) out.toolCalls[t.index].name += t.function.name;
      if (t.function?.arguments) out.toolCalls[t.index].arguments += t.function.arguments;
    }
  }
  return out;
}

/** The agent over QUERIES; what it received on each call, in order. */
async function runAgent(sidecar: TestSidecar, rollout: string, stream: boolean): Promise<Received[]> {
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'calculator-agent' }),
    spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces` }))],
  });
  const tracer = provider.getTracer('agent');
  const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rollout}/v1`, apiKey: 'sk-test', maxRetries: 0 });
  const messages: ChatMessage[] = [{ role: 'system', content: 'You are a careful calculator agent.' }];
  const received: Received[] = [];
  try {
    for (const q of QUERIES) {
      messages.push({ role: 'user', content: q });
      for (let step = 0; step < 8; step++) {
        const m = await complete(client, messages, stream);
        received.push({ finish: m.finish, toolCalls: m.toolCalls });
        const assistant: ChatMessage = { role: 'assistant', content: m.content };
        if (m.toolCalls.length > 0)
          assistant.tool_calls = m.toolCalls.map((t) => ({ id: t.id, type: 'function', function: { name: t.name, arguments: t.arguments } }));
        messages.push(assistant);
        if (m.toolCalls.length === 0) break;
        for (const c of m.toolCalls) {
          const { expression } = JSON.parse(c.arguments) as { expression: string };
          const content = inToolSpan(tracer, c.name, c.id, () => calculator(expression), { 'lightning.rollout_id': rollout });
          messages.push({ role: 'tool', tool_call_id: c.id, content });
        }
      }
    }
    await provider.forceFlush();
  } finally {
    await provider.shutdown();
  }
  return received;
}

async function recordsOf(sidecar: TestSidecar, rollout: string): Promise<{ transitions: Transition[]; trajectories: Trajectory[] }> {
  const deadline = Date.now() + 20_000;
  while (!sidecar.episodes().some((e) => e.rollout_id === rollout)) {
    if (Date.now() > deadline) throw new Error(`no episode for ${rollout}`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    transitions: sidecar
      .transitions()
      .filter((t) => t.rollout_id === rollout)
      .sort((a, b) => a.seq - b.seq),
    trajectories: sidecar.trajectories().filter((t) => t.rollout_id === rollout),
  };
}

/**
 * Each trajectory's token rewards, checked against its turns (AIR on each turn's last sampled
 * token, the final reward on the segment's last), and returned as (seq, AIR reward) per turn.
 */
function airByTurn(trajectories: Trajectory[], final: number): [number, number | null][] {
  const out: [number, number | null][] = [];
  for (const t of trajectories) {
    const expected = new Map<number, number>();
    t.turns.forEach((turn, i) => {
      const value = (turn.intermediate_reward ?? 0) + (i === t.turns.length - 1 ? final : 0);
      if (turn.intermediate_reward !== null || i === t.turns.length - 1) expected.set(turn.response_end - 1, value);
      out.push([turn.seq, turn.intermediate_reward]);
    });
    const got = new Map(t.token_rewards.map((r) => [r.position, r.value]));
    expect([...got.keys()].sort((a, b) => a - b)).toEqual([...expected.keys()].sort((a, b) => a - b));
    for (const [position, value] of expected) expect(got.get(position)).toBeCloseTo(value, 9);
  }
  return out.sort((a, b) => a[0] - b[0]);
}

describe('token-in keeps the tool calls the agent received, so AIR joins its tool spans', () => {
  let server: Qwen3Server;
  let plain: TestSidecar;
  let tokenIn: TestSidecar;
  const settings = (tokenInOn: boolean) => ({
    receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: tokenInOn } } },
    processors: { episodes: { tool_span_wait_ms: 2_000 } },
  });

  beforeAll(async () => {
    server = await startQwen3Server();
    [plain, tokenIn] = await Promise.all([startSidecar(server.url, settings(false)), startSidecar(server.url, settings(true))]);
  }, 30_000);
  afterAll(async () => {
    await Promise.all([plain?.stop(), tokenIn?.stop()]);
    await server?.close();
  });

  it.each([
    { name: 'not streamed', stream: false },
    { name: 'streamed', stream: true },
  ])(
    '$name: the same finish reasons, tool calls, intermediate rewards and token rewards as without token-in',
    async ({ stream }) => {
      const rollout = `ti-air-${stream ? 'stream' : 'whole'}`;
      const off = await runAgent(plain, rollout, stream);
      const on = await runAgent(tokenIn, rollout, stream);
      // The agent's conversation is the same either way: 5 tool calls (one a division) and 3 answers.
      const shape = (r: Received[]) => r.map((x) => [x.finish, x.toolCalls.map((t) => `${t.name}(${t.arguments})`)]);
      expect(shape(on)).toEqual(shape(off));
      expect(on.filter((r) => r.finish === 'tool_calls')).toHaveLength(5);
      for (const sidecar of [plain, tokenIn]) expect((await postReward(sidecar.origin, rollout, 1)).status).toBeLessThan(300);
      const a = await recordsOf(plain, rollout);
      const b = await recordsOf(tokenIn, rollout);
      expect(b.transitions.map((t) => t.token_in)).toEqual(['rendered:first_call', ...Array(on.length - 1).fill('spliced')]);
      for (const [records, received] of [
        [a, off],
        [b, on],
      ] as const) {
        expect(records.transitions).toHaveLength(received.length);
        records.transitions.forEach((t, i) => {
          // The record says what this agent received, ids included.
          expect(t.finish_reason).toBe(received[i].finish);
          expect(t.tool_calls.map((c) => c.id)).toEqual(received[i].toolCalls.map((c) => c.id));
          expect(t.tool_calls.map((c) => c.name)).toEqual(received[i].toolCalls.map((c) => c.name));
          for (const c of t.tool_calls) expect(c.join).toBe('tool_call_id');
        });
      }
      // The same outcomes and rewards on the same calls, the rollout's first call included.
      const outcomes = (ts: Transition[]) =>
        ts.map((t) => [t.seq, t.finish_reason, t.tool_calls.map((c) => [c.name, c.status, c.reward]), t.intermediate_reward, t.reward]);
      expect(outcomes(b.transitions)).toEqual(outcomes(a.transitions));
      expect(b.transitions[0].tool_calls).toEqual([expect.objectContaining({ status: 'ok', reward: 0.1 })]);
      const failed = b.transitions.filter((t) => t.tool_calls.some((c) => c.status === 'error'));
      expect(failed).toHaveLength(1);
      expect(failed[0].intermediate_reward).toBe(-0.5);
      // Token rewards: AIR on each turn's last sampled token, the same per call with token-in on as off.
      expect(b.trajectories).toHaveLength(1);
      expect(airByTurn(b.trajectories, 1)).toEqual(airByTurn(a.trajectories, 1));
      expect(b.trajectories[0].token_rewards.filter((r) => r.value === -0.5)).toHaveLength(1);
    },
    90_000,
  );
});
