import OpenAI from 'openai';
import { loadConfig } from '../../src/config/load';
import { CALCULATOR_TOOLS, startQwen3Server, type Qwen3Server } from '../support/qwen3-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

// Sampling provenance: with processors.sampling.record, each transition and trajectory turn says
// which sampling parameters the model server was asked for (the agent's, and what the sidecar
// added itself: token-in's max_tokens), null where the request left one to the server. Without
// the setting the records have no such key.

describe('sampling parameters recorded per call', () => {
  let server: Qwen3Server;
  let recording: TestSidecar;
  let tokenIn: TestSidecar;
  let off: TestSidecar;
  let defaults: TestSidecar;
  beforeAll(async () => {
    server = await startQwen3Server();
    const settings = (record: boolean, tokenInOn: boolean) => ({
      receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: tokenInOn } } },
      processors: { sampling: { record } },
    });
    [recording, tokenIn, off, defaults] = await Promise.all([
      startSidecar(server.url, settings(true, false)),
      startSidecar(server.url, settings(true, true)),
      startSidecar(server.url, settings(false, false)),
      startSidecar(server.url, {
        receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
        processors: { sampling: { record: true, server_defaults: { temperature: 0.6, top_k: 20, top_p: 0.95 } } },
      }),
    ]);
  }, 30_000);
  afterAll(async () => {
    await Promise.all([recording?.stop(), tokenIn?.stop(), off?.stop(), defaults?.stop()]);
    await server?.close();
  });

  /** Two calls of one rollout (a tool call, then the answer): the first with the agent's sampling, the second without. */
  async function rollout(sidecar: TestSidecar, id: string, stream: boolean) {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${id}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'Compute 6*7.' }];
    const body = { model: 'Qwen/Qwen3-8B', tools: CALCULATOR_TOOLS, temperature: 0.7, top_p: 0.95, seed: 7, max_completion_tokens: 256 };
    let toolCall: OpenAI.ChatCompletionMessageToolCall;
    if (stream) {
      let id = '';
      let args = '';
      for await (const chunk of await client.chat.completions.create({ ...body, messages, stream: true }))
        for (const t of chunk.choices[0]?.delta.tool_calls ?? []) {
          id ||= t.id ?? '';
          args += t.function?.arguments ?? '';
        }
      toolCall = { id, type: 'function', function: { name: 'calculator', arguments: args } };
    } else toolCall = (await client.chat.completions.create({ ...body, messages })).choices[0].message.tool_calls![0];
    messages.push({ role: 'assistant', content: null, tool_calls: [toolCall] }, { role: 'tool', tool_call_id: toolCall.id, content: '42' });
    await client.chat.completions.create({ model: 'Qwen/Qwen3-8B', tools: CALCULATOR_TOOLS, messages });
    expect((await postReward(sidecar.origin, id, 1)).status).toBe(202);
    const deadline = Date.now() + 20_000;
    while (!sidecar.episodes().some((e) => e.rollout_id === id)) {
      if (Date.now() > deadline) throw new Error(`no episode for ${id}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    return {
      transitions: sidecar
        .transitions()
        .filter((t) => t.rollout_id === id)
        .sort((a, b) => a.seq - b.seq),
      trajectories: sidecar.trajectories().filter((t) => t.rollout_id === id),
    };
  }

  const AGENTS = {
    temperature: 0.7,
    top_p: 0.95,
    top_k: null,
    min_p: null,
    seed: 7,
    presence_penalty: null,
    frequency_penalty: null,
    repetition_penalty: null,
    max_tokens: 256,
  };
  const NONE = {
    temperature: null,
    top_p: null,
    top_k: null,
    min_p: null,
    seed: null,
    presence_penalty: null,
    frequency_penalty: null,
    repetition_penalty: null,
    max_tokens: null,
  };

  it.each([false, true])(
    'chat (streamed: %s): the agent’s parameters on its call, nulls on the call that sent none; the trajectory turns say the same',
    async (stream) => {
      const { transitions, trajectories } = await rollout(recording, `sp-chat-${stream}`, stream);
      expect(transitions.map((t) => t.sampling)).toEqual([AGENTS, NONE]);
      // The last key, after upstream_replica.
      expect(Object.keys(transitions[0]).slice(-2)).toEqual(['upstream_replica', 'sampling']);
      const turns = trajectories.flatMap((t) => t.turns);
      expect(turns.map((u) => u.sampling)).toEqual(transitions.map((t) => t.sampling));
    },
    30_000,
  );

  it('token-in: what the completions request had, the max_tokens the sidecar set for a call without one included', async () => {
    const { transitions } = await rollout(tokenIn, 'sp-token-in', false);
    expect(transitions.map((t) => t.token_in)).toEqual(['rendered:first_call', 'spliced']);
    expect(transitions[0].sampling).toEqual(AGENTS);
    // The agent set none: token-in asks for the rest of the context (docs/token-in.md).
    const sent = server.requests.filter((r) => r.path === '/v1/completions').at(-1)!.json;
    expect(transitions[1].sampling).toEqual({ ...NONE, max_tokens: sent.max_tokens });
    expect(typeof sent.max_tokens).toBe('number');
  }, 30_000);

  it("the server's defaults where a request left a parameter out, each listed; the agent's own values stay", async () => {
    const { transitions, trajectories } = await rollout(defaults, 'sp-defaults', false);
    expect(transitions.map((t) => t.sampling)).toEqual([
      { ...AGENTS, top_k: 20, server_defaults: ['top_k'] },
      { ...NONE, temperature: 0.6, top_p: 0.95, top_k: 20, server_defaults: ['temperature', 'top_p', 'top_k'] },
    ]);
    expect(trajectories.flatMap((t) => t.turns).map((u) => u.sampling)).toEqual(transitions.map((t) => t.sampling));
  }, 30_000);

  it('without the setting, no record has the key', async () => {
    const { transitions, trajectories } = await rollout(off, 'sp-off', false);
    expect(transitions.length).toBe(2);
    for (const t of transitions) expect('sampling' in t).toBe(false);
    for (const u of trajectories.flatMap((t) => t.turns)) expect('sampling' in u).toBe(false);
  }, 30_000);
});

describe('pinned sampling parameters (processors.sampling.pin)', () => {
  let server: Qwen3Server;
  const sidecars: TestSidecar[] = [];
  const PIN = { temperature: { value: 1, mode: 'force' }, top_p: { value: 1, mode: 'refuse' } };
  beforeAll(async () => {
    server = await startQwen3Server();
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await server?.close();
  });
  const sidecarWith = async (tokenInOn: boolean): Promise<TestSidecar> => {
    const s = await startSidecar(server.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: tokenInOn } } },
      processors: { sampling: { record: true, pin: PIN } },
    });
    sidecars.push(s);
    return s;
  };
  const ask = (sidecar: TestSidecar, rollout: string, extra: Record<string, unknown>) =>
    fetch(`${sidecar.origin}/rollout/${rollout}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'Qwen/Qwen3-8B', messages: [{ role: 'user', content: 'Compute 6*7.' }], tools: CALCULATOR_TOOLS, ...extra }),
    });

  it.each([false, true])(
    'token-in %s: force overrides the agent’s value, a left-out one is set, refuse answers 400 naming the setting; all counted',
    async (tokenInOn) => {
      const sidecar = await sidecarWith(tokenInOn);
      const rollout = `pin-${tokenInOn}`;
      const before = server.requests.length;
      const ok = await ask(sidecar, rollout, { temperature: 0.7, seed: 3 });
      expect(ok.status).toBe(200);
      const sent = server.requests.slice(before).find((r) => r.path === (tokenInOn ? '/v1/completions' : '/v1/chat/completions'))!.json;
      expect([sent.temperature, sent.top_p, sent.seed]).toEqual([1, 1, 3]);
      const refused = await ask(sidecar, rollout, { top_p: 0.9 });
      expect(refused.status).toBe(400);
      const err = ((await refused.json()) as { error: { code: string; param: string; message: string } }).error;
      expect(err).toMatchObject({ code: 'sampling_pinned', param: 'top_p' });
      expect(err.message).toContain('processors.sampling.pin.top_p');
      // The refused call never reached the model server (token-in: /tokenize, the one look for vLLM's generate route, completions).
      expect(server.requests.length - before).toBe(tokenInOn ? 3 : 1);
      expect((await postReward(sidecar.origin, rollout, 1)).status).toBe(202);
      await sidecar.waitForEpisodes(1, 10_000);
      const [first, second] = sidecar.transitions().sort((a, b) => a.seq - b.seq);
      expect(first.sampling).toMatchObject({ temperature: 1, top_p: 1, seed: 3 });
      expect(second).toMatchObject({ status: 'error', http_status: 400 });
      const metrics = await sidecar.app.metrics.registry.metrics();
      expect(metrics).toMatch(/lightning_sidecar_sampling_pinned_total\{param="temperature",action="overridden"\} 1/);
      expect(metrics).toMatch(/lightning_sidecar_sampling_pinned_total\{param="top_p",action="set"\} 1/);
      expect(metrics).toMatch(/lightning_sidecar_sampling_pinned_total\{param="top_p",action="refused"\} 1/);
    },
    30_000,
  );

  it('a pin that is not a parameter, or not a number, is a configuration error naming it', () => {
    expect(() => loadConfig({ env: {}, overrides: { processors: { sampling: { pin: { temprature: { value: 1 } } } } } })).toThrow(/processors\.sampling\.pin/);
    expect(() => loadConfig({ env: {}, overrides: { processors: { sampling: { pin: { temperature: { value: 'hot' } } } } } })).toThrow(
      /processors\.sampling\.pin\.temperature\.value/,
    );
  });
});
