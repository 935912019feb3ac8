import http from 'node:http';
import { mkdtempSync, readdirSync, readFileSync, existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startChildSidecar } from '../support/child-sidecar';
import { startFakeModelServer } from '../support/fake-model-server';

describe('graceful shutdown', () => {
  it('on SIGTERM mid-stream lets the stream finish, writes its transition, and exits 0', async () => {
    const upstream = await startFakeModelServer({ flavor: 'vllm', chunkDelayMs: 40 });
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-term-'));
    const child = await startChildSidecar({
      LIGHTNING_UPSTREAM_URL: upstream.url,
      LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
      LIGHTNING_DATA_DIR: dataDir,
      LIGHTNING_LOG_LEVEL: 'info',
    });
    try {
      const body = await new Promise<string>((resolve, reject) => {
        const req = http.request(
          `${child.origin}/rollout/term-1/v1/chat/completions`,
          { method: 'POST', headers: { 'content-type': 'application/json' } },
          (res) => {
            let text = '';
            let signalled = false;
            res.on('data', (c: Buffer) => {
              text += c.toString();
              if (!signalled) {
                signalled = true;
                child.proc.kill('SIGTERM');
              }
            });
            res.on('end', () => resolve(text));
            res.on('error', reject);
          },
        );
        req.on('error', reject);
        req.end(JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'a fairly long answer please' }] }));
      });
      expect(body.trimEnd().endsWith('data: [DONE]')).toBe(true);
      const exit = await child.exited;
      expect(exit).toEqual({ code: 0, signal: null });
      const dir = path.join(dataDir, 'transitions');
      expect(existsSync(dir)).toBe(true);
      const lines = readdirSync(dir).flatMap((f) => readFileSync(path.join(dir, f), 'utf8').split('\n').filter(Boolean));
      expect(lines.map((l) => JSON.parse(l))).toEqual([
        expect.objectContaining({ transition_id: 'term-1/0/0', streamed: true, status: 'ok', finish_reason: 'stop' }),
      ]);
      const logs = child.stderr.join('');
      expect(logs).toContain('"msg":"signal received: draining"');
      expect(logs).toContain('"msg":"stopped"');
    } finally {
      await child.kill('SIGKILL');
      await upstream.close();
    }
  });

  it('exits at once on a second signal', async () => {
    const upstream = await startFakeModelServer({ fault: () => ({ kind: 'hang' }) });
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-term2-'));
    const child = await startChildSidecar({ LIGHTNING_UPSTREAM_URL: upstream.url, LIGHTNING_DATA_DIR: dataDir, LIGHTNING_LOG_LEVEL: 'warn' });
    try {
      const req = http.request(`${child.origin}/v1/chat/completions`, { method: 'POST' });
      req.on('error', () => {});
      req.end('{}');
      await new Promise((r) => setTimeout(r, 100));
      child.proc.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 100));
      child.proc.kill('SIGTERM');
      const started = Date.now();
      const exit = await child.exited;
      expect(Date.now() - started).toBeLessThan(5000);
      expect(exit.code).toBe(130);
    } finally {
      await child.kill('SIGKILL');
      await upstream.close();
    }
  });
});
