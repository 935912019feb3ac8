import { startFakeModelServer, type FakeModelServer } from '../../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../../support/sidecar';
import { HintLog, missingV1Hint, upstreamPathWarning } from '../../../src/receivers/llm-proxy/path-hints';
import { createLogger } from '../../../src/telemetry/logger';

/**
 * A `/v1` missing from a base URL ends in the model server's 404. The agent gets that answer as
 * the server sent it; the sidecar says, in a rate-limited warning, which base URL lacks it.
 */

type Log = { level: string; msg: string; [k: string]: unknown };
const parsed = (s: TestSidecar): Log[] => s.logs.map((l) => JSON.parse(l) as Log);
const warnings = (s: TestSidecar, pattern: RegExp): Log[] => parsed(s).filter((l) => l.level === 'warn' && pattern.test(l.msg));

const chat = (origin: string, path: string) =>
  fetch(`${origin}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer sk-test' },
    body: JSON.stringify({ model: 'fake-model', messages: [{ role: 'user', content: 'hi' }] }),
  });

let upstream: FakeModelServer;
let sidecar: TestSidecar | undefined;
beforeEach(async () => {
  // Strict: answers 404 `{"detail":"Not Found"}` (FastAPI's) to a route it does not have, as vLLM does.
  upstream = await startFakeModelServer({ strict: true });
});
afterEach(async () => {
  await sidecar?.stop();
  sidecar = undefined;
  await upstream.close();
});

describe('a /v1 missing from a base URL', () => {
  it('upstream_url without /v1: the agent gets the 404 unchanged and the sidecar names upstream_url and LIGHTNING_UPSTREAM_URL, once', async () => {
    sidecar = await startSidecar(upstream.origin, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    // At start: the URL has no path.
    expect(warnings(sidecar, /has no path/)).toEqual([
      expect.objectContaining({
        msg: expect.stringContaining('receivers.llm_proxy.upstream_url (LIGHTNING_UPSTREAM_URL) has no path') as unknown,
      }),
    ]);
    const res = await chat(sidecar.origin, '/v1/chat/completions');
    const body = Buffer.from(await res.arrayBuffer());
    expect(res.status).toBe(404);
    expect(upstream.requests.at(-1)?.path).toBe('/chat/completions');
    expect(body.equals(upstream.responses.at(-1)!)).toBe(true);
    expect(body.toString()).toBe('{"detail":"Not Found"}');
    await chat(sidecar.origin, '/rollout/r1/v1/chat/completions');
    const hints = warnings(sidecar, /answered 404/);
    expect(hints).toHaveLength(1);
    expect(hints[0].msg).toContain('the model server answered 404 to /chat/completions');
    expect(hints[0].msg).toContain('receivers.llm_proxy.upstream_url (LIGHTNING_UPSTREAM_URL) should probably end in /v1, e.g. http://vllm:8000/v1');
    expect(hints[0].msg).not.toContain('OPENAI_BASE_URL');
  });

  it.each([
    ['/chat/completions', 'e.g. http://127.0.0.1:PORT/v1 (or http://127.0.0.1:PORT/rollout/<id>/v1 to name the rollout)', '/chat/completions'],
    ['/rollout/r7/chat/completions', 'e.g. http://127.0.0.1:PORT/rollout/<id>/v1.', '/rollout/<id>/chat/completions'],
  ])("the agent's base URL without /v1 (%s): the 404 passes unchanged and the warning names OPENAI_BASE_URL", async (path, example, shown) => {
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    expect(warnings(sidecar, /has no path/)).toEqual([]);
    const res = await chat(sidecar.origin, path);
    const body = Buffer.from(await res.arrayBuffer());
    expect(res.status).toBe(404);
    expect(upstream.requests.at(-1)?.path).toBe(path);
    expect(body.equals(upstream.responses.at(-1)!)).toBe(true);
    const hints = warnings(sidecar, /answered 404/);
    expect(hints).toHaveLength(1);
    expect(hints[0].msg).toContain(`answered 404 to an agent's /chat/completions called without /v1: the agent's OPENAI_BASE_URL`);
    expect(hints[0].msg).toContain('should end in /v1');
    expect(hints[0].msg).toContain(example.replaceAll('PORT', String(sidecar.app.proxy.port())));
    expect(hints[0].msg).not.toContain('LIGHTNING_UPSTREAM_URL');
    // The rollout id from the network is not in the line.
    expect(hints[0]).toMatchObject({ agent_path: shown });
    expect(JSON.stringify(hints[0])).not.toContain('r7');
  });

  it('says nothing for a 404 that is not about /v1 (an unknown model, with both URLs right)', async () => {
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
    const res = await chat(sidecar.origin, '/v1/nothing/here');
    expect(res.status).toBe(404);
    expect(warnings(sidecar, /answered 404|has no path/)).toEqual([]);
  });

  it('decides which URL lacks /v1 from the path the agent used and the configured path', () => {
    expect(missingV1Hint('/v1/chat/completions', '', 404, 'h:1')?.kind).toBe('upstream_url');
    expect(missingV1Hint('/v1/chat/completions', '/api', 404, 'h:1')?.message).toContain("its path is '/api'");
    expect(missingV1Hint('/v1/chat/completions', '/v1', 404, 'h:1')).toBeNull();
    expect(missingV1Hint('/v1/chat/completions', '', 200, 'h:1')).toBeNull();
    expect(missingV1Hint('/chat/completions?x=1', '/v1', 404, 'h:1')?.kind).toBe('agent_base_url');
    expect(missingV1Hint('/models', '/v1', 404, 'h:1')?.kind).toBe('agent_base_url');
    expect(missingV1Hint('/favicon.ico', '/v1', 404, 'h:1')).toBeNull();
    // Both lack it: the agent's fix first, the upstream's named too.
    expect(missingV1Hint('/chat/completions', '', 404, 'h:1')?.message).toContain('upstream_url (LIGHTNING_UPSTREAM_URL) should end in /v1 too');
    expect(upstreamPathWarning('')).toContain('should end in /v1');
    expect(upstreamPathWarning('/v1')).toBeNull();
    expect(upstreamPathWarning('/openai')).toBeNull();
  });

  it('rate-limits the warning: one line a minute per kind, with how many were held back', () => {
    const lines: Log[] = [];
    let now = 0;
    const hints = new HintLog(createLogger({ level: 'info', write: (l) => lines.push(JSON.parse(l) as Log) }), () => now);
    const hint = missingV1Hint('/v1/chat/completions', '', 404, 'h:1')!;
    for (let i = 0; i < 5; i++) hints.warn(hint);
    hints.warn(missingV1Hint('/chat/completions', '/v1', 404, 'h:1')!);
    expect(lines).toHaveLength(2);
    now = 60_000;
    hints.warn(hint);
    expect(lines).toHaveLength(3);
    expect(lines[2]).toMatchObject({ level: 'warn', suppressed_since_last: 4 });
  });
});
