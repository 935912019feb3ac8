import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import type { Trajectory } from '../../src/model/records';
import { sglangStandInMask, startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { rewardedTrajectories as trajectoriesOf, startSidecar, type TestSidecar } from '../support/sidecar';

// Sampling masks through the sidecar: an SGLang stand-in with mask support answers non-streamed
// chat calls that ask (`return_sampling_mask` with `return_meta_info`) with one kept-id list per
// output token; an agent on the real `openai` SDK runs a tool loop; every trajectory's mask rows
// must be what the server returned for the token at that position, and every sampled id must lie in
// its row. Where masks were asked for and did not come (a stream, a server without support, vLLM's
// chat route), the trajectory says so (flag, metric, log line), never a silent record.

const KEEP = 4;
const TOOLS = [{ type: 'function' as const, function: { name: 'calculator', parameters: { type: 'object', properties: { expression: { type: 'string' } } } } }];

/** A tool call, then the answer; returns what the agent got for each call (the raw answers). */
async function toolLoop(sidecar: TestSidecar, rollout: string, stream = false): Promise<Record<string, unknown>[]> {
  const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rollout}/v1`, apiKey: 'sk-test', maxRetries: 0 });
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is 2+2?' }];
  const answers: Record<string, unknown>[] = [];
  let call: OpenAI.ChatCompletionMessageToolCall;
  if (stream) {
    let id = '';
    let args = '';
    for await (const chunk of await client.chat.completions.create({ model: 'fake-model', messages, tools: TOOLS, stream: true }))
      for (const t of chunk.choices[0]?.delta.tool_calls ?? []) {
        id ||= t.id ?? '';
        args += t.function?.arguments ?? '';
      }
    call = { id, type: 'function', function: { name: 'calculator', arguments: args } };
  } else {
    const a = (await (await client.chat.completions.create({ model: 'fake-model', messages, tools: TOOLS }).asResponse()).json()) as {
      choices: { message: OpenAI.ChatCompletionMessage }[];
    };
    answers.push(a);
    call = a.choices[0].message.tool_calls![0];
  }
  messages.push({ role: 'assistant', content: null, tool_calls: [call] }, { role: 'tool', tool_call_id: call.id, content: '4' });
  answers.push((await (await client.chat.completions.create({ model: 'fake-model', messages, tools: TOOLS }).asResponse()).json()) as Record<string, unknown>);
  return answers;
}

/** Row `p` of a trajectory's mask. */
function row(t: Trajectory, p: number): number[] {
  const m = t.sampling_mask!;
  return m.ids.slice(m.offsets[p], m.offsets[p + 1]);
}

function logLines(s: TestSidecar): Record<string, unknown>[] {
  return s.logs.map((l) => JSON.parse(l) as Record<string, unknown>);
}

async function metric(s: TestSidecar, name: string): Promise<string[]> {
  const text = await (await fetch(`${s.telemetryOrigin}/metrics`)).text();
  return text.split('\n').filter((l) => l.startsWith(name));
}

describe('sampling masks from SGLang (asked for on non-streamed chat, recorded per position)', () => {
  let server: FakeModelServer;
  let bare: FakeModelServer;
  const sidecars: TestSidecar[] = [];
  beforeAll(async () => {
    [server, bare] = await Promise.all([startFakeModelServer({ flavor: 'sglang', sglangMasks: { keep: KEEP } }), startFakeModelServer({ flavor: 'sglang' })]);
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await Promise.all([server?.close(), bare?.close()]);
  });
  const sidecarFor = async (upstream: FakeModelServer, sampling: Record<string, unknown>): Promise<TestSidecar> => {
    const s = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'sglang' } }, processors: { sampling } });
    sidecars.push(s);
    return s;
  };

  it('every row is what the server returned for the token at that position; the agent gets what it would without the sidecar', async () => {
    const sidecar = await sidecarFor(server, { masks: true, logprobs_mode: 'processed_logprobs' });
    const before = server.requests.length;
    const answers = await toolLoop(sidecar, 'sm-sglang');
    const asked = server.requests.slice(before);
    expect(asked.map((r) => [r.json?.return_meta_info, r.json?.return_sampling_mask])).toEqual([
      [true, true],
      [true, true],
    ]);
    // The agent did not ask for meta_info: it gets null there, and the rest of the answer as the server wrote it.
    const served = server.responses.slice(before).map((b) => JSON.parse(b.toString()) as { choices: Record<string, unknown>[] });
    answers.forEach((a, i) => {
      const choices = (a as { choices: Record<string, unknown>[] }).choices;
      expect(choices[0].meta_info).toBeNull();
      expect(choices[0].message).toEqual(served[i].choices[0].message);
      expect(choices[0].finish_reason).toEqual(served[i].choices[0].finish_reason);
    });
    const [t, ...more] = await trajectoriesOf(sidecar, 'sm-sglang');
    // The record says what the agent received.
    const recorded = sidecar.transitions().filter((x) => x.rollout_id === 'sm-sglang');
    expect(recorded.map((x) => [x.finish_reason, x.tool_calls.map((c) => c.id)])).toEqual(
      answers.map((a) => {
        const c = (a as { choices: { finish_reason: string; message: { tool_calls?: { id: string }[] } }[] }).choices[0];
        return [c.finish_reason, (c.message.tool_calls ?? []).map((tc) => tc.id)];
      }),
    );
    expect(more).toEqual([]);
    expect(t.sampling_mask_complete).toBe(true);
    expect(t.sampling_mask_coverage).toBe(1);
    expect(t.sampling_mask_violations).toBe(0);
    expect(t.logprobs_mode).toBe('processed_logprobs');
    expect(t.sampling_mask!.offsets).toHaveLength(t.token_ids.length + 1);
    expect(t.sampling_mask!.missing).toEqual([]);
    // Each turn's rows are the server's rows for that answer's tokens, in order; the other positions have none.
    const served0 = served.map((b) => b.choices[0].meta_info as { output_token_sampling_mask: number[][] });
    expect(t.turns).toHaveLength(2);
    t.turns.forEach((turn, i) => {
      for (let p = turn.response_start; p < turn.response_end; p++) {
        expect(row(t, p)).toEqual(served0[i].output_token_sampling_mask[p - turn.response_start]);
        expect(row(t, p)).toEqual(sglangStandInMask(t.token_ids[p], p - turn.response_start, KEEP));
        expect(row(t, p)).toContain(t.token_ids[p]);
      }
    });
    for (let p = 0; p < t.token_ids.length; p++) if (t.loss_mask[p] === 0) expect(row(t, p)).toEqual([]);
    expect(await metric(sidecar, 'lightning_sidecar_trajectory_sampling_mask_total')).toEqual([
      'lightning_sidecar_trajectory_sampling_mask_total{complete="true"} 1',
    ]);
  }, 30_000);

  it('a streamed call is not asked (SGLang refuses meta_info on streams); it has no prompt ids from SGLang either, so it is left out, not masked', async () => {
    const sidecar = await sidecarFor(server, { masks: true });
    const before = server.requests.length;
    await toolLoop(sidecar, 'sm-stream', true);
    const asked = server.requests.slice(before);
    expect(asked.map((r) => r.json?.stream === true)).toEqual([true, false]);
    expect('return_meta_info' in asked[0].json!).toBe(false);
    expect('return_sampling_mask' in asked[0].json!).toBe(false);
    expect(asked[1].json?.return_sampling_mask).toBe(true);
    const [t, ...more] = await trajectoriesOf(sidecar, 'sm-stream');
    expect(more).toEqual([]);
    expect(sidecar.episodes().find((e) => e.rollout_id === 'sm-stream')?.unmerged_calls).toEqual([{ transition_id: 'sm-stream/0/0', reason: 'no_token_ids' }]);
    expect(t.turns.map((x) => x.seq)).toEqual([1]);
    expect(t.sampling_mask_complete).toBe(true);
  }, 30_000);

  it('a sampled id outside its kept set is counted as a violation, and the trajectory is not complete', async () => {
    const faulty = await startFakeModelServer({ flavor: 'sglang', sglangMasks: { keep: KEEP, dropSampledFrom: 1 } });
    try {
      const sidecar = await sidecarFor(faulty, { masks: true });
      await toolLoop(sidecar, 'sm-violation');
      const [t] = await trajectoriesOf(sidecar, 'sm-violation');
      const second = t.turns[1];
      expect(t.sampling_mask_violations).toBe(second.response_end - second.response_start);
      expect(t.sampling_mask_complete).toBe(false);
      expect(t.sampling_mask_coverage).toBe(1);
      expect(await metric(sidecar, 'lightning_sidecar_sampling_mask_violations_total')).toEqual([
        `lightning_sidecar_sampling_mask_violations_total ${second.response_end - second.response_start}`,
      ]);
    } finally {
      await faulty.close();
    }
  }, 30_000);

  it('a server without mask support: every call flagged, with the reason, never a record that looks complete', async () => {
    const sidecar = await sidecarFor(bare, { masks: true });
    await toolLoop(sidecar, 'sm-unsupported');
    const [t] = await trajectoriesOf(sidecar, 'sm-unsupported');
    expect(t.sampling_mask_complete).toBe(false);
    expect(t.sampling_mask_coverage).toBe(0);
    expect(t.sampling_mask!.ids).toEqual([]);
    expect(t.sampling_mask!.missing).toEqual(t.turns.map((x) => [x.response_start, x.response_end]));
    expect(logLines(sidecar).some((l) => String(l.msg).includes('sampling masks are incomplete'))).toBe(true);
  }, 30_000);

  it('an Anthropic Messages agent (sent as chat completions) is asked as a chat call; its trajectory has every row', async () => {
    const sidecar = await sidecarFor(server, { masks: true });
    const before = server.requests.length;
    const client = new Anthropic({ baseURL: `${sidecar.origin}/rollout/sm-anthropic`, apiKey: 'sk-ant-test', maxRetries: 0 });
    const answer = await client.messages.create({ model: 'fake-model', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] });
    expect(answer.content.length).toBeGreaterThan(0);
    const asked = server.requests.slice(before);
    expect(asked.map((r) => [r.path, r.json?.return_meta_info, r.json?.return_sampling_mask])).toEqual([['/v1/chat/completions', true, true]]);
    const [t] = await trajectoriesOf(sidecar, 'sm-anthropic');
    expect(t.sampling_mask_complete).toBe(true);
    const turn = t.turns[0];
    for (let p = turn.response_start; p < turn.response_end; p++) expect(row(t, p)).toEqual(sglangStandInMask(t.token_ids[p], p - turn.response_start, KEEP));
  }, 30_000);

  it('settings off: nothing asked for, no mask keys on any record', async () => {
    const sidecar = await sidecarFor(server, {});
    const before = server.requests.length;
    await toolLoop(sidecar, 'sm-off');
    for (const r of server.requests.slice(before)) {
      expect('return_sampling_mask' in r.json!).toBe(false);
      expect('return_meta_info' in r.json!).toBe(false);
    }
    for (const t of await trajectoriesOf(sidecar, 'sm-off'))
      for (const k of ['sampling_mask', 'sampling_mask_coverage', 'sampling_mask_complete', 'sampling_mask_violations', 'logprobs_mode'])
        expect(k in t).toBe(false);
  }, 30_000);
});

describe('truncated sampling or masks the server cannot give: said at start and in /readyz', () => {
  let vllm: FakeModelServer;
  const sidecars: TestSidecar[] = [];
  beforeAll(async () => {
    vllm = await startFakeModelServer({ strict: true });
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await vllm?.close();
  });

  async function readyz(s: TestSidecar): Promise<{ status: string; degraded: Record<string, string> }> {
    return (await (await fetch(`${s.telemetryOrigin}/readyz`)).json()) as { status: string; degraded: Record<string, string> };
  }

  it('top_p pinned below 1 without masks: /readyz names the gap; with masks on SGLang it is gone', async () => {
    const s = await startSidecar(vllm.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      processors: { sampling: { pin: { top_p: { value: 0.8 } } } },
    });
    sidecars.push(s);
    const body = await readyz(s);
    // Reported, not a reason to take the sidecar out of service.
    expect(body.status).toBe('ready');
    expect(body.degraded.sampling_masks).toMatch(/^sampling is truncated \(processors.sampling.pin top_p 0.8\) but processors.sampling.masks is off/);
    const ok = await startSidecar(vllm.url, {
      receivers: { llm_proxy: { upstream_flavor: 'sglang' } },
      processors: { sampling: { masks: true, pin: { top_p: { value: 0.8 } } } },
    });
    sidecars.push(ok);
    expect((await readyz(ok)).degraded).not.toHaveProperty('sampling_masks');
  }, 30_000);

  it('masks asked of vLLM (its chat route gives none): /readyz says where vLLM gives them; its trajectories are flagged', async () => {
    const s = await startSidecar(vllm.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } }, processors: { sampling: { masks: true } } });
    sidecars.push(s);
    expect((await readyz(s)).degraded.sampling_masks).toContain('/inference/v1/generate');
    const before = vllm.requests.length;
    const client = new OpenAI({ baseURL: `${s.origin}/rollout/sm-vllm/v1`, apiKey: 'sk-test', maxRetries: 0 });
    await client.chat.completions.create({ model: 'fake-model', messages: [{ role: 'user', content: 'hi' }] });
    // vLLM refuses fields it does not know: none is added for masks.
    expect(Object.keys(vllm.requests[before].json!).filter((k) => k.includes('mask') || k === 'return_meta_info')).toEqual([]);
    const [t] = await trajectoriesOf(s, 'sm-vllm');
    expect(t.sampling_mask_complete).toBe(false);
    expect(t.sampling_mask_coverage).toBe(0);
  }, 30_000);
});
