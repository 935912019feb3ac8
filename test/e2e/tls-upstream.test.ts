import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startChildSidecar, type ChildSidecar } from '../support/child-sidecar';

/**
 * A model server behind TLS (an https upstream_url): the proxy's own HTTP/1.1 client speaks TLS
 * with the server name checked against the certificate, trusting what Node trusts (the system
 * store, NODE_EXTRA_CA_CERTS), and records the call as it would over plain HTTP.
 */
const ANSWER = JSON.stringify({
  id: 'c1',
  object: 'chat.completion',
  model: 'm',
  choices: [{ index: 0, message: { role: 'assistant', content: 'over tls' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
});

let dir: string;
let server: https.Server;
let port: number;
const seen: { url: string; body: string }[] = [];

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-tls-'));
  // A certificate for 127.0.0.1, made for this run (no key material in the repository).
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      path.join(dir, 'key.pem'),
      '-out',
      path.join(dir, 'cert.pem'),
      '-days',
      '1',
      '-subj',
      '/CN=127.0.0.1',
      '-addext',
      'subjectAltName=IP:127.0.0.1',
    ],
    { stdio: 'ignore' },
  );
  server = https.createServer({ key: readFileSync(path.join(dir, 'key.pem')), cert: readFileSync(path.join(dir, 'cert.pem')) }, (req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ url: req.url!, body });
      res.writeHead(200, { 'content-type': 'application/json' }).end(ANSWER);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

async function withSidecar(extraEnv: Record<string, string>, run: (s: ChildSidecar, dataDir: string) => Promise<void>): Promise<void> {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-tls-data-'));
  const s = await startChildSidecar({
    LIGHTNING_UPSTREAM_URL: `https://127.0.0.1:${port}/v1`,
    LIGHTNING_UPSTREAM_FLAVOR: 'openai',
    LIGHTNING_DATA_DIR: dataDir,
    LIGHTNING_LOG_LEVEL: 'warn',
    LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
    ...extraEnv,
  });
  try {
    await run(s, dataDir);
  } finally {
    await s.kill();
  }
}

const ask = (origin: string) =>
  fetch(`${origin}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-rollout-id': 'tls-1' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
  });

describe('a model server behind TLS', () => {
  it('is reached over TLS and the call recorded, when its certificate is trusted', async () => {
    await withSidecar({ NODE_EXTRA_CA_CERTS: path.join(dir, 'cert.pem') }, async (s, dataDir) => {
      for (let i = 0; i < 3; i++) {
        const res = await ask(s.origin);
        expect(res.status).toBe(200);
        expect(await res.text()).toBe(ANSWER);
      }
      expect(seen.slice(-3).map((r) => r.url)).toEqual(['/v1/chat/completions', '/v1/chat/completions', '/v1/chat/completions']);
      await fetch(`${s.origin}/lightning/v1/rollouts/tls-1/end`, { method: 'POST', body: '{}' });
      const dirOf = path.join(dataDir, 'transitions');
      let lines: string[] = [];
      for (let t = 0; t < 100 && lines.length < 3; t++) {
        await new Promise((r) => setTimeout(r, 50));
        try {
          lines = readdirSync(dirOf).flatMap((f) => readFileSync(path.join(dirOf, f), 'utf8').split('\n').filter(Boolean));
        } catch {
          lines = [];
        }
      }
      const transitions = lines.map((l) => JSON.parse(l) as { transition_id: string; status: string; response: unknown });
      expect(transitions.map((t) => [t.transition_id, t.status])).toEqual([
        ['tls-1/0/0', 'ok'],
        ['tls-1/0/1', 'ok'],
        ['tls-1/0/2', 'ok'],
      ]);
      expect(transitions[0].response).toEqual(JSON.parse(ANSWER));
    });
  });

  it('answers 502 naming the certificate problem when it is not trusted', async () => {
    await withSidecar({}, async (s) => {
      const res = await ask(s.origin);
      expect(res.status).toBe(502);
      const body = (await res.json()) as { error: { message: string; code: string } };
      expect(body.error.code).toBe('upstream_unreachable');
      expect(body.error.message).toMatch(/SELF_SIGNED|self.signed|certificate/i);
    });
  });
});
