import OpenAI from 'openai';
import { renderPrompt } from '../support/fake-tokenizer';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';

const messages = [{ role: 'user' as const, content: 'what is 2+2?' }];

async function closeAndRead(sidecar: TestSidecar, rollout: string, n: number) {
  expect((await postReward(sidecar.origin, rollout, 1)).status).toBe(202);
  await sidecar.waitForEpisodes(n, 10_000);
  return sidecar.transitions().filter((t) => t.rollout_id === rollout);
}

describe('the model server, found by itself', () => {
  let vllm: FakeModelServer;
  let openaiLike: FakeModelServer;
  beforeAll(async () => {
    vllm = await startFakeModelServer({ strict: true, version: '0.11.1' });
    openaiLike = await startFakeModelServer({ strict: true, flavor: 'openai' });
  });
  afterAll(async () => {
    await vllm.close();
    await openaiLike.close();
  });

  it('with no flavor configured, identifies vLLM, records exact token ids streamed and not, and gives the agent no ids it did not ask for', async () => {
    const sidecar = await startSidecar(vllm.url, { receivers: { llm_proxy: { upstream_flavor: 'auto' } } });
    try {
      expect(sidecar.app.proxy.upstream()).toMatchObject({ flavor: 'vllm', source: 'detected', serverVersion: '0.11.1' });
      const ready = (await (await fetch(`${sidecar.telemetryOrigin}/readyz`)).json()) as Record<string, unknown>;
      expect(JSON.stringify(ready)).not.toContain('no token ids are requested');
      const metrics = await (await fetch(`${sidecar.telemetryOrigin}/metrics`)).text();
      expect(metrics).toMatch(/lightning_sidecar_upstream_flavor\{flavor="vllm",source="detected",adding_fields="true"\} 1/);

      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/auto-1/v1`, apiKey: 'k', maxRetries: 0 });
      const plain = await client.chat.completions.create({ model: 'm', messages });
      const raw = plain as unknown as { prompt_token_ids?: unknown; choices: { token_ids?: unknown; logprobs?: unknown }[] };
      expect(raw.prompt_token_ids ?? null).toBeNull();
      expect(raw.choices[0].token_ids ?? null).toBeNull();
      expect(raw.choices[0].logprobs ?? null).toBeNull();
      const stream = await client.chat.completions.create({ model: 'm', messages, stream: true });
      for await (const chunk of stream) {
        const c = chunk as unknown as { prompt_token_ids?: unknown; choices: { token_ids?: unknown; logprobs?: unknown }[] };
        expect(c.prompt_token_ids ?? null).toBeNull();
        for (const ch of c.choices) expect([ch.token_ids ?? null, ch.logprobs ?? null]).toEqual([null, null]);
      }
      // Asked for by the agent itself: given as the server sent it.
      const asked = (await client.chat.completions.create({ model: 'm', messages, logprobs: true })) as unknown as {
        choices: { logprobs: { content: unknown[] } | null }[];
      };
      expect(asked.choices[0].logprobs?.content.length).toBeGreaterThan(0);

      const ts = await closeAndRead(sidecar, 'auto-1', 1);
      expect(ts).toHaveLength(3);
      for (const t of ts) {
        expect(t.prompt_token_ids).toEqual(renderPrompt(messages as never[]));
        expect(t.response_token_ids?.length).toBeGreaterThan(0);
        expect(t.response_logprobs?.length).toBe(t.response_token_ids?.length);
      }
      expect(ts[0].injected).toEqual(['return_token_ids', 'logprobs']);
      expect(ts[2].injected).toEqual(['return_token_ids']);
    } finally {
      await sidecar.stop();
    }
  });

  it('in a rollout whose requests grow, gives the agent ids and logprobs exactly when it asked, wherever in the body it asked', async () => {
    // Requests over 16 KiB: each is compared with the rollout's previous one, and only what it adds is searched for the names.
    const sidecar = await startSidecar(vllm.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    try {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/grow-1/v1`, apiKey: 'k', maxRetries: 0 });
      const history: { role: 'user' | 'assistant'; content: string }[] = [];
      // Where the agent puts `logprobs`: nowhere, after the history (new bytes), or before it (bytes the previous request had too).
      const asks = ['none', 'after', 'none', 'before', 'before', 'none', 'after', 'after'] as const;
      const got: boolean[] = [];
      for (const [turn, ask] of asks.entries()) {
        history.push({ role: 'user', content: `turn ${turn}: ${'tool output '.repeat(1800)}` });
        const body =
          ask === 'before'
            ? { logprobs: true, model: 'm', messages: history }
            : ask === 'after'
              ? { model: 'm', messages: history, logprobs: true }
              : { model: 'm', messages: history };
        const answer = (await client.chat.completions.create(body)) as unknown as {
          choices: { message: { content: string }; logprobs?: { content: unknown[] } | null }[];
        };
        got.push((answer.choices[0].logprobs?.content.length ?? 0) > 0);
        history.push({ role: 'assistant', content: answer.choices[0].message.content });
      }
      expect(got).toEqual(asks.map((a) => a !== 'none'));
      const ts = (await closeAndRead(sidecar, 'grow-1', 1)).sort((a, b) => a.seq - b.seq);
      expect(ts.map((t) => t.injected)).toEqual(asks.map((a) => (a === 'none' ? ['return_token_ids', 'logprobs'] : ['return_token_ids'])));
      for (const t of ts) expect(t.response_logprobs?.length).toBe(t.response_token_ids?.length);
    } finally {
      await sidecar.stop();
    }
  });

  it('an OpenAI-like server (no owned_by vllm, refuses unknown fields) gets the agent’s bytes unchanged', async () => {
    const sidecar = await startSidecar(openaiLike.url, { receivers: { llm_proxy: { upstream_flavor: 'auto' } } });
    try {
      expect(sidecar.app.proxy.upstream()).toMatchObject({ flavor: 'openai', source: 'detected' });
      const ready = (await (await fetch(`${sidecar.telemetryOrigin}/readyz`)).json()) as Record<string, unknown>;
      expect(JSON.stringify(ready)).toContain('detected as openai; no token ids are requested');
      const body = JSON.stringify({ model: 'm', messages, temperature: 0 });
      const res = await fetch(`${sidecar.origin}/rollout/plain-1/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      });
      expect(res.status).toBe(200);
      const last = openaiLike.requests[openaiLike.requests.length - 1];
      expect(last.body.toString()).toBe(body);
      const [t] = await closeAndRead(sidecar, 'plain-1', 1);
      expect(t).toMatchObject({ prompt_token_ids: null, injected: [] });
    } finally {
      await sidecar.stop();
    }
  });

  it('a server that refuses an added field never fails the agent: the call goes again without it, and no more fields are added', async () => {
    const sidecar = await startSidecar(openaiLike.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    try {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/refused-1/v1`, apiKey: 'k', maxRetries: 0 });
      const before = openaiLike.requests.length;
      const first = await client.chat.completions.create({ model: 'm', messages });
      expect(first.choices[0].message).toBeDefined();
      const sent = openaiLike.requests.slice(before).map((r) => r.body.toString());
      expect(sent).toHaveLength(2);
      expect(sent[0]).toContain('"return_token_ids":true');
      expect(sent[1]).not.toContain('return_token_ids');
      await client.chat.completions.create({ model: 'm', messages });
      expect(openaiLike.requests[openaiLike.requests.length - 1].body.toString()).not.toContain('return_token_ids');
      expect(await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_injection_refused_total')).toMatch(
        /field="(return_token_ids|logprobs)"} 1/,
      );
      expect(sidecar.logs.some((l) => l.includes('refused a field the sidecar adds'))).toBe(true);
      const ts = await closeAndRead(sidecar, 'refused-1', 1);
      expect(ts.map((t) => [t.status, t.injected])).toEqual([
        ['ok', []],
        ['ok', []],
      ]);
    } finally {
      await sidecar.stop();
    }
  });

  it('a translated call the server refuses over an added field is sent again without it, and the agent gets its answer', async () => {
    const sidecar = await startSidecar(openaiLike.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    try {
      const before = openaiLike.requests.length;
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/refused-2/v1`, apiKey: 'k', maxRetries: 0 });
      const r = await client.responses.create({ model: 'm', input: 'what is 2+2?' });
      expect(r.object).toBe('response');
      const sent = openaiLike.requests.slice(before).map((q) => q.body.toString());
      expect(sent).toHaveLength(2);
      expect(sent[0]).toContain('"return_token_ids":true');
      expect(sent[1]).not.toContain('return_token_ids');
      expect(sidecar.app.proxy.upstream().rejected).toMatch(/return_token_ids/);
      const [t] = await closeAndRead(sidecar, 'refused-2', 1);
      expect(t).toMatchObject({ api: 'responses', status: 'ok', injected: [], translation: { upstream_api: 'chat.completions' } });
    } finally {
      await sidecar.stop();
    }
  });
});
