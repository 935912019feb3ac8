import { mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config/load';
import type { TransitionRecord } from '../../src/model/records';
import { CallCapture } from '../../src/receivers/llm-proxy/capture';
import { createPipeline, type Pipeline } from '../../src/service/pipeline';
import { silentLogger } from '../../src/telemetry/logger';
import { createMetrics } from '../../src/telemetry/metrics';
import { memoryExporter } from '../support/memory-exporter';
import { until } from '../support/pipeline-calls';

/**
 * A call that names no rollout is a rollout of its own (`call-<uuid>`): nothing can name it again,
 * so its episode closes when the call ends (its end record applies right after the proxy is done with
 * the call), by its own record (no close marker), and is exported
 * in the batch of episodes that closed around it, built from bodies still in memory.
 */

function start(dataDir: string, exported: { t: TransitionRecord; request: string; response: string }[], fail = false): Pipeline {
  const config = loadConfig({
    env: {},
    overrides: {
      service: { data_dir: dataDir, journal: { fsync: 'never' } },
      processors: { episodes: { idle_timeout_ms: 3_600_000 } },
    },
  });
  return createPipeline(config, {
    logger: silentLogger,
    metrics: createMetrics(),
    exporter: memoryExporter((batch, read) => {
      if (fail) throw new Error('the trainer is away');
      for (const c of batch)
        for (const t of c.transitions) exported.push({ t, request: read(t.source!.request).toString(), response: read(t.source!.response).toString() });
    }),
  });
}

function call(p: Pipeline, n: number): CallCapture {
  const c = new CallCapture(
    'chat.completions',
    { rolloutId: `call-${n}`, attemptId: '0', groupId: null, agentName: null, source: 'self' },
    0,
    null,
    null,
    Date.now(),
    1 << 20,
    p.capture,
  );
  c.callId = p.capture.callStarted({ type: 'call_start', correlation: c.correlation, seq: 0, traceId: null, at: Date.now() });
  c.request(Buffer.from(`{"model":"m","messages":[{"role":"user","content":"q${n}"}]}`));
  c.responseStatus = 200;
  c.response(Buffer.from(`{"id":"c${n}","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a${n}"},"finish_reason":"stop"}]}`));
  p.capture.callEnded(c.finish({ status: 'ok', error: null, endedAt: Date.now(), endedMono: performance.now() }, 0));
  return c;
}

describe('one-call rollouts', () => {
  it('close when their call ends, and are exported together with their bodies, without any close marker', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-one-call-'));
    const exported: { t: TransitionRecord; request: string; response: string }[] = [];
    const p = start(dir, exported);
    await p.start();
    const next = p.journal.next;
    for (let n = 0; n < 5; n++) call(p, n);
    // A call's end applies once the proxy is done with the call (a microtask after it), and
    // before any later record: each call's start applied the end before it.
    expect(p.assembler.openCount).toBe(1);
    await Promise.resolve();
    expect(p.assembler.openCount).toBe(0);
    await until(() => exported.length === 5);
    expect(exported.map((e) => [e.t.rollout_id, e.t.episode_status, e.t.is_last, e.request.includes(`q${e.t.rollout_id.slice(5)}`)])).toEqual(
      [0, 1, 2, 3, 4].map((n) => [`call-${n}`, 'completed', true, true]),
    );
    expect(exported[0].response).toContain('"a0"');
    // Five calls: a start and an end record and two body frames each, then one delivery marker; no close markers.
    expect(p.journal.next - next).toBe(5 * 4 + 1);
    await p.shutdown();
  });

  it('are exported once across restarts: again when a crash came before their delivery, not after it', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-one-call-'));
    const none: { t: TransitionRecord; request: string; response: string }[] = [];
    const down = start(dir, none, true);
    await down.start();
    call(down, 1);
    call(down, 2);
    await new Promise((r) => setTimeout(r, 50));
    // The exporter never took them; the process stops with them still in the journal.
    await down.shutdown();
    expect(none).toHaveLength(0);

    const exported: { t: TransitionRecord; request: string; response: string }[] = [];
    const up = start(dir, exported);
    await up.start();
    await until(() => exported.length === 2);
    expect(exported.map((e) => [e.t.transition_id, e.response.includes(`"a${e.t.rollout_id.slice(5)}"`)])).toEqual([
      ['call-1/0/0', true],
      ['call-2/0/0', true],
    ]);
    call(up, 3);
    await until(() => exported.length === 3);
    await up.shutdown();

    const again: { t: TransitionRecord; request: string; response: string }[] = [];
    const third = start(dir, again);
    await third.start();
    await new Promise((r) => setTimeout(r, 100));
    expect(again).toHaveLength(0);
    expect(third.assembler.openCount).toBe(0);
    await third.shutdown();
  });

  it('quarantines an episode that cannot be built and exports the others', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-one-call-'));
    const exported: { t: TransitionRecord; request: string; response: string }[] = [];
    const p = start(dir, exported);
    await p.start();
    call(p, 1);
    // A call record whose bodies are not frame lists (a record no proxy writes): extraction throws.
    const at = Date.now();
    await p.submit({
      type: 'call',
      correlation: { rolloutId: 'call-bad', attemptId: '0', groupId: null, agentName: null, source: 'self' },
      seq: 0,
      api: 'chat.completions',
      traceId: null,
      spanId: null,
      bodies: { request: null, response: [], encoding: null } as unknown as { request: number[]; response: number[]; encoding: null },
      streamed: false,
      status: 'ok',
      httpStatus: 200,
      error: null,
      injected: [],
      truncated: false,
      startedAt: at,
      endedAt: at,
      latencyMs: 0,
      ttftMs: null,
    });
    call(p, 2);
    await until(() => exported.length === 2);
    expect(exported.map((e) => e.t.rollout_id)).toEqual(['call-1', 'call-2']);
    const quarantined = readFileSync(path.join(dir, 'quarantine', 'records.ndjson'), 'utf8');
    expect(quarantined).toContain('call-bad');
    await p.shutdown();
  });
});
