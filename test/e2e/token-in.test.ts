import OpenAI from 'openai';
import { loadConfig } from '../../src/config/load';
import { CALCULATOR_TOOLS as TOOLS, decode, encode, renderChat, sample, startQwen3Server, type ChatMessage, type Qwen3Server } from '../support/qwen3-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Token-in against a vLLM stand-in with Qwen3's real tokenizer and chat template, driven by agents
 * written with the real `openai` SDK: tool loops over several user queries, with the reasoning
 * dropped (what most frameworks do), sent back, and streamed. Every call after a rollout's first
 * must continue the exact ids the model sampled, and the agent must get what it gets without
 * token-in.
 */

const QUERIES = ['Compute 3*4 and 7+8.', 'Now compute 10-2.', 'Finally 6/3, 2*5 and 9-1.'];

/** Waits until the rollout's episode is exported. */
async function episodeOf(sidecar: TestSidecar, rollout: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!sidecar.episodes().some((e) => e.rollout_id === rollout)) {
    if (Date.now() > deadline) throw new Error(`no episode for ${rollout}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

interface Transcript {
  toolCalls: string[];
  answers: string[];
  /** The messages of each call, as sent. */
  sent: ChatMessage[][];
}

function evaluate(expression: string): string {
  const m = /^(-?\d+(?:\.\d+)?)\s*([-+*/])\s*(-?\d+(?:\.\d+)?)$/.exec(expression.trim());
  if (!m) return 'error';
  const [a, b] = [Number(m[1]), Number(m[3])];
  return String(m[2] === '+' ? a + b : m[2] === '-' ? a - b : m[2] === '*' ? a * b : a / b);
}

type Message = {
  content: string | null;
  reasoning_content?: string | null;
  tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[];
};

/** One chat call, streamed or not, read back into a message. */
async function complete(client: OpenAI, messages: ChatMessage[], stream: boolean): Promise<Message> {
  const body = { model: 'Qwen/Qwen3-8B', messages: messages as never, tools: TOOLS };
  if (!stream) return (await client.chat.completions.create(body)).choices[0].message as unknown as Message;
  const s = await client.chat.completions.create({ ...body, stream: true });
  const out: Message = { content: null, reasoning_content: null };
  const calls: NonNullable<Message['tool_calls']> = [];
  for await (const chunk of s) {
    const d = chunk.choices[0]?.delta as
      | { content?: string | null; reasoning_content?: string; tool_calls?: { index: number; id?: string; function?: { name?: string; arguments?: string } }[] }
      | undefined;
    if (!d) continue;
    if (d.content) out.content = (out.content ?? '') + d.content;
    if (d.reasoning_content) out.reasoning_content = (out.reasoning_content ?? '') + d.reasoning_content;
    for (const t of d.tool_calls ?? []) {
      calls[t.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
      if (t.id) calls[t.index].id = t.id;
      if (t.function?.name) calls[t.index].function.name += t.function.name;
      if (t.function?.arguments) calls[t.index].function.arguments += t.function.arguments;
    }
  }
  if (calls.length > 0) out.tool_calls = calls;
  return out;
}

/** The calculator agent over QUERIES; `edit` changes the history before the call it names (by index). */
async function runAgent(
  baseURL: string,
  o: { stream: boolean; keepReasoning: boolean; edit?: (messages: ChatMessage[], call: number) => void },
): Promise<Transcript> {
  const client = new OpenAI({ baseURL, apiKey: 'sk-test', maxRetries: 0 });
  const messages: ChatMessage[] = [{ role: 'system', content: 'You are a careful calculator agent.' }];
  const t: Transcript = { toolCalls: [], answers: [], sent: [] };
  for (const q of QUERIES) {
    messages.push({ role: 'user', content: q });
    for (let step = 0; step < 8; step++) {
      o.edit?.(messages, t.sent.length);
      t.sent.push(structuredClone(messages));
      const m = await complete(client, messages, o.stream);
      const assistant: ChatMessage = { role: 'assistant', content: m.content };
      if (o.keepReasoning && m.reasoning_content) assistant.reasoning_content = m.reasoning_content;
      if (m.tool_calls?.length) assistant.tool_calls = m.tool_calls;
      messages.push(assistant);
      if (!m.tool_calls?.length) {
        t.answers.push((m.content ?? '').trim());
        break;
      }
      for (const c of m.tool_calls) {
        const args = JSON.parse(c.function.arguments) as { expression: string };
        t.toolCalls.push(`${c.function.name}(${args.expression})`);
        messages.push({ role: 'tool', tool_call_id: c.id, content: evaluate(args.expression) });
      }
    }
  }
  return t;
}

describe('token-in through a real chat template', () => {
  let server: Qwen3Server;
  let plain: TestSidecar;
  let tokenIn: TestSidecar;

  beforeAll(async () => {
    server = await startQwen3Server();
    plain = await startSidecar(server.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    tokenIn = await startSidecar(server.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: true } } } });
  }, 30_000);
  afterAll(async () => {
    await Promise.all([plain?.stop(), tokenIn?.stop()]);
    await server?.close();
  });

  const variants = [
    { name: 'reasoning dropped', stream: false, keepReasoning: false },
    { name: 'reasoning sent back', stream: false, keepReasoning: true },
    { name: 'streamed, reasoning dropped', stream: true, keepReasoning: false },
  ];

  it.each(variants)(
    '$name: every call after the first continues the sampled ids, one trajectory segment, the same answers as without token-in',
    async (v) => {
      const rollout = `ti-${v.name.replace(/\W+/g, '-')}`;
      const without = await runAgent(`${plain.origin}/rollout/${rollout}/v1`, v);
      const before = server.completionPrompts.length;
      const withTokenIn = await runAgent(`${tokenIn.origin}/rollout/${rollout}/v1`, v);
      // The agent sees what it sees without token-in.
      expect(withTokenIn.toolCalls).toEqual(without.toolCalls);
      expect(withTokenIn.answers).toEqual(without.answers);
      expect(withTokenIn.answers).toEqual(['3*4 = 12, 7+8 = 15', '10-2 = 8', '6/3 = 2, 2*5 = 10, 9-1 = 8']);
      // The server got token-id prompts: the first as its template renders the conversation, each
      // later one the previous prompt + the ids the model sampled + the appended part only.
      const prompts = server.completionPrompts.slice(before);
      expect(prompts).toHaveLength(withTokenIn.sent.length);
      expect(prompts[0]).toEqual(encode(renderChat(withTokenIn.sent[0], TOOLS, true)));
      for (let i = 1; i < prompts.length; i++) {
        const sampled = sample(decode(prompts[i - 1], false)).ids;
        const head = [...prompts[i - 1], ...sampled];
        expect(prompts[i].slice(0, head.length)).toEqual(head);
        const appended = prompts[i].slice(head.length);
        // What was appended is the end of the server's own rendering of the whole conversation: the
        // newline after the model's <|im_end|>, then the new turns and the generation prompt.
        const fresh = encode(renderChat(withTokenIn.sent[i], TOOLS, true));
        expect(appended.length).toBeGreaterThan(2);
        expect(appended).toEqual(fresh.slice(fresh.length - appended.length));
        expect(decode(appended, false)).toMatch(/^\n<\|im_start\|>user\n[\s\S]*<\|im_end\|>\n<\|im_start\|>assistant\n$/);
      }
      // The rendering alone would not continue the sampled ids: that is what token-in is for.
      if (!v.keepReasoning) {
        const last = withTokenIn.sent.length - 1;
        expect(encode(renderChat(withTokenIn.sent[last], TOOLS, true))).not.toEqual(prompts[last]);
      }
      await postReward(tokenIn.origin, rollout, 1);
      await episodeOf(tokenIn, rollout);
      const calls = tokenIn.transitions().filter((t) => t.rollout_id === rollout);
      expect(calls.map((t) => t.token_in)).toEqual(['rendered:first_call', ...Array(calls.length - 1).fill('spliced')]);
      expect(calls.every((t) => t.translation?.upstream_api === 'completions')).toBe(true);
      const trajectories = tokenIn.trajectories().filter((t) => t.rollout_id === rollout);
      expect(trajectories).toHaveLength(1);
      const lastPrompt = prompts[prompts.length - 1];
      expect(trajectories[0].token_ids).toEqual([...lastPrompt, ...sample(decode(lastPrompt, false)).ids]);
    },
    60_000,
  );

  it('an edited history is rendered afresh (a new segment) and the agent is served as usual; the next call continues again', async () => {
    const rollout = 'ti-edited';
    const before = server.completionPrompts.length;
    // Before the fourth call, the agent rewrites its system prompt (as context compaction would).
    const t = await runAgent(`${tokenIn.origin}/rollout/${rollout}/v1`, {
      stream: false,
      keepReasoning: false,
      edit: (messages, call) => {
        if (call === 3) messages[0] = { role: 'system', content: 'You are a calculator agent. Be brief.' };
      },
    });
    expect(t.answers).toEqual(['3*4 = 12, 7+8 = 15', '10-2 = 8', '6/3 = 2, 2*5 = 10, 9-1 = 8']);
    const prompts = server.completionPrompts.slice(before);
    expect(prompts[3]).toEqual(encode(renderChat(t.sent[3], TOOLS, true)));
    await postReward(tokenIn.origin, rollout, 1);
    await episodeOf(tokenIn, rollout);
    const how = tokenIn
      .transitions()
      .filter((x) => x.rollout_id === rollout)
      .map((x) => x.token_in);
    expect(how.slice(0, 5)).toEqual(['rendered:first_call', 'spliced', 'spliced', 'rendered:edited_history', 'spliced']);
    expect(tokenIn.trajectories().filter((x) => x.rollout_id === rollout)).toHaveLength(2);
  }, 60_000);

  it('an upstream failure on the token-in path sends the call through as chat: the agent is answered, the record says why', async () => {
    const rollout = 'ti-fallback';
    const client = new OpenAI({ baseURL: `${tokenIn.origin}/rollout/${rollout}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const ask = (content: string) => client.chat.completions.create({ model: 'Qwen/Qwen3-8B', messages: [{ role: 'user', content }], tools: TOOLS });
    server.failNext('/v1/completions', 500);
    const a = await ask('Compute 1+1.');
    expect(a.choices[0].message.tool_calls?.[0]).toMatchObject({ function: { name: 'calculator', arguments: '{"expression": "1+1"}' } });
    server.failNext('/tokenize', 404);
    const b = await ask('Compute 2+2.');
    expect(b.choices[0].finish_reason).toBe('tool_calls');
    // A field token-in cannot carry over goes through as chat too.
    const c = await client.chat.completions.create({
      model: 'Qwen/Qwen3-8B',
      messages: [{ role: 'user', content: 'Compute 3+3.' }],
      tools: TOOLS,
      response_format: { type: 'text' },
    });
    expect(c.choices[0].message.tool_calls).toHaveLength(1);
    await postReward(tokenIn.origin, rollout, 0);
    await episodeOf(tokenIn, rollout);
    const calls = tokenIn.transitions().filter((x) => x.rollout_id === rollout);
    expect(calls.map((x) => x.token_in)).toEqual([
      'fallback:completions_status_500',
      'fallback:tokenize_status_404',
      'fallback:unsupported_field:response_format',
    ]);
    // Gone through as chat: the chat call's own ids were captured.
    for (const x of calls) {
      expect(x.translation).toBeNull();
      expect(x.response_token_ids?.length).toBeGreaterThan(0);
    }
    const metrics = await (await fetch(`${tokenIn.telemetryOrigin}/metrics`)).text();
    expect(metrics).toMatch(/lightning_sidecar_token_in_calls_total\{result="fallback",reason="completions_status_500"\} 1/);
    expect(metrics).toMatch(/lightning_sidecar_token_in_calls_total\{result="spliced",reason="continued"\} [1-9]/);
  }, 60_000);

  it('a completions call left unanswered is a 504 to the agent, not sent again as chat', async () => {
    // Room for /tokenize and the route probe on a loaded CI machine (at 300 ms a slow /tokenize fell
    // back to chat, which the assertion below caught as a different route): only the hang times out.
    const quick = await startSidecar(server.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', upstream_timeout_ms: 2000, token_in: { enabled: true } } },
    });
    try {
      const before = server.requests.length;
      server.failNext('/v1/completions', 'hang');
      const res = await fetch(`${quick.origin}/rollout/ti-hang/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'Qwen/Qwen3-8B', messages: [{ role: 'user', content: 'Compute 1+1.' }], tools: TOOLS }),
      });
      expect(res.status).toBe(504);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('upstream_timeout');
      // The route is asked for once (this stand-in has none), then the call goes over completions.
      expect(server.requests.slice(before).map((r) => r.path)).toEqual(['/tokenize', '/inference/v1/generate', '/v1/completions']);
    } finally {
      await quick.stop();
    }
  }, 30_000);

  it('an unknown parser name is a configuration error naming the setting and the parsers known', () => {
    expect(() => loadConfig({ env: { LIGHTNING_TOKEN_IN: 'true', LIGHTNING_TOOL_CALL_PARSER: 'mistral' } })).toThrow(
      /^receivers\.llm_proxy\.token_in\.tool_call_parser \(from LIGHTNING_TOOL_CALL_PARSER\): .*"hermes".*"qwen3_coder".*"openai"/,
    );
    expect(() => loadConfig({ env: { LIGHTNING_REASONING_PARSER: 'granite' } })).toThrow(
      /^receivers\.llm_proxy\.token_in\.reasoning_parser \(from LIGHTNING_REASONING_PARSER\): .*"qwen3".*"deepseek_r1".*"openai_gptoss"/,
    );
  });
});
