import { mkdtempSync, readdirSync, readFileSync, existsSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import type { EpisodeSummary, Transition } from '../../src/model/records';
import { startChildSidecar } from '../support/child-sidecar';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { renderPrompt } from '../support/fake-tokenizer';

/** The records written so far: complete lines only (the sidecar may be part way through writing a large one). */
function read<T>(dir: string, kind: string): T[] {
  const d = path.join(dir, kind);
  if (!existsSync(d)) return [];
  return readdirSync(d)
    .sort()
    .flatMap((f) => {
      const text = readFileSync(path.join(d, f), 'utf8');
      return text
        .slice(0, text.lastIndexOf('\n') + 1)
        .split('\n')
        .filter(Boolean);
    })
    .map((l) => JSON.parse(l) as T);
}

async function until<T>(fn: () => T | null, ms = 10_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v !== null) return v;
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('crash recovery (child process, SIGKILL)', () => {
  let upstream: FakeModelServer;
  const sidecarEnv = (dataDir: string) => ({
    LIGHTNING_UPSTREAM_URL: upstream.url,
    LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
    LIGHTNING_DATA_DIR: dataDir,
    LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
    LIGHTNING_LOG_LEVEL: 'warn',
  });
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
  });
  afterAll(() => upstream.close());

  it('loses no acknowledged record and no open episode across a SIGKILL, and continues the seq', async () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-crash-'));
    const env = sidecarEnv(dataDir);
    const first = await startChildSidecar(env);
    const ask = (origin: string, rollout: string) =>
      new OpenAI({ baseURL: `${origin}/rollout/${rollout}/v1`, apiKey: 'k', maxRetries: 0 }).chat.completions.create({
        model: 'm',
        messages: [{ role: 'user', content: rollout }],
      });
    await ask(first.origin, 'open-1');
    await ask(first.origin, 'open-1');
    await ask(first.origin, 'closed-1');
    const rewardAck = await fetch(`${first.origin}/lightning/v1/rollouts/closed-1/reward`, { method: 'POST', body: '{"value":0.5}' });
    expect(rewardAck.status).toBe(202);
    const stepAck = await fetch(`${first.origin}/lightning/v1/rollouts/open-1/reward`, { method: 'POST', body: '{"value":0.2,"final":false,"name":"step"}' });
    expect(stepAck.status).toBe(202);
    // Captures are journaled right after the response; give the last one its tick.
    await new Promise((r) => setTimeout(r, 100));
    expect(await first.kill('SIGKILL')).toEqual({ code: null, signal: 'SIGKILL' });

    const second = await startChildSidecar(env);
    try {
      await ask(second.origin, 'open-1');
      expect((await fetch(`${second.origin}/lightning/v1/rollouts/open-1/reward`, { method: 'POST', body: '{"value":1}' })).status).toBe(202);
      const episodes = await until(() => {
        const eps = read<EpisodeSummary>(dataDir, 'episodes');
        return eps.some((e) => e.rollout_id === 'open-1') && eps.some((e) => e.rollout_id === 'closed-1') ? eps : null;
      });
      const byRollout = new Map(episodes.map((e) => [e.rollout_id, e]));
      expect(byRollout.get('open-1')).toMatchObject({
        transition_ids: ['open-1/0/0', 'open-1/0/1', 'open-1/0/2'],
        final_reward: 1,
        rewards: [
          { name: 'step', value: 0.2, final: false },
          { name: 'primary', value: 1, final: true },
        ],
      });
      expect(byRollout.get('closed-1')).toMatchObject({ transition_ids: ['closed-1/0/0'], final_reward: 0.5 });
      const ids = read<Transition>(dataDir, 'transitions').map((t) => t.transition_id);
      expect(new Set(ids)).toEqual(new Set(['open-1/0/0', 'open-1/0/1', 'open-1/0/2', 'closed-1/0/0']));
      // closed-1 was delivered before the kill; its delivered marker keeps the replay from sending it again.
      expect(ids).toHaveLength(4);
    } finally {
      expect((await second.kill('SIGTERM')).code).toBe(0);
    }
  });

  it('exports a growing conversation (each call journaled as what it adds to the one before) byte for byte across a SIGKILL', async () => {
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-crash-grow-'));
    const env = sidecarEnv(dataDir);
    type Message = { role: 'system' | 'user' | 'assistant'; content: string };
    const messages: Message[] = [{ role: 'system', content: 'You are a coding agent.' }];
    const asked: Message[][] = [];
    const turn = async (origin: string, i: number, stream: boolean) => {
      // ~40 KiB more each turn: the requests and the prompt ids in the answers span many blocks.
      messages.push({ role: 'user', content: `turn ${i}: ` + `file line ${i} of the tool's output\n`.repeat(1200) });
      asked.push(messages.map((m) => ({ ...m })));
      const client = new OpenAI({ baseURL: `${origin}/rollout/grow-1/v1`, apiKey: 'k', maxRetries: 0 });
      let answer = '';
      if (stream) {
        for await (const c of await client.chat.completions.create({ model: 'm', messages, stream: true })) answer += c.choices[0]?.delta?.content ?? '';
      } else answer = (await client.chat.completions.create({ model: 'm', messages })).choices[0].message.content ?? '';
      messages.push({ role: 'assistant', content: answer });
    };
    const first = await startChildSidecar(env);
    let sentBytes = 0;
    let journalBytes = 0;
    try {
      for (let i = 0; i < 4; i++) await turn(first.origin, i, i === 2);
      await new Promise((r) => setTimeout(r, 100));
      // Each request resends the history and each answer the prompt's ids: the journal holds
      // far less than those bytes.
      sentBytes = asked.reduce((n, m) => n + JSON.stringify({ model: 'm', messages: m }).length + renderPrompt(m).join(',').length, 0);
      const journal = path.join(dataDir, 'journal');
      journalBytes = readdirSync(journal).reduce((n, f) => n + statSync(path.join(journal, f)).size, 0);
    } finally {
      expect(await first.kill('SIGKILL')).toEqual({ code: null, signal: 'SIGKILL' });
    }
    expect(journalBytes).toBeLessThan(sentBytes * 0.6);
    const second = await startChildSidecar(env);
    try {
      for (let i = 4; i < 7; i++) await turn(second.origin, i, i === 5);
      expect((await fetch(`${second.origin}/lightning/v1/rollouts/grow-1/end`, { method: 'POST', body: '{}' })).status).toBe(202);
      const ts = await until(() => {
        const got = read<Transition>(dataDir, 'transitions').filter((t) => t.rollout_id === 'grow-1');
        return got.length >= 7 ? got : null;
      });
      expect(ts.map((t) => t.transition_id)).toEqual(Array.from({ length: 7 }, (_, i) => `grow-1/0/${i}`));
      for (const [i, t] of ts.entries()) {
        expect(t.status).toBe('ok');
        expect((t.request as { messages: Message[] }).messages).toEqual(asked[i]);
        expect(t.prompt_token_ids).toEqual(renderPrompt(asked[i]));
      }
    } finally {
      expect((await second.kill('SIGTERM')).code).toBe(0);
    }
  });

  it('records a call cut mid-stream by a SIGKILL from its journaled bytes, as aborted, after the restart', async () => {
    const slow = await startFakeModelServer({ flavor: 'vllm', chunkDelayMs: 150 });
    const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-crash-stream-'));
    const env = {
      LIGHTNING_UPSTREAM_URL: slow.url,
      LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
      LIGHTNING_DATA_DIR: dataDir,
      LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
      LIGHTNING_LOG_LEVEL: 'warn',
    };
    const first = await startChildSidecar(env);
    try {
      const res = await fetch(`${first.origin}/rollout/cut-1/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'tell me a long story' }] }),
      });
      const reader = res.body!.getReader();
      let got = '';
      while (!got.includes('\n\n')) got += Buffer.from((await reader.read()).value!).toString();
      // The first events reached the agent; the process dies before the stream ends.
      await new Promise((r) => setTimeout(r, 100));
      expect(await first.kill('SIGKILL')).toEqual({ code: null, signal: 'SIGKILL' });
      await reader.read().catch(() => undefined);
    } finally {
      if (first.proc.exitCode === null && first.proc.signalCode === null) await first.kill('SIGKILL');
    }
    const second = await startChildSidecar(env);
    try {
      expect((await fetch(`${second.origin}/lightning/v1/rollouts/cut-1/end`, { method: 'POST', body: '{}' })).status).toBe(202);
      const [t] = await until(() => {
        const ts = read<Transition>(dataDir, 'transitions').filter((x) => x.rollout_id === 'cut-1');
        return ts.length > 0 ? ts : null;
      });
      expect(t).toMatchObject({
        transition_id: 'cut-1/0/0',
        status: 'aborted',
        streamed: true,
        truncated: true,
        error: expect.stringMatching(/recovered from the journal/),
      });
      // What the agent got is in the record: the prompt's ids came in the first event.
      expect(Array.isArray(t.prompt_token_ids) && t.prompt_token_ids.length).toBeGreaterThan(0);
      expect((t.request as { messages: { content: string }[] }).messages[0].content).toBe('tell me a long story');
      // Exactly once: a second restart does not record it again.
      expect((await second.kill('SIGTERM')).code).toBe(0);
      const third = await startChildSidecar(env);
      await new Promise((r) => setTimeout(r, 300));
      expect((await third.kill('SIGTERM')).code).toBe(0);
      expect(read<Transition>(dataDir, 'transitions').filter((x) => x.rollout_id === 'cut-1')).toHaveLength(1);
    } finally {
      if (second.proc.exitCode === null && second.proc.signalCode === null) await second.kill('SIGTERM');
      await slow.close();
    }
  });
});
