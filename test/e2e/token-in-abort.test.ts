import OpenAI from 'openai';
import { runCalculatorAgent } from '../support/calculator-agent';
import { decode, startQwen3Server, type AbortStandIn, type Qwen3Server } from '../support/qwen3-server';
import { metricSample, rewardedTrajectories, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Calls the engine aborts mid-answer, as a weight update does (vLLM's pause in abort mode, SGLang's
 * pause_generation): under token-in the sidecar sends the call again with the ids sampled so far,
 * and the agent (the real `openai` SDK, in a tool loop) must receive what it receives from a server
 * that never aborts: the same reasoning, content and tool calls, streamed or not, with no text
 * repeated or missing. The trajectory must hold the same ids and logprobs as that run, one segment,
 * with the weights' version changing at the tokens where the aborts happened. Past the limit the
 * abort reaches the agent as the engine ended it; outside token-in an abort is recorded as it came.
 */

const QUERIES = ['Compute 3*4 and 7+8.', 'Now compute 10-2.'];
type Route = 'completions' | 'generate' | 'sglang';

function standIn(route: Route, abort?: AbortStandIn): Promise<Qwen3Server> {
  if (route === 'sglang') return startQwen3Server({ sglang: {}, abort });
  if (route === 'generate') return startQwen3Server({ generate: {}, abort });
  return startQwen3Server({ abort });
}

const SAMPLING_PATH: Record<Route, string> = { completions: '/v1/completions', generate: '/inference/v1/generate', sglang: '/generate' };

/** The calls that sampled: on the route's path, but the generate route's one-token probe. */
function sampled(server: Qwen3Server, route: Route): Qwen3Server['requests'] {
  return server.requests.filter((r) => r.path === SAMPLING_PATH[route] && !(Array.isArray(r.json.token_ids) && r.json.token_ids.length === 1));
}

function promptOf(route: Route, json: Record<string, unknown>): number[] {
  return (route === 'completions' ? json.prompt : route === 'generate' ? json.token_ids : json.input_ids) as number[];
}

const metric = metricSample;

describe('token-in: calls the engine aborts are resumed', () => {
  const servers: Qwen3Server[] = [];
  const sidecars: TestSidecar[] = [];
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await Promise.all(servers.map((s) => s.close()));
  });
  const sidecarFor = async (server: Qwen3Server, tokenIn: Record<string, unknown> = {}): Promise<TestSidecar> => {
    servers.push(server);
    const s = await startSidecar(server.url, {
      receivers: { llm_proxy: { upstream_flavor: 'auto', token_in: { enabled: true, ...tokenIn } } },
    });
    sidecars.push(s);
    return s;
  };

  it.each([
    ['completions', false],
    ['completions', true],
    ['generate', false],
    ['generate', true],
    ['sglang', false],
    ['sglang', true],
  ] as const)('%s route (streamed: %s): one answer to the agent, the ids of a run without aborts, the versions where they changed', async (route, stream) => {
    // Call 1 is aborted twice (after 5 ids, then 20 more), call 2 once (after 12); the rest are whole.
    const abort: AbortStandIn = { after: [5, 20, null, 12, null], aborted: [] };
    const [aborting, steady] = await Promise.all([standIn(route, abort), standIn(route)]);
    const [a, b] = await Promise.all([sidecarFor(aborting), sidecarFor(steady)]);
    const rollout = `abort-${route}-${stream}`;
    const received = await runCalculatorAgent(a, rollout, { stream, queries: QUERIES });
    const reference = await runCalculatorAgent(b, `ref-${rollout}`, { stream, queries: QUERIES });
    expect(received).toEqual(reference);
    expect(received.map((r) => r.finish)).toEqual(['tool_calls', 'tool_calls', 'stop', 'tool_calls', 'stop']);
    expect(abort.aborted.map((x) => [x.sampled.length, x.version])).toEqual([
      [5, 'w0'],
      [20, 'w1'],
      [12, 'w2'],
    ]);

    // The server was sent each aborted call again: its prompt followed by every id sampled so far.
    const sampling = sampled(aborting, route);
    expect(sampling.length).toBe(5 + 3);
    const [first, second, third] = sampling.slice(0, 3).map((r) => promptOf(route, r.json));
    expect(second).toEqual([...first, ...abort.aborted[0].sampled]);
    expect(third).toEqual([...first, ...abort.aborted[0].sampled, ...abort.aborted[1].sampled]);

    const [t] = await rewardedTrajectories(a, rollout);
    const [ref] = await rewardedTrajectories(b, `ref-${rollout}`);
    expect(a.trajectories().filter((x) => x.rollout_id === rollout)).toHaveLength(1);
    expect(t.token_ids).toEqual(ref.token_ids);
    expect(t.logprobs).toEqual(ref.logprobs);
    expect(t.loss_mask).toEqual(ref.loss_mask);
    expect(t.turns.map((u) => [u.response_start, u.response_end, u.finish_reason])).toEqual(
      ref.turns.map((u) => [u.response_start, u.response_end, u.finish_reason]),
    );
    // Each turn's ids are what the agent's answer was parsed from: the first call's whole sample.
    expect(t.token_ids.slice(t.turns[0].response_start, t.turns[0].response_start + 25)).toEqual([...abort.aborted[0].sampled, ...abort.aborted[1].sampled]);

    const transitions = a.transitions().filter((x) => x.rollout_id === rollout);
    expect(transitions.map((x) => x.translation?.notes?.filter((n) => n.startsWith('resume')) ?? [])).toEqual([['resumed:2'], ['resumed:1'], [], [], []]);
    expect(transitions.map((x) => [x.finish_reason, x.tool_calls.map((c) => c.name)])).toEqual(received.map((r) => [r.finish, r.calls.map((c) => c.name)]));
    expect(transitions[0].usage).toMatchObject({ prompt_tokens: first.length, completion_tokens: t.turns[0].response_end - t.turns[0].response_start });
    expect(await metric(a, 'lightning_sidecar_token_in_resumes_total{result="resumed"}')).toBe(3);

    if (route === 'completions') {
      // vLLM's completions route says nothing of weight versions.
      expect(t.weight_versions).toBeUndefined();
      return;
    }
    const [u0, u1] = t.turns;
    const s0 = u0.response_start;
    const s1 = u1.response_start;
    const expected = [
      { version: 'w0', start: s0, end: s0 + 5 },
      { version: 'w1', start: s0 + 5, end: s0 + 25 },
      { version: 'w2', start: s0 + 25, end: u0.response_end },
      { version: 'w2', start: s1, end: s1 + 12 },
      { version: 'w3', start: s1 + 12, end: u1.response_end },
      ...t.turns.slice(2).map((u) => ({ version: 'w3', start: u.response_start, end: u.response_end })),
    ];
    expect(t.weight_versions).toEqual(expected);
  });

  it('past token_in.max_resumes the abort reaches the agent as the engine ended it, recorded and counted', async () => {
    const abort: AbortStandIn = { after: [5, 7], aborted: [] };
    const server = await standIn('generate', abort);
    const sidecar = await sidecarFor(server, { max_resumes: 1 });
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/limit/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const answer = await client.chat.completions.create({
      model: 'Qwen/Qwen3-8B',
      max_tokens: 300,
      messages: [{ role: 'user', content: 'Compute 3*4.' }],
    });
    expect(answer.choices[0].finish_reason).toBe('abort');
    const sampling = sampled(server, 'generate');
    expect(sampling).toHaveLength(2);
    // The resumed attempt asks for what is left of the agent's budget.
    expect((sampling[1].json.sampling_params as { max_tokens: number }).max_tokens).toBe(300 - 5);
    expect(answer.usage?.completion_tokens).toBe(12);

    const [t] = await rewardedTrajectories(sidecar, 'limit');
    const [x] = sidecar.transitions().filter((r) => r.rollout_id === 'limit');
    expect(x.finish_reason).toBe('abort');
    expect(x.response_token_ids).toEqual([...abort.aborted[0].sampled, ...abort.aborted[1].sampled]);
    expect(x.translation?.notes).toEqual(expect.arrayContaining(['resume_limit:1', 'resumed:1']));
    expect(t.turns[0].finish_reason).toBe('abort');
    expect(t.weight_versions).toEqual([
      { version: 'w0', start: t.prompt_length, end: t.prompt_length + 5 },
      { version: 'w1', start: t.prompt_length + 5, end: t.prompt_length + 12 },
    ]);
    // What the agent read is the text of those ids (the reasoning parser holds the unfinished thinking).
    const text = (answer.choices[0].message as { reasoning_content?: string }).reasoning_content ?? '';
    expect(`<think>${text}`).toBe(decode(x.response_token_ids!, true));
    expect(text.length).toBeGreaterThan(10);
    expect(await metric(sidecar, 'lightning_sidecar_token_in_resumes_total{result="resumed"}')).toBe(1);
    expect(await metric(sidecar, 'lightning_sidecar_token_in_resumes_total{result="limit"}')).toBe(1);
  });

  it('with max_resumes 0 nothing is sent again', async () => {
    const abort: AbortStandIn = { after: [6], aborted: [] };
    const server = await standIn('sglang', abort);
    const sidecar = await sidecarFor(server, { max_resumes: 0 });
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/never/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'Qwen/Qwen3-8B', messages: [{ role: 'user', content: 'Compute 3*4.' }] });
    expect(answer.choices[0].finish_reason).toBe('abort');
    expect(server.requests.filter((r) => r.path === '/generate')).toHaveLength(1);
    await rewardedTrajectories(sidecar, 'never');
    const [x] = sidecar.transitions().filter((r) => r.rollout_id === 'never');
    expect(x.response_token_ids).toEqual(abort.aborted[0].sampled);
    expect(x.translation?.notes).toEqual(['resume_limit:0']);
    expect(await metric(sidecar, 'lightning_sidecar_token_in_resumes_total{result="limit"}')).toBe(1);
  });

  it('outside token-in an abort is recorded as it came, and not sent again', async () => {
    const abort: AbortStandIn = { after: [4], aborted: [] };
    const server = await startQwen3Server({ abort });
    servers.push(server);
    const sidecar = await startSidecar(server.url, { receivers: { llm_proxy: { upstream_flavor: 'auto' } } });
    sidecars.push(sidecar);
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/plain/v1`, apiKey: 'sk-test', maxRetries: 0 });
    const prompt = [151644, 872, 198, 46254, 220, 18, 9, 19, 13, 151645, 198, 151644, 77091, 198];
    const answer = await client.completions.create({ model: 'Qwen/Qwen3-8B', prompt: prompt as never, max_tokens: 200 });
    expect(answer.choices[0].finish_reason).toBe('abort');
    expect(server.requests.filter((r) => r.path === '/v1/completions')).toHaveLength(1);
    await rewardedTrajectories(sidecar, 'plain');
    const [x] = sidecar.transitions().filter((r) => r.rollout_id === 'plain');
    expect(x.finish_reason).toBe('abort');
    expect(x.response_token_ids).toEqual(abort.aborted[0].sampled);
    expect(x.response_token_ids).toHaveLength(4);
    expect(await metric(sidecar, 'lightning_sidecar_token_in_resumes_total{result="resumed"}')).toBeNull();
  });
});
