import http from 'node:http';
import { startFakeModelServer, type FakeModelServer, type FakeModelServerOptions } from '../../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../../support/sidecar';

interface RawResponse {
  status: number;
  statusMessage: string;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

function request(url: string, init: { method?: string; headers?: Record<string, string>; body?: string | Buffer } = {}): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: init.method ?? 'POST', headers: { 'content-type': 'application/json', ...init.headers }, agent: false }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, statusMessage: res.statusMessage!, headers: res.headers, body: Buffer.concat(parts) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(init.body);
  });
}

const chatBody = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'policy', messages: [{ role: 'user', content: 'hi there' }], top_k: 5, chat_template_kwargs: { enable_thinking: false }, ...extra });

describe('proxy transparency', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  async function setup(upstreamOptions: FakeModelServerOptions = {}, overrides: Record<string, unknown> = {}): Promise<void> {
    upstream = await startFakeModelServer(upstreamOptions);
    sidecar = await startSidecar(upstream.url, overrides);
  }
  afterEach(async () => {
    await sidecar?.stop();
    await upstream?.close();
  });

  it('delivers the same status, headers and body bytes as a direct call, and forwards unknown fields untouched', async () => {
    await setup({ flavor: 'vllm' });
    const body = chatBody({ return_token_ids: true });
    const direct = await request(`${upstream.url}/chat/completions`, { body });
    const proxied = await request(`${sidecar.baseUrl}/chat/completions`, {
      body,
      headers: { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', baggage: 'k=v' },
    });
    expect(proxied.status).toBe(direct.status);
    expect(proxied.body.equals(direct.body)).toBe(true);
    for (const h of ['content-type', 'content-length', 'x-fake-upstream']) expect(proxied.headers[h]).toBe(direct.headers[h]);
    // The upstream got the agent's bytes as sent, and the trace headers.
    expect(upstream.requests[1].body.toString()).toBe(body);
    expect(upstream.requests[1].headers.traceparent).toBe('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
    expect(upstream.requests[1].headers.baggage).toBe('k=v');
  });

  it('streams SSE byte-identically to a direct call', async () => {
    await setup({ flavor: 'vllm' });
    const body = chatBody({ stream: true, return_token_ids: true, logprobs: true, stream_options: { include_usage: true } });
    const direct = await request(`${upstream.url}/chat/completions`, { body });
    const proxied = await request(`${sidecar.baseUrl}/chat/completions`, { body });
    expect(proxied.headers['content-type']).toBe('text/event-stream');
    expect(proxied.headers['x-accel-buffering']).toBe('no');
    expect(proxied.body.toString()).toBe(direct.body.toString());
  });

  it('strips hop-by-hop headers and those named by Connection, keeps end-to-end ones', async () => {
    await setup();
    await request(`${sidecar.baseUrl}/models`, {
      method: 'GET',
      headers: { connection: 'keep-alive, x-hop', 'x-hop': 'secret-hop', 'keep-alive': 'timeout=5', 'x-end-to-end': 'yes', te: 'trailers' },
    });
    const seen = upstream.requests[0].headers;
    expect(seen['x-hop']).toBeUndefined();
    expect(seen['keep-alive']).toBeUndefined();
    expect(seen.te).toBeUndefined();
    expect(seen['x-end-to-end']).toBe('yes');
    expect(seen.host).toBe(`127.0.0.1:${upstream.port}`);
    expect(upstream.requests[0].path).toBe('/v1/models');
  });

  it('forwards the first SSE event before the upstream has finished the stream', async () => {
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    await setup({ flavor: 'vllm', holdAfterFirstEvent: () => released });
    const firstEvent = await new Promise<string>((resolve, reject) => {
      const req = http.request(`${sidecar.baseUrl}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        res.once('data', (c: Buffer) => {
          resolve(c.toString());
          // Only now may the upstream finish: the client saw the first event while it held the rest.
          release();
          res.resume();
        });
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(chatBody({ stream: true }));
    });
    expect(firstEvent.startsWith('data: {')).toBe(true);
    expect(firstEvent).toContain('"role":"assistant"');
  });

  // A small answer goes to the agent as one buffer, a large one as the server's pieces with the
  // nulls between them: both must be the server's answer with only those members changed.
  for (const [size, words] of [
    ['small', 5],
    ['large', 12_000],
  ] as const)
    it(`gives an agent that did not ask for ids or logprobs the server's answer with them null, and its length (${size})`, async () => {
      await setup(
        { flavor: 'vllm', script: () => ({ content: Array.from({ length: words }, (_, i) => `w${i}`).join(' ') }) },
        { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } },
      );
      const asked = await request(`${upstream.url}/chat/completions`, { body: chatBody({ return_token_ids: true, logprobs: true }) });
      const proxied = await request(`${sidecar.origin}/rollout/strip-${size}/v1/chat/completions`, { body: chatBody() });
      expect(proxied.status).toBe(200);
      expect(Number(proxied.headers['content-length'])).toBe(proxied.body.length);
      // What the sidecar asked for is in the server's answer, so there is something to give back as null.
      // Each size takes its own path: joined up to 64 KiB, written as pieces above.
      if (size === 'large') expect(asked.body.length).toBeGreaterThan(64 * 1024);
      else expect(asked.body.length).toBeLessThanOrEqual(64 * 1024);
      const server = JSON.parse(asked.body.toString()) as { id: string; created: number; prompt_token_ids: unknown; choices: Record<string, unknown>[] };
      expect(server.prompt_token_ids).toEqual(expect.any(Array));
      expect(server.choices[0].token_ids).toEqual(expect.any(Array));
      expect(server.choices[0].logprobs).not.toBeNull();
      const agent = JSON.parse(proxied.body.toString()) as typeof server;
      const expected = {
        ...server,
        id: agent.id,
        created: agent.created,
        prompt_token_ids: null,
        choices: server.choices.map((c) => ({ ...c, token_ids: null, logprobs: null })),
      };
      expect(agent).toEqual(expected);
      // The journal kept the server's bytes: the record has the ids the agent was not given.
      await fetch(`${sidecar.origin}/lightning/v1/rollouts/strip-${size}/end`, { method: 'POST', body: '{}' });
      await sidecar.waitForEpisodes(1);
      expect(sidecar.transitions()[0].response_token_ids).toEqual(server.choices[0].token_ids);
    });

  it('passes upstream 4xx/5xx bodies through unchanged and records the call as an error', async () => {
    const errBody = JSON.stringify({ error: { message: 'model overloaded', type: 'server_error' } });
    await setup({ fault: () => ({ kind: 'status', status: 500, body: errBody }) });
    const res = await request(`${sidecar.origin}/rollout/err-1/v1/chat/completions`, { body: chatBody() });
    expect(res.status).toBe(500);
    expect(res.body.toString()).toBe(errBody);
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/err-1/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0]).toMatchObject({ status: 'error', http_status: 500, response: { error: { message: 'model overloaded' } } });
  });

  it('answers 502 in the OpenAI error shape when the upstream refuses connections', async () => {
    // Port 1 (tcpmux) is never served here: a port freed and handed back could be taken by another
    // test's server before the call, which then answers instead of refusing.
    const port = 1;
    upstream = await startFakeModelServer();
    sidecar = await startSidecar(`http://127.0.0.1:${port}/v1`);
    const res = await request(`${sidecar.origin}/rollout/down-1/v1/chat/completions`, { body: chatBody() });
    expect(res.status).toBe(502);
    const json = JSON.parse(res.body.toString());
    expect(json.error).toMatchObject({ type: 'api_error', code: 'upstream_unreachable' });
    expect(json.error.message).toContain('ECONNREFUSED');
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/down-1/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0]).toMatchObject({ status: 'error', http_status: 502 });
  });

  it('answers 504 when the upstream does not answer within upstream_timeout_ms', async () => {
    await setup({ fault: () => ({ kind: 'hang' }) }, { receivers: { llm_proxy: { upstream_timeout_ms: 150 } } });
    const res = await request(`${sidecar.origin}/rollout/slow-1/v1/chat/completions`, { body: chatBody() });
    expect(res.status).toBe(504);
    expect(JSON.parse(res.body.toString()).error.code).toBe('upstream_timeout');
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/slow-1/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0]).toMatchObject({ status: 'error', http_status: 504 });
  });

  it('cuts the agent off when the upstream resets mid-stream, and records what arrived as an error', async () => {
    await setup({ flavor: 'vllm', fault: () => ({ kind: 'reset-mid-stream', afterEvents: 3 }) });
    await expect(request(`${sidecar.origin}/rollout/reset-1/v1/chat/completions`, { body: chatBody({ stream: true }) })).rejects.toThrow();
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/reset-1/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(t.status).toBe('error');
    expect(t.streamed).toBe(true);
  });

  it('aborts the upstream request when the agent disconnects mid-stream and records the call as aborted', async () => {
    await setup({ flavor: 'vllm', chunkDelayMs: 30 });
    await new Promise<void>((resolve, reject) => {
      const req = http.request(
        `${sidecar.origin}/rollout/abort-1/v1/chat/completions`,
        { method: 'POST', headers: { 'content-type': 'application/json' } },
        (res) => {
          res.once('data', () => {
            req.destroy();
            resolve();
          });
        },
      );
      req.on('error', () => {});
      req.end(chatBody({ stream: true }));
      setTimeout(() => reject(new Error('no data')), 3000).unref();
    });
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/abort-1/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(t.status).toBe('aborted');
    expect(t.error).toContain('client closed');
  });

  it('refuses a body over max_request_bytes with 413, by content-length and when streamed chunked', async () => {
    await setup({}, { receivers: { llm_proxy: { max_request_bytes: 1024 } } });
    const big = chatBody({ pad: 'x'.repeat(4096) });
    const res = await request(`${sidecar.baseUrl}/chat/completions`, { body: big });
    expect(res.status).toBe(413);
    expect(JSON.parse(res.body.toString()).error).toMatchObject({ type: 'invalid_request_error', code: 'request_too_large' });
    const chunked = await new Promise<number>((resolve, reject) => {
      const req = http.request(
        `${sidecar.baseUrl}/chat/completions`,
        { method: 'POST', headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' } },
        (r) => {
          r.resume();
          resolve(r.statusCode!);
        },
      );
      req.on('error', reject);
      for (let i = 0; i < 8; i++) req.write(Buffer.alloc(512, 0x20));
      req.end();
    });
    expect(chunked).toBe(413);
    expect(upstream.requests.filter((r) => r.body.length > 1024)).toHaveLength(0);
  });

  it('rejects a malformed rollout id with a 400 that names it, without calling the upstream', async () => {
    await setup();
    const res = await request(`${sidecar.baseUrl}/chat/completions`, { body: chatBody(), headers: { 'x-rollout-id': 'bad id/../x' } });
    expect(res.status).toBe(400);
    const json = JSON.parse(res.body.toString());
    expect(json.error.code).toBe('invalid_rollout_id');
    expect(json.error.message).toContain('x-rollout-id');
    expect(upstream.requests).toHaveLength(0);
  });

  it('passes a gzip-encoded response through as bytes and still records its content', async () => {
    await setup({ flavor: 'vllm', gzip: true });
    const res = await request(`${sidecar.origin}/rollout/gz/v1/chat/completions`, {
      body: chatBody({ return_token_ids: true }),
      headers: { 'accept-encoding': 'gzip' },
    });
    expect(res.headers['content-encoding']).toBe('gzip');
    expect(res.body.equals(upstream.responses[0])).toBe(true);
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/gz/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(t.status).toBe('ok');
    expect(t.response_token_ids?.length).toBeGreaterThan(0);
    expect((t.response as { object: string }).object).toBe('chat.completion');
  });

  it('forwards a call above the capture cap whole and marks its record truncated', async () => {
    await setup({ flavor: 'vllm' }, { receivers: { llm_proxy: { max_capture_bytes: 600 } } });
    const body = chatBody({ stream: true, pad: 'p'.repeat(300) });
    const direct = await request(`${upstream.url}/chat/completions`, { body });
    const res = await request(`${sidecar.origin}/rollout/cap/v1/chat/completions`, { body });
    expect(res.body.toString()).toBe(direct.body.toString());
    expect(res.body.length).toBeGreaterThan(600);
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/cap/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    expect(sidecar.transitions()[0].truncated).toBe(true);
    const metrics = await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_capture_drops_total');
    expect(metrics).toContain('lightning_sidecar_capture_drops_total{reason="capture_cap"} 1');
  });

  it('forwards every method and path, recording only the completion routes', async () => {
    await setup();
    const res = await request(`${sidecar.baseUrl}/models`, { method: 'GET' });
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body.toString()).data[0].id).toBe('fake-model');
    const notFound = await request(`${sidecar.origin}/v1/embeddings`, { body: '{"input":"x"}' });
    expect(notFound.status).toBe(404);
    await new Promise((r) => setTimeout(r, 50));
    expect(sidecar.app.pipeline.assembler.openCount).toBe(0);
  });
});
