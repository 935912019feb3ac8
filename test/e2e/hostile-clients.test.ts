import net from 'node:net';
import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../support/sidecar';

/** Opens a raw connection and resolves when the server closes it (or after `maxMs`, with false). */
function closedWithin(socket: net.Socket, maxMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), maxMs);
    socket.once('close', () => {
      clearTimeout(t);
      resolve(true);
    });
  });
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.once('error', reject);
  });
}

describe('slow and stalled clients', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  const port = () => Number(new URL(sidecar.origin).port);
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', client_header_timeout_ms: 400, client_body_idle_timeout_ms: 300 } },
    });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  it('cuts slowloris connections at the header timeout while other agents are served', async () => {
    const slow = await Promise.all(Array.from({ length: 40 }, () => connect(port())));
    const closed = slow.map((s) => closedWithin(s, 5000));
    const answers = slow.map((s) => new Promise<string>((resolve) => s.once('data', (c: Buffer) => resolve(c.toString().split('\r\n')[0]))));
    const trickles = slow.map((s, i) => {
      s.on('error', () => {});
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow-${i}: a\r\n`);
      return setInterval(() => s.writable && s.write(`X-More: ${i}\r\n`), 100);
    });
    try {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/fast/v1`, apiKey: 'k', maxRetries: 0 });
      const t0 = Date.now();
      const res = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
      expect(res.choices[0].message.content).toBe('Hello from the fake model.');
      expect(Date.now() - t0).toBeLessThan(2000);
      expect((await Promise.all(closed)).every(Boolean)).toBe(true);
      expect(new Set(await Promise.all(answers))).toEqual(new Set(['HTTP/1.1 408 Request Timeout']));
    } finally {
      trickles.forEach(clearInterval);
      slow.forEach((s) => s.destroy());
    }
  });

  it('answers 408 to a request body that stops arriving, records the call as aborted, and keeps no call open', async () => {
    const s = await connect(port());
    let answer = '';
    s.on('data', (c: Buffer) => (answer += c.toString()));
    s.on('error', () => {});
    const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'this body is never finished' }] });
    s.write(
      `POST /rollout/stall/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 20)}`,
    );
    expect(await closedWithin(s, 5000)).toBe(true);
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(answer).toContain('"code":"request_timeout"');
    expect(upstream.requests.filter((r) => r.body.toString().includes('never finished'))).toHaveLength(0);
    await fetch(`${sidecar.origin}/lightning/v1/rollouts/stall/end`, { method: 'POST', body: '{}' });
    await sidecar.waitForEpisodes(1);
    const t = sidecar.transitions().find((x) => x.rollout_id === 'stall')!;
    expect(t).toMatchObject({ status: 'aborted', error: 'the client stopped sending its request body' });
    expect(sidecar.app.proxy.inFlight()).toBe(0);
  });
});
