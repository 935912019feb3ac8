import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import fc from 'fast-check';
import { UpstreamClient, type UpstreamRequest, type UpstreamResponse } from '../../../src/receivers/llm-proxy/upstream-client';

interface Got {
  status: number;
  headers: Record<string, string | undefined>;
  rawHeaders: string[];
  body: Buffer;
}

/** Sends one request and collects the answer (or the error). */
function exchange(client: UpstreamClient, method: string, path: string, headers: string[], body?: Buffer | Buffer[]): Promise<Got> {
  return new Promise((resolve, reject) => {
    const req: UpstreamRequest = client.request({ method, path, headers });
    req.on('error', reject);
    req.on('response', (res: UpstreamResponse) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(Buffer.from(c)));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, rawHeaders: res.rawHeaders, body: Buffer.concat(parts) }));
    });
    const parts = body === undefined ? [] : Array.isArray(body) ? body : [body];
    for (const p of parts.slice(0, -1)) req.write(p);
    req.end(parts[parts.length - 1]);
  });
}

/** A raw TCP server: `onRequest` gets each connection's bytes as they arrive. */
async function rawServer(
  onData: (socket: net.Socket, data: Buffer, conn: number) => void,
): Promise<{ port: number; connections: () => number; close: () => Promise<void> }> {
  let n = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    const conn = ++n;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('data', (d) => onData(s, d, conn));
    s.on('error', () => {});
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: (server.address() as AddressInfo).port,
    connections: () => n,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

const clients: UpstreamClient[] = [];
function clientFor(port: number, options = {}): UpstreamClient {
  const c = new UpstreamClient({ hostname: '127.0.0.1', port, secure: false }, options);
  clients.push(c);
  return c;
}
afterEach(() => {
  for (const c of clients.splice(0)) c.close();
});

describe('upstream client', () => {
  it('sends requests over one kept-alive connection and reads each answer whole', async () => {
    const seen: { method: string; url: string; body: string; headers: http.IncomingHttpHeaders }[] = [];
    const sockets = new Set<unknown>();
    const server = http.createServer((req, res) => {
      sockets.add(req.socket);
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        seen.push({ method: req.method!, url: req.url!, body, headers: req.headers });
        res.setHeader('x-seen', String(seen.length));
        res.end(JSON.stringify({ n: seen.length }));
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    try {
      const client = clientFor(port);
      const a = await exchange(
        client,
        'POST',
        '/v1/chat/completions?x=1',
        ['Host', `127.0.0.1:${port}`, 'Content-Type', 'application/json', 'content-length', '7'],
        Buffer.from('{"a":1}'),
      );
      // No content-length: the body goes chunked.
      const b = await exchange(client, 'POST', '/v1/completions', ['host', 'h'], [Buffer.from('{"b":'), Buffer.from('2}')]);
      const c = await exchange(client, 'GET', '/v1/models', ['host', 'h']);
      const d = await exchange(client, 'POST', '/empty', ['host', 'h']);
      expect([a, b, c, d].map((g) => [g.status, g.body.toString(), g.headers['x-seen']])).toEqual([
        [200, '{"n":1}', '1'],
        [200, '{"n":2}', '2'],
        [200, '{"n":3}', '3'],
        [200, '{"n":4}', '4'],
      ]);
      expect(seen.map((s) => [s.method, s.url, s.body])).toEqual([
        ['POST', '/v1/chat/completions?x=1', '{"a":1}'],
        ['POST', '/v1/completions', '{"b":2}'],
        ['GET', '/v1/models', ''],
        ['POST', '/empty', ''],
      ]);
      expect(seen[1].headers['transfer-encoding']).toBe('chunked');
      expect(seen[2].headers['transfer-encoding']).toBeUndefined();
      expect(seen[3].headers['content-length']).toBe('0');
      expect(sockets.size).toBe(1);
    } finally {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  });

  it('reads the same status, headers and body as node:http does, for any framing the server picks', async () => {
    const framings = ['length', 'chunked', 'close'] as const;
    let current: { framing: (typeof framings)[number]; body: Buffer; status: number } = { framing: 'length', body: Buffer.alloc(0), status: 200 };
    const raw = await rawServer((s, data) => {
      if (!data.includes('\r\n\r\n')) return;
      const { framing, body, status } = current;
      const head = `HTTP/1.1 ${status} Whatever\r\nX-Dup: a\r\nx-dup: b\r\nContent-Type: application/json\r\n`;
      if (framing === 'length') s.write(`${head}Content-Length: ${body.length}\r\n\r\n`);
      else if (framing === 'chunked') s.write(`${head}Transfer-Encoding: chunked\r\n\r\n`);
      else s.write(`${head}Connection: close\r\n\r\n`);
      for (let at = 0; at < body.length; at += 7) {
        const piece = body.subarray(at, at + 7);
        s.write(framing === 'chunked' ? Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]) : piece);
      }
      if (framing === 'chunked') s.write('0\r\n\r\n');
      if (framing === 'close') s.end();
    });
    const client = clientFor(raw.port);
    const agent = new http.Agent({ keepAlive: true });
    const viaNode = (): Promise<Got> =>
      new Promise((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: raw.port, method: 'POST', path: '/x', agent, headers: { 'content-length': 2 } }, (res) => {
          const parts: Buffer[] = [];
          res.on('data', (c: Buffer) => parts.push(c));
          res.on('end', () =>
            resolve({ status: res.statusCode!, headers: res.headers as Record<string, string>, rawHeaders: res.rawHeaders, body: Buffer.concat(parts) }),
          );
        });
        req.on('error', reject);
        req.end('{}');
      });
    try {
      await fc.assert(
        fc.asyncProperty(fc.constantFrom(...framings), fc.uint8Array({ maxLength: 200 }), fc.constantFrom(200, 400, 500), async (framing, body, status) => {
          current = { framing, body: Buffer.from(body), status };
          const ours = await exchange(client, 'POST', '/x', ['host', 'h', 'content-length', '2'], Buffer.from('{}'));
          const theirs = await viaNode();
          expect(ours.status).toBe(theirs.status);
          expect(ours.rawHeaders).toEqual(theirs.rawHeaders);
          expect(ours.headers['x-dup']).toBe(theirs.headers['x-dup']);
          expect(ours.body.equals(theirs.body)).toBe(true);
        }),
        { seed: 20261124, numRuns: 60 },
      );
    } finally {
      agent.destroy();
      await raw.close();
    }
  });

  it('sends a request again on a new connection when a kept-alive one was closed by the server before answering', async () => {
    let requests = 0;
    const raw = await rawServer((s, data, conn) => {
      if (!data.includes('\r\n\r\n')) return;
      requests++;
      // The first connection answers once, then "times out" just as the next request arrives.
      if (conn === 1 && requests === 2) {
        s.destroy();
        return;
      }
      s.write(`HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n${conn}`);
    });
    try {
      const client = clientFor(raw.port);
      expect((await exchange(client, 'POST', '/a', ['content-length', '2'], Buffer.from('{}'))).body.toString()).toBe('1');
      expect((await exchange(client, 'POST', '/b', ['content-length', '2'], Buffer.from('{}'))).body.toString()).toBe('2');
      expect(raw.connections()).toBe(2);
    } finally {
      await raw.close();
    }
  });

  it('does not send a request again when a new connection fails, nor once the answer has begun', async () => {
    const raw = await rawServer((s, data) => {
      if (data.includes('/cut')) s.end('HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc');
      else s.destroy();
    });
    try {
      const client = clientFor(raw.port);
      await expect(exchange(client, 'POST', '/reset', ['content-length', '2'], Buffer.from('{}'))).rejects.toMatchObject({ code: 'ECONNRESET' });
      const cut = await new Promise<{ complete: boolean; closed: boolean }>((resolve) => {
        const req = client.request({ method: 'POST', path: '/cut', headers: ['content-length', '2'] });
        req.on('error', () => {});
        req.on('response', (res: UpstreamResponse) => {
          res.on('data', () => {});
          res.on('close', () => resolve({ complete: res.complete, closed: true }));
        });
        req.end(Buffer.from('{}'));
      });
      expect(cut).toEqual({ complete: false, closed: true });
      expect(raw.connections()).toBe(2);
    } finally {
      await raw.close();
    }
  });

  it('closes idle connections before the server would, sooner when the server says so (Keep-Alive: timeout)', async () => {
    const closedAt: number[] = [];
    const raw = await rawServer((s, data) => {
      if (!data.includes('\r\n\r\n')) return;
      s.once('close', () => closedAt.push(Date.now()));
      s.write(
        data.includes('/hint') ? 'HTTP/1.1 200 OK\r\nKeep-Alive: timeout=1\r\ncontent-length: 0\r\n\r\n' : 'HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n',
      );
    });
    try {
      const t0 = Date.now();
      await exchange(clientFor(raw.port, { idleTimeoutMs: 300 }), 'POST', '/plain', ['content-length', '0']);
      await exchange(clientFor(raw.port, { idleTimeoutMs: 10_000 }), 'POST', '/hint', ['content-length', '0']);
      await new Promise((r) => setTimeout(r, 600));
      expect(closedAt).toHaveLength(2);
      for (const at of closedAt) expect(at - t0).toBeLessThan(550);
    } finally {
      await raw.close();
    }
  });

  it('fails with the connection error when nothing listens, and calls back when the server goes quiet', async () => {
    const dead = await rawServer(() => {});
    const port = dead.port;
    await dead.close();
    await expect(exchange(clientFor(port), 'POST', '/', ['content-length', '0'])).rejects.toMatchObject({ code: 'ECONNREFUSED' });

    const silent = await rawServer(() => {});
    try {
      const req = clientFor(silent.port).request({ method: 'POST', path: '/', headers: ['content-length', '0'] });
      const err = await new Promise<Error>((resolve) => {
        req.on('error', resolve);
        req.setTimeout(100, () => req.destroy(Object.assign(new Error('quiet'), { code: 'UPSTREAM_TIMEOUT' })));
        req.end();
      });
      expect(err).toMatchObject({ code: 'UPSTREAM_TIMEOUT' });
    } finally {
      await silent.close();
    }
  });

  it('does not reuse a connection whose answer was followed by stray bytes', async () => {
    const raw = await rawServer((s, data) => {
      if (data.includes('\r\n\r\n')) s.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokSTRAY');
    });
    try {
      const client = clientFor(raw.port);
      expect((await exchange(client, 'POST', '/', ['content-length', '0'])).body.toString()).toBe('ok');
      expect((await exchange(client, 'POST', '/', ['content-length', '0'])).body.toString()).toBe('ok');
      expect(raw.connections()).toBe(2);
    } finally {
      await raw.close();
    }
  });

  it('reuses a connection whose answer ended while its reader had paused it', async () => {
    const raw = await rawServer((sock, data) => {
      if (data.includes('\r\n\r\n')) sock.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n__proto__: x\r\n\r\nok');
    });
    try {
      const client = clientFor(raw.port);
      const first = await new Promise<UpstreamResponse>((resolve, reject) => {
        const req = client.request({ method: 'POST', path: '/', headers: ['content-length', '0'] });
        req.on('error', reject);
        req.on('response', (res: UpstreamResponse) => {
          // A slow agent: the proxy pauses the answer, and it ends meanwhile.
          res.on('data', () => res.pause());
          res.on('end', () => resolve(res));
        });
        req.end();
      });
      expect(first.headers['__proto__']).toBe('x');
      expect(Object.getPrototypeOf(first.headers)).toBeNull();
      expect((await exchange(client, 'POST', '/', ['content-length', '0'])).body.toString()).toBe('ok');
      expect(raw.connections()).toBe(1);
    } finally {
      await raw.close();
    }
  });
});
