import { existsSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import type { Trajectory } from '../../src/model/records';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Trajectory records through the whole sidecar (journaled bodies, ids as byte ranges, JSON and
 * SSE answers) with the OpenAI SDK as the agent: each row checked against what the model server
 * sent, id by id.
 */

interface Sent {
  prompt: number[];
  response: number[];
  logprobs: number[];
}

/** The ids and logprobs in a model server's answer (a JSON body or an SSE stream). */
function sentBy(body: Buffer): Sent {
  const text = body.toString('utf8');
  if (text.trimStart().startsWith('{')) {
    const x = JSON.parse(text) as { prompt_token_ids: number[]; choices: { token_ids: number[]; logprobs: { content: { logprob: number }[] } }[] };
    return { prompt: x.prompt_token_ids, response: x.choices[0].token_ids, logprobs: x.choices[0].logprobs.content.map((c) => c.logprob) };
  }
  const out: Sent = { prompt: [], response: [], logprobs: [] };
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const x = JSON.parse(line.slice(6)) as {
      prompt_token_ids?: number[];
      choices: { token_ids?: number[]; logprobs?: { content: { logprob: number }[] } | null }[];
    };
    if (x.prompt_token_ids) out.prompt = x.prompt_token_ids;
    const c = x.choices[0];
    if (c?.token_ids) out.response.push(...c.token_ids);
    if (c?.logprobs) out.logprobs.push(...c.logprobs.content.map((l) => l.logprob));
  }
  return out;
}

/** Checks a trajectory against the answers of its calls, in order. */
function expectExact(t: Trajectory, calls: Sent[]): void {
  const last = calls[calls.length - 1];
  expect(t.token_ids).toEqual([...last.prompt, ...last.response]);
  expect(t.loss_mask).toHaveLength(t.token_ids.length);
  expect(t.logprobs).toHaveLength(t.token_ids.length);
  expect(t.prompt_length).toBe(calls[0].prompt.length);
  expect(t.turns).toHaveLength(calls.length);
  const mask = new Array<number>(t.token_ids.length).fill(0);
  calls.forEach((c, i) => {
    const turn = t.turns[i];
    expect([turn.response_start, turn.response_end]).toEqual([c.prompt.length, c.prompt.length + c.response.length]);
    expect(t.token_ids.slice(turn.response_start, turn.response_end)).toEqual(c.response);
    expect(t.logprobs!.slice(turn.response_start, turn.response_end)).toEqual(c.logprobs);
    mask.fill(1, turn.response_start, turn.response_end);
  });
  expect(t.loss_mask).toEqual(mask);
  // Masked-out positions carry 0 as their logprob.
  expect(t.logprobs!.filter((_, i) => mask[i] === 0).every((x) => x === 0)).toBe(true);
}

describe('trajectories through the sidecar', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;

  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm', script: (r) => ({ content: `reply ${(r.json?.messages as unknown[]).length}` }) });
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } }, exporters: { records: 'trajectories' } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  /** One call through the SDK; returns what the model server sent for it. */
  async function ask(client: OpenAI, messages: OpenAI.Chat.ChatCompletionMessageParam[], stream: boolean): Promise<Sent> {
    const index = upstream.requests.length;
    let content = '';
    if (stream) {
      for await (const chunk of await client.chat.completions.create({ model: 'm', messages, stream: true })) content += chunk.choices[0]?.delta?.content ?? '';
    } else content = (await client.chat.completions.create({ model: 'm', messages })).choices[0].message.content ?? '';
    messages.push({ role: 'assistant', content });
    return sentBy(upstream.responses[index]);
  }

  it('gives a rollout whose calls all continue one row: the last prompt and answer, every answer masked in with its logprobs, streamed or not', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/grow/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': 'g' } });
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'system', content: 'You are a test agent.' }];
    const calls: Sent[] = [];
    for (let i = 0; i < 6; i++) {
      messages.push({ role: 'user', content: `step ${i}: ${'more context '.repeat(10 * i)}` });
      calls.push(await ask(client, messages, i % 2 === 1));
    }
    expect((await postReward(sidecar.origin, 'grow', 1)).status).toBe(202);
    const [episode] = (await sidecar.waitForEpisodes(1)).filter((e) => e.rollout_id === 'grow');
    const [t] = sidecar.trajectories().filter((x) => x.rollout_id === 'grow');
    expect(episode.trajectory_ids).toEqual(['grow/0/s0']);
    expect(episode.exported).toEqual(['trajectories']);
    expect(episode.unmerged_calls).toEqual([]);
    expectExact(t, calls);
    expect(t.token_rewards).toEqual([{ position: t.token_ids.length - 1, value: 1 }]);
    expect([t.group_id, t.segments, t.episode_status, t.final_reward]).toEqual(['g', 1, 'completed', 1]);
    // Trajectories only: no per-call rows were written.
    expect(existsSync(path.join(sidecar.dataDir, 'transitions'))).toBe(false);
  });

  it('splits a rollout whose history is rewritten into segments, each exactly its calls’ ids, and links a subagent to the call that spawned it', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/split/v1`, apiKey: 'k', maxRetries: 0 });
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: 'first question' }];
    const calls: Sent[] = [await ask(client, messages, false), await ask(client, (messages.push({ role: 'user', content: 'second' }), messages), true)];
    // The agent compacts its context: the history it sends no longer continues what was sampled.
    messages.splice(0, messages.length, { role: 'user', content: 'summary of the conversation so far' });
    calls.push(await ask(client, messages, false));
    messages.push({ role: 'user', content: 'and then?' });
    calls.push(await ask(client, messages, true));
    // A subagent, named by its own rollout and its parent's.
    const sub = new OpenAI({
      baseURL: `${sidecar.origin}/rollout/split-sub/v1`,
      apiKey: 'k',
      maxRetries: 0,
      defaultHeaders: { 'x-parent-rollout-id': 'split' },
    });
    const subCall = await ask(sub, [{ role: 'user', content: 'a subtask' }], false);
    expect((await postReward(sidecar.origin, 'split-sub', 0.5)).status).toBe(202);
    expect((await postReward(sidecar.origin, 'split', 0)).status).toBe(202);
    await sidecar.waitForEpisodes(3);
    const rows = sidecar.trajectories().filter((x) => x.rollout_id === 'split');
    expect(rows.map((t) => [t.trajectory_id, t.start_reason, t.parent_trajectory_id])).toEqual([
      ['split/0/s0', 'first', null],
      ['split/0/s1', 'diverged', 'split/0/s0'],
    ]);
    expectExact(rows[0], calls.slice(0, 2));
    expectExact(rows[1], calls.slice(2));
    const [child] = sidecar.trajectories().filter((x) => x.rollout_id === 'split-sub');
    expectExact(child, [subCall]);
    expect([child.parent_rollout_id, child.parent_attempt_id, child.parent_transition_id]).toEqual(['split', '0', 'split/0/3']);
    expect(child.token_rewards).toEqual([{ position: child.token_ids.length - 1, value: 0.5 }]);
  });
});
