import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import * as grpc from '@grpc/grpc-js';
import fc from 'fast-check';
import { decodeStatus } from '../../src/receivers/otlp/decode';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../support/sidecar';

const RUN = { seed: 20261122, numRuns: 25 };

describe('gzip bombs on OTLP', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  const CAP = 1024 * 1024;
  beforeAll(async () => {
    upstream = await startFakeModelServer();
    sidecar = await startSidecar(upstream.url, { receivers: { otlp: { max_request_bytes: CAP } } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  it('HTTP: 256 MiB of zeros in a 256 KiB gzip body is refused with 413 after at most the cap, memory stays flat', async () => {
    const bomb = gzipSync(Buffer.alloc(256 * 1024 * 1024));
    expect(bomb.length).toBeLessThan(300 * 1024);
    const before = process.memoryUsage();
    for (let i = 0; i < 4; i++) {
      const res = await fetch(`http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-protobuf', 'content-encoding': 'gzip' },
        body: bomb,
      });
      expect(res.status).toBe(413);
      expect(decodeStatus(new Uint8Array(await res.arrayBuffer())).code).toBe(8); // RESOURCE_EXHAUSTED
    }
    const after = process.memoryUsage();
    // Four 256 MiB inflations would show; streaming inflation with a cap does not.
    expect(after.rss - before.rss).toBeLessThan(96 * 1024 * 1024);
    expect(after.arrayBuffers - before.arrayBuffers).toBeLessThan(32 * 1024 * 1024);
  });

  it('gRPC: a gzip-compressed message inflating past the cap gets RESOURCE_EXHAUSTED, and the server keeps serving', async () => {
    const client = new grpc.Client(`127.0.0.1:${sidecar.app.otlp!.grpcPort()}`, grpc.credentials.createInsecure(), {
      'grpc.default_compression_algorithm': 2,
      'grpc.max_send_message_length': -1,
    });
    const call = (body: Buffer) =>
      new Promise<grpc.ServiceError | null>((resolve) => {
        client.makeUnaryRequest(
          '/opentelemetry.proto.collector.trace.v1.TraceService/Export',
          (b: Buffer) => b,
          (b: Buffer) => b,
          body,
          new grpc.Metadata(),
          {},
          (err) => resolve(err),
        );
      });
    const err = await call(Buffer.alloc(64 * 1024 * 1024));
    expect(err?.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(await call(Buffer.alloc(0))).toBeNull();
    client.close();
  });
});

describe('hostile request bodies through the proxy (every API)', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm', max_request_bytes: 4 * 1024 * 1024 } } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  const paths = ['/v1/chat/completions', '/v1/completions', '/v1/responses', '/v1/messages'];
  /** The status, and whether the sidecar itself produced the answer (instead of passing the upstream's on). */
  const send = async (path: string, body: string | Buffer) => {
    const res = await fetch(`${sidecar.origin}/rollout/hostile/v1${path.slice(3)}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    await res.arrayBuffer();
    return { status: res.status, own: res.headers.get('x-lightning-sidecar-error') };
  };
  const post = async (path: string, body: string | Buffer) => (await send(path, body)).status;

  it('forwards whatever JSON (or non-JSON) the agent sends and stays up', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...paths),
        fc.oneof(
          fc.string({ maxLength: 200 }),
          fc.jsonValue({ maxDepth: 5 }).map((v) => JSON.stringify(v)),
          fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)),
        ),
        async (path, body) => {
          const before = upstream.requests.length;
          const r = await send(path, body);
          // Whatever the fake model made of it, the proxy passed it on and answered with the upstream's answer.
          expect(r.own).toBeNull();
          expect(upstream.requests.length).toBe(before + 1);
        },
      ),
      RUN,
    );
    // Deep nesting and huge arrays, within max_request_bytes.
    expect(await post('/v1/chat/completions', '['.repeat(200_000) + ']'.repeat(200_000))).not.toBe(502);
    expect(await post('/v1/chat/completions', JSON.stringify({ model: 'm', messages: new Array(100_000).fill({ role: 'user', content: 'x' }) }))).toBe(200);
    // Over the cap: 413 in the OpenAI shape, not a crash.
    expect(await post('/v1/chat/completions', Buffer.alloc(5 * 1024 * 1024, 0x20))).toBe(413);
    const ok = await post('/v1/chat/completions', JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'still alive?' }] }));
    expect(ok).toBe(200);
  });
});

describe('misbehaving upstreams', () => {
  let sidecar: TestSidecar;
  let server: http.Server;
  let behaviour: (res: http.ServerResponse) => void = () => {};
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => behaviour(res));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    sidecar = await startSidecar(`http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', upstream_timeout_ms: 500, max_capture_bytes: 64 * 1024 } },
    });
  });
  afterAll(async () => {
    await sidecar.stop();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });

  const call = async (stream = false) => {
    try {
      const res = await fetch(`${sidecar.origin}/rollout/bad-upstream/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: 'x' }] }),
      });
      const body = Buffer.from(await res.arrayBuffer());
      return { status: res.status, body, failed: false };
    } catch {
      return { status: 0, body: Buffer.alloc(0), failed: true };
    }
  };

  it('passes through, records an error, and never crashes: truncated JSON, wrong content-length, non-UTF-8, reset mid-stream, a stream that never ends', async () => {
    behaviour = (res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"c","choices":[{"index":0,"message":{"role":"assist');
    const truncated = await call();
    expect(truncated.status).toBe(200);
    expect(truncated.body.toString()).toBe('{"id":"c","choices":[{"index":0,"message":{"role":"assist');

    behaviour = (res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '500' });
      res.write('{"short": true}');
      setTimeout(() => res.destroy(), 20);
    };
    const shortBody = await call();
    expect(shortBody.failed || shortBody.status === 200).toBe(true);

    const latin1 = Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0xc3, 0x28, 0x22, 0x7d]);
    behaviour = (res) => res.writeHead(200, { 'content-type': 'application/json' }).end(latin1);
    const binary = await call();
    expect(binary.body.equals(latin1)).toBe(true);

    behaviour = (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n');
      setTimeout(() => res.destroy(), 20);
    };
    const reset = await call(true);
    expect(reset.failed || reset.body.toString().startsWith('data: ')).toBe(true);

    // Never ends, but keeps sending: capped capture, the client still gets every byte until it hangs up.
    let timer: NodeJS.Timeout | undefined;
    behaviour = (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      timer = setInterval(() => res.write(`data: {"choices":[{"index":0,"delta":{"content":"${'z'.repeat(1000)}"}}]}\n\n`), 1);
      res.on('close', () => clearInterval(timer));
    };
    const ctrl = new AbortController();
    const res = await fetch(`${sidecar.origin}/rollout/bad-upstream/v1/chat/completions`, {
      method: 'POST',
      body: JSON.stringify({ model: 'm', stream: true, messages: [] }),
      signal: ctrl.signal,
    });
    const reader = res.body!.getReader();
    let got = 0;
    while (got < 300 * 1024) got += (await reader.read()).value?.length ?? 0;
    ctrl.abort();
    clearInterval(timer);

    // Silent upstream: 504 after upstream_timeout_ms.
    behaviour = () => {};
    const silent = await call();
    expect(silent.status).toBe(504);

    await fetch(`${sidecar.origin}/lightning/v1/rollouts/bad-upstream/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    const ts = sidecar.transitions();
    expect(ts.length).toBeGreaterThanOrEqual(6);
    expect(ts.every((t) => t.status !== 'ok' || t.http_status === 200)).toBe(true);
    expect(ts.filter((t) => t.status === 'error' || t.status === 'aborted').length).toBeGreaterThanOrEqual(5);
    expect(ts.some((t) => t.truncated)).toBe(true);
    expect(await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_capture_drops_total')).toMatch(/reason="capture_cap"\} [1-9]/);
  });
});

describe('a streamed response split at arbitrary byte boundaries', () => {
  let sidecar: TestSidecar;
  let server: http.Server;
  let cuts: number[] = [];
  const events = [
    {
      id: 'c',
      object: 'chat.completion.chunk',
      choices: [{ index: 0, delta: { role: 'assistant', content: 'héllo ' }, token_ids: [11] }],
      prompt_token_ids: [1, 2, 3],
    },
    { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: '日本 ' }, token_ids: [12, 13] }] },
    { id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'emoji 🎉' }, finish_reason: 'stop', token_ids: [14] }] },
  ];
  // CRLF and LF endings mixed, a comment line, then [DONE].
  const stream = Buffer.from(
    `: keep-alive\r\n\r\ndata: ${JSON.stringify(events[0])}\r\n\r\ndata: ${JSON.stringify(events[1])}\n\ndata: ${JSON.stringify(events[2])}\r\n\r\ndata: [DONE]\n\n`,
  );
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      req.on('end', async () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        let at = 0;
        for (const cut of [...cuts, stream.length]) {
          res.write(stream.subarray(at, cut));
          at = cut;
          await new Promise((r) => setImmediate(r));
        }
        res.end();
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    sidecar = await startSidecar(`http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await new Promise<void>((r) => server.close(() => r()));
  });

  it('reaches the agent byte-identical and is recorded identically, wherever the chunks break (inside UTF-8 characters too)', async () => {
    let n = 0;
    await fc.assert(
      fc.asyncProperty(fc.uniqueArray(fc.integer({ min: 1, max: stream.length - 1 }), { maxLength: 40 }), async (points) => {
        cuts = [...points].sort((a, b) => a - b);
        const id = `split-${n++}`;
        const res = await fetch(`${sidecar.origin}/rollout/${id}/v1/chat/completions`, {
          method: 'POST',
          // The agent asks for the ids itself, so the answer is its to see, as the server sent it.
          body: JSON.stringify({ model: 'm', stream: true, messages: [], return_token_ids: true, logprobs: true }),
        });
        expect(Buffer.from(await res.arrayBuffer()).equals(stream)).toBe(true);
        await fetch(`${sidecar.origin}/lightning/v1/rollouts/${id}/end`, { method: 'POST', body: '{}' });
        for (let i = 0; i < 100 && !sidecar.transitions().some((t) => t.rollout_id === id); i++) await new Promise((r) => setTimeout(r, 10));
        const t = sidecar.transitions().find((x) => x.rollout_id === id)!;
        expect(t).toMatchObject({ status: 'ok', finish_reason: 'stop', prompt_token_ids: [1, 2, 3], response_token_ids: [11, 12, 13, 14] });
        expect((t.response as { choices: { message: { content: string } }[] }).choices[0].message.content).toBe('héllo 日本 emoji 🎉');
      }),
      { seed: 20261122, numRuns: 30 },
    );
  });
});
