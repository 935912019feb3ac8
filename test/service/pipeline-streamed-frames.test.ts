import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config/load';
import type { CallRecord, Correlation } from '../../src/model/records';
import { CallCapture } from '../../src/receivers/llm-proxy/capture';
import { createPipeline, type Pipeline } from '../../src/service/pipeline';
import { silentLogger } from '../../src/telemetry/logger';
import { createMetrics } from '../../src/telemetry/metrics';
import { memoryExporter } from '../support/memory-exporter';

/**
 * A streamed answer's chunks are handed to the journal together right before each write: one
 * body frame for the chunks of a write, not one a chunk, with the same bytes read back, and
 * every chunk in the file within the lazy window even while the answer goes on.
 */

function start(dataDir: string): Pipeline {
  const config = loadConfig({
    env: {},
    overrides: { service: { data_dir: dataDir, journal: { fsync: 'never' } }, processors: { episodes: { idle_timeout_ms: 3_600_000 } } },
  });
  return createPipeline(config, { logger: silentLogger, metrics: createMetrics(), exporter: memoryExporter(() => {}) });
}

const chunk = (n: number, i: number) =>
  Buffer.from(
    `data: {"id":"s${n}","object":"chat.completion.chunk","model":"m",${i === 0 ? '"prompt_token_ids":[1,2,3],' : ''}"choices":[{"index":0,"delta":{"content":"w${n}-${i}"},"token_ids":[${100 + i}]}]}\n\n`,
  );
const turn = () => new Promise((r) => setImmediate(r));
const segmentsText = (dir: string) =>
  readdirSync(path.join(dir, 'journal'))
    .filter((f) => f.endsWith('.seg'))
    .map((f) => readFileSync(path.join(dir, 'journal', f), 'latin1'))
    .join('');

async function stream(p: Pipeline, dir: string, n: number, correlation: Correlation): Promise<{ record: CallRecord; sent: Buffer }> {
  const c = new CallCapture('chat.completions', correlation, 0, null, null, Date.now(), 1 << 20, p.capture);
  c.request(Buffer.from(`{"model":"m","stream":true,"messages":[{"role":"user","content":"q${n}"}]}`));
  c.responseStatus = 200;
  c.streamed = true;
  const sent: Buffer[] = [];
  for (let i = 0; i < 50; i++) {
    const b = chunk(n, i);
    sent.push(b);
    c.response(b);
    // Ten chunks a turn of the event loop; the journal writes at the end of the first one (the
    // answer began) and then lazily.
    if (i % 10 === 9) await turn();
  }
  // The answer is not over, yet what the agent got is in the file within the lazy window.
  await new Promise((r) => setTimeout(r, 60));
  expect(segmentsText(dir)).toContain(`"w${n}-49"`);
  const done = Buffer.from('data: [DONE]\n\n');
  sent.push(done);
  c.response(done);
  const record = c.finish({ status: 'ok', error: null, endedAt: Date.now(), endedMono: performance.now() }, 0);
  p.capture.callEnded(record);
  return { record, sent: Buffer.concat(sent) };
}

describe('streamed answers in the journal', () => {
  it.each([
    ['a call that names no rollout', { rolloutId: 'call-x', attemptId: '0', groupId: null, agentName: null, source: 'self' } as Correlation],
    ['a rollout call (compared with its base)', { rolloutId: 'r1', attemptId: '0', groupId: null, agentName: null, source: 'header' } as Correlation],
  ])('%s: one frame per write, not per chunk, the same bytes read back', async (_name, correlation) => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-stream-frames-'));
    const p = start(dir);
    await p.start();
    const { record, sent } = await stream(p, dir, 1, correlation);
    const frames = record.bodies!.response;
    expect(frames.length).toBeGreaterThan(0);
    expect(frames.length).toBeLessThanOrEqual(6);
    expect(p.capture.read(frames).equals(sent)).toBe(true);
    await p.shutdown();
  });

  it('a rollout’s second streamed answer reads back whole too (its base is the first)', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-stream-frames-'));
    const p = start(dir);
    await p.start();
    const correlation: Correlation = { rolloutId: 'r2', attemptId: '0', groupId: null, agentName: null, source: 'header' };
    await stream(p, dir, 1, correlation);
    const { record, sent } = await stream(p, dir, 2, correlation);
    expect(p.capture.read(record.bodies!.response).equals(sent)).toBe(true);
    await p.shutdown();
  });
});

describe('a request sent in pieces (fields added between the agent’s bytes)', () => {
  const pieces = [Buffer.from('{'), Buffer.from('"return_token_ids":true,"logprobs":true,'), Buffer.alloc(0), Buffer.from('"model":"m","messages":[]}')];
  const self: Correlation = { rolloutId: 'call-y', attemptId: '0', groupId: null, agentName: null, source: 'self' };

  it.each([
    ['a call that names no rollout', self],
    ['a rollout call (compared with its base)', { rolloutId: 'r3', attemptId: '0', groupId: null, agentName: null, source: 'header' } as Correlation],
  ])('%s: one body frame for the pieces of a write, the same bytes read back', async (_name, correlation) => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-request-frames-'));
    const p = start(dir);
    await p.start();
    const c = new CallCapture('chat.completions', correlation, 0, null, null, Date.now(), 1 << 20, p.capture);
    c.requestParts(pieces);
    c.responseStatus = 200;
    c.response(Buffer.from('{"choices":[]}'));
    const record = c.finish({ status: 'ok', error: null, endedAt: Date.now(), endedMono: performance.now() }, 0);
    p.capture.callEnded(record);
    expect(record.bodies!.request).toHaveLength(1);
    expect(p.capture.read(record.bodies!.request).equals(Buffer.concat(pieces))).toBe(true);
    expect(record.truncated).toBe(false);
    await p.shutdown();
  });

  it('the capture cap keeps the whole pieces that fit, and marks the record cut', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-request-frames-'));
    const p = start(dir);
    await p.start();
    // Room for the first two pieces (41 bytes), not the third.
    const c = new CallCapture('chat.completions', self, 0, null, null, Date.now(), 45, p.capture);
    c.requestParts(pieces);
    c.responseStatus = 200;
    c.response(Buffer.from('{}'));
    const record = c.finish({ status: 'ok', error: null, endedAt: Date.now(), endedMono: performance.now() }, 0);
    p.capture.callEnded(record);
    expect(p.capture.read(record.bodies!.request).toString()).toBe('{"return_token_ids":true,"logprobs":true,');
    expect(record.truncated).toBe(true);
    expect(record.bodies!.response).toHaveLength(0);
    await p.shutdown();
  });
});
