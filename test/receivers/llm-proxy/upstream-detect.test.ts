import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { detectUpstream, type ProbeFetch } from '../../../src/receivers/llm-proxy/upstream-detect';
import { startFakeModelServer } from '../../support/fake-model-server';

/** A server answering fixed bodies by path; everything else 404. */
async function fixedServer(routes: Record<string, { status?: number; body: string; delayMs?: number }>): Promise<{ url: string; close(): Promise<void> }> {
  const delayed = new Set<NodeJS.Timeout>();
  const server = http.createServer((req, res) => {
    const r = routes[(req.url ?? '').split('?')[0]];
    const send = () => {
      if (!r) return res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}');
      res.writeHead(r.status ?? 200, { 'content-type': 'application/json' }).end(r.body);
    };
    if (r?.delayMs) {
      const t = setTimeout(() => {
        delayed.delete(t);
        send();
      }, r.delayMs);
      delayed.add(t);
    } else send();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const t of delayed) clearTimeout(t);
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

describe('detectUpstream', () => {
  it('identifies vLLM by owned_by on /v1/models and reads its /version', async () => {
    const s = await startFakeModelServer({ strict: true, version: '0.11.2' });
    try {
      expect(await detectUpstream(s.url, { timeoutMs: 2000 })).toEqual({
        flavor: 'vllm',
        evidence: 'GET /v1/models: owned_by vllm; GET /version: 0.11.2',
        serverVersion: '0.11.2',
      });
      expect(s.requests.map((r) => r.path)).toEqual(['/v1/models', '/version']);
    } finally {
      await s.close();
    }
  });

  it('calls an OpenAI-like server (a model list without owned_by vllm or sglang) openai', async () => {
    const s = await startFakeModelServer({ strict: true, flavor: 'openai' });
    try {
      const d = await detectUpstream(`${s.url}/`, { timeoutMs: 2000 });
      expect(d).toEqual({ flavor: 'openai', evidence: 'GET /v1/models: models owned by system, not vllm or sglang', serverVersion: null });
    } finally {
      await s.close();
    }
  });

  it('identifies SGLang by owned_by and reads the version from /server_info', async () => {
    const s = await fixedServer({
      '/v1/models': {
        body: JSON.stringify({ object: 'list', data: [{ id: 'qwen', object: 'model', created: 1, owned_by: 'sglang', root: 'qwen', max_model_len: 32768 }] }),
      },
      '/server_info': { body: JSON.stringify({ model_path: 'Qwen/Qwen3-8B', tp_size: 1, version: '0.5.4' }) },
    });
    try {
      expect(await detectUpstream(s.url, { timeoutMs: 2000 })).toEqual({
        flavor: 'sglang',
        evidence: 'GET /v1/models: owned_by sglang; GET /server_info: 0.5.4',
        serverVersion: '0.5.4',
      });
    } finally {
      await s.close();
    }
  });

  it('identifies an older SGLang by /get_server_info when /v1/models does not answer a listing', async () => {
    const s = await fixedServer({
      '/v1/models': { status: 500, body: 'oops' },
      '/get_server_info': { body: JSON.stringify({ model_path: 'm', version: '0.4.9' }) },
    });
    try {
      const d = await detectUpstream(s.url, { timeoutMs: 2000 });
      expect(d.flavor).toBe('sglang');
      expect(d.serverVersion).toBe('0.4.9');
      expect(d.evidence).toBe('GET /get_server_info: SGLang server info, version 0.4.9 (GET /v1/models: answered 500)');
    } finally {
      await s.close();
    }
  });

  it('identifies vLLM behind --api-key: /v1/models 401, /version answers', async () => {
    const s = await fixedServer({ '/v1/models': { status: 401, body: '{"error":"Unauthorized"}' }, '/version': { body: '{"version":"0.10.1"}' } });
    try {
      expect(await detectUpstream(s.url, { timeoutMs: 2000 })).toMatchObject({ flavor: 'vllm', serverVersion: '0.10.1' });
    } finally {
      await s.close();
    }
  });

  it('a /version alone (without the key-protected listing) is not taken for vLLM', async () => {
    const s = await fixedServer({ '/version': { body: '{"version":"1.0"}' } });
    try {
      expect(await detectUpstream(s.url, { timeoutMs: 2000 })).toEqual({
        flavor: 'unknown',
        evidence: 'GET /v1/models: answered 404',
        serverVersion: null,
        answered: true,
      });
    } finally {
      await s.close();
    }
  });

  it('answers that are not JSON, or JSON that is not a listing, are unknown', async () => {
    const html = await fixedServer({ '/v1/models': { body: '<html>login</html>' } });
    const other = await fixedServer({ '/v1/models': { body: '{"models":[]}' } });
    try {
      expect(await detectUpstream(html.url, { timeoutMs: 2000 })).toEqual({
        flavor: 'unknown',
        evidence: 'GET /v1/models: answer is not JSON',
        serverVersion: null,
        answered: true,
      });
      expect((await detectUpstream(other.url, { timeoutMs: 2000 })).evidence).toBe('GET /v1/models: not a model listing');
    } finally {
      await html.close();
      await other.close();
    }
  });

  it('an unreachable port is unknown with the network error as evidence, without throwing', async () => {
    const probe = net.createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    expect(await detectUpstream(`http://127.0.0.1:${port}/v1`, { timeoutMs: 2000 })).toEqual({
      flavor: 'unknown',
      evidence: 'GET /v1/models: ECONNREFUSED',
      serverVersion: null,
      // Nobody answered: calls wait for the next identification rather than go without ids.
      answered: false,
    });
  });

  it('a server that never answers is unknown after the timeout', async () => {
    const s = await fixedServer({ '/v1/models': { body: '{}', delayMs: 5000 } });
    try {
      const started = Date.now();
      const d = await detectUpstream(s.url, { timeoutMs: 150 });
      expect(d).toEqual({ flavor: 'unknown', evidence: 'GET /v1/models: no answer within 150 ms', serverVersion: null, answered: false });
      expect(Date.now() - started).toBeLessThan(2000);
    } finally {
      await s.close();
    }
  });

  it('a 5xx listing (a gateway whose workers are starting) is not an answer about the server; no answer at all asks nothing more', async () => {
    const seen: string[] = [];
    const answering =
      (status: number): ProbeFetch =>
      async (url) => {
        seen.push(url);
        return status === 0 ? { status: 0, body: '', error: 'ECONNREFUSED' } : { status, body: '{"error": "no healthy upstream"}' };
      };
    expect(await detectUpstream('http://gw:8000/v1', { timeoutMs: 100, fetchImpl: answering(503) })).toMatchObject({ flavor: 'unknown', answered: false });
    expect(await detectUpstream('http://gw:8000/v1', { timeoutMs: 100, fetchImpl: answering(404) })).toMatchObject({ flavor: 'unknown', answered: true });
    seen.length = 0;
    expect(await detectUpstream('http://down:8000/v1', { timeoutMs: 100, fetchImpl: answering(0) })).toMatchObject({ flavor: 'unknown', answered: false });
    // A server that does not answer its listing is not asked its other routes (each would wait as long again).
    expect(seen).toEqual(['http://down:8000/v1/models']);
  });

  it('a malformed base URL is unknown, not an exception; a fetchImpl is used when given, with the configured headers', async () => {
    expect((await detectUpstream('not a url', { timeoutMs: 100 })).flavor).toBe('unknown');
    const seen: string[] = [];
    const fetchImpl: ProbeFetch = async (url, o) => {
      seen.push(`${url} ${o.headers.authorization}`);
      return { status: 200, body: JSON.stringify({ data: [{ id: 'm', owned_by: 'vllm' }] }) };
    };
    const d = await detectUpstream('http://gpu-0:8000/v1', { timeoutMs: 100, fetchImpl, headers: { authorization: 'Bearer k' } });
    expect(d.flavor).toBe('vllm');
    expect(seen).toEqual(['http://gpu-0:8000/v1/models Bearer k', 'http://gpu-0:8000/version Bearer k']);
  });
});
