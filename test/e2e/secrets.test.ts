import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

const SECRETS = ['sk-openai-SECRET-0001', 'sk-ant-SECRET-0002', 'cookie-SECRET-0003', 'azure-SECRET-0004'];

function encodings(s: string): string[] {
  return [s, Buffer.from(s).toString('base64'), Buffer.from(`Bearer ${s}`).toString('base64'), JSON.stringify(s).slice(1, -1), encodeURIComponent(s)];
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = path.join(dir, f);
    return statSync(p).isDirectory() ? filesUnder(p) : [p];
  });
}

describe('secrets', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm' } } });
  });
  afterAll(async () => {
    await upstream.close();
  });

  it('never reach a record, a file or a log line, while the upstream still gets them', async () => {
    const openai = new OpenAI({
      baseURL: `${sidecar.origin}/rollout/sec/v1`,
      apiKey: SECRETS[0],
      maxRetries: 0,
      defaultHeaders: { cookie: `session=${SECRETS[2]}`, 'api-key': SECRETS[3] },
    });
    await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
    const s = await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true });
    for await (const _ of s) void _;
    const anthropic = new Anthropic({ baseURL: `${sidecar.origin}/rollout/sec`, apiKey: SECRETS[1], maxRetries: 0 });
    await anthropic.messages.create({ model: 'c', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] });
    // An upstream failure and a refused id write error records and logs too.
    await openai.chat.completions.create({ model: 'm', messages: [] }, { headers: { 'x-rollout-id': 'bad id' } }).catch(() => {});
    await postReward(sidecar.origin, 'sec', 1);
    await sidecar.waitForEpisodes(1);
    await sidecar.stop();

    expect(upstream.requests[0].headers.authorization).toBe(`Bearer ${SECRETS[0]}`);
    expect(upstream.requests[0].headers['api-key']).toBe(SECRETS[3]);
    const files = filesUnder(sidecar.dataDir);
    expect(files.length).toBeGreaterThanOrEqual(2);
    const written = files.map((f) => readFileSync(f, 'latin1')).join('\n') + sidecar.logs.join('');
    expect(written).toContain('sec/0/0'); // the scan looks at real output
    for (const secret of SECRETS) for (const form of encodings(secret)) expect(written).not.toContain(form);
  });
});
