import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config/load';
import type { BodyReader } from '../../src/formats/extract';
import { BLOCK } from '../../src/journal/repeats';
import { CallCapture } from '../../src/receivers/llm-proxy/capture';
import { createPipeline, type Pipeline } from '../../src/service/pipeline';
import { silentLogger } from '../../src/telemetry/logger';
import { createMetrics } from '../../src/telemetry/metrics';
import { memoryExporter } from '../support/memory-exporter';

/**
 * The pipeline's capture sink journals a rollout's bodies as what they add to its previous call.
 * These tests drive it the way the proxy does (through CallCapture) around the edges where a
 * reference could name bytes that are not there: an episode evicted while a call is in flight,
 * more calls in flight than the sink tracks, a failed journal write, the capture cap.
 */

interface Read {
  request: Buffer | Error;
  response: Buffer | Error;
}

function setup(overrides: { max_open_episodes?: number; segment_bytes?: number; max_capture_bytes?: number } = {}) {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-pipeline-repeats-'));
  const config = loadConfig({
    env: {},
    overrides: {
      service: { data_dir: dataDir, journal: { fsync: 'never', segment_bytes: overrides.segment_bytes ?? 64 * 1024 * 1024 } },
      processors: { episodes: { max_open_episodes: overrides.max_open_episodes ?? 100, idle_timeout_ms: 3_600_000 } },
    },
  });
  /** What the exporter read back of every exported call (or the error reading it gave). */
  const exported: Read[] = [];
  const tryRead = (read: BodyReader, frames: readonly number[] | undefined): Buffer | Error => {
    try {
      return Buffer.from(read(frames ?? []));
    } catch (err) {
      return err as Error;
    }
  };
  const pipeline = createPipeline(config, {
    logger: silentLogger,
    metrics: createMetrics(),
    exporter: memoryExporter((batch, read) => {
      for (const c of batch)
        for (const t of c.transitions) exported.push({ request: tryRead(read, t.source?.request), response: tryRead(read, t.source?.response) });
    }),
  });
  return { pipeline, exported, cap: overrides.max_capture_bytes ?? 64 * 1024 * 1024 };
}

let seq = 0;

/** A call of `rolloutId` as the proxy records it; `send` and `answer` are fed in between by the caller. */
function begin(p: Pipeline, rolloutId: string, cap: number): CallCapture {
  const c = new CallCapture(
    'chat.completions',
    { rolloutId, attemptId: '0', groupId: null, agentName: null, source: 'header' },
    seq++,
    null,
    null,
    Date.now(),
    cap,
    p.capture,
  );
  c.callId = p.capture.callStarted({ type: 'call_start', correlation: c.correlation, seq: c.seq, traceId: null, at: Date.now() });
  return c;
}

function end(p: Pipeline, c: CallCapture, response: Buffer): ReturnType<CallCapture['finish']> {
  c.responseStatus = 200;
  c.response(response);
  const record = c.finish({ status: 'ok', error: null, endedAt: Date.now(), endedMono: performance.now() }, 0);
  p.capture.callEnded(record);
  return record;
}

/** A request body of `blocks` whole blocks of the shared history, then `extra` bytes of its own. */
function history(blocks: number, extra: string): Buffer {
  const h = Buffer.alloc(blocks * BLOCK);
  for (let i = 0; i < h.length; i++) h[i] = 97 + ((i * 7 + (i >> 10)) % 26);
  return Buffer.concat([h, Buffer.from(extra)]);
}

const answer = (n: number) => Buffer.from(`{"id":"c${n}","choices":[{"index":0,"message":{"role":"assistant","content":"ok ${n}"},"finish_reason":"stop"}]}`);

const settle = () => new Promise((r) => setTimeout(r, 50));

describe('journaling a rollout’s bodies as what they add to its previous call', () => {
  it('keeps what an in-flight call names when its episode is evicted and exported under it', async () => {
    const { pipeline: p, exported, cap } = setup({ max_open_episodes: 2, segment_bytes: 8 * 1024 });
    await p.start();
    const first = history(6, 'first');
    const a1 = begin(p, 'A', cap);
    a1.request(first);
    end(p, a1, answer(1));
    p.journal.flushNow();
    // The next call of A repeats all of the first: it is held as a reference, not yet written.
    const second = history(6, 'first, then more');
    const a2 = begin(p, 'A', cap);
    a2.request(second.subarray(0, 3 * BLOCK + 10));
    // Two other rollouts push A's episode out (max_open_episodes 2); it is exported and released.
    for (const r of ['B', 'C']) {
      const c = begin(p, r, cap);
      c.request(Buffer.from(`{"rollout":"${r}"}`));
      end(p, c, answer(9));
      p.journal.flushNow();
      await settle();
    }
    expect(exported.length).toBeGreaterThanOrEqual(1);
    a2.request(second.subarray(3 * BLOCK + 10));
    const record = end(p, a2, answer(2));
    p.journal.flushNow();
    await settle();
    expect(p.capture.read(record.bodies!.request).equals(second)).toBe(true);
    await p.shutdown();
    const reads = exported.filter((e) => Buffer.isBuffer(e.request) && e.request.length > BLOCK);
    expect(reads.map((e) => (e.request as Buffer).equals(first) || (e.request as Buffer).equals(second))).toEqual([true, true]);
  });

  it('writes every held byte of every call when more calls are in flight than it tracks', async () => {
    const { pipeline: p, exported, cap } = setup({ max_open_episodes: 2 });
    await p.start();
    const base = history(4, 'zero');
    const a0 = begin(p, 'A', cap);
    a0.request(base);
    end(p, a0, answer(0));
    const bodies = [1, 2, 3, 4].map((n) => history(4, `call ${n}`));
    // Each call's request is held (it repeats the base) before the next call begins.
    const calls = bodies.map((body) => {
      const c = begin(p, 'A', cap);
      c.request(body);
      return c;
    });
    const records = calls.map((c, i) => end(p, c, answer(i + 1)));
    records.forEach((r, i) => expect(p.capture.read(r.bodies!.request).equals(bodies[i])).toBe(true));
    await p.shutdown();
    expect(exported.filter((e) => Buffer.isBuffer(e.request)).length).toBe(5);
  });

  it('does not build on a call whose bytes a failed write lost', async () => {
    const { pipeline: p, exported, cap } = setup();
    await p.start();
    const a1 = begin(p, 'A', cap);
    a1.request(history(5, 'one'));
    end(p, a1, answer(1));
    p.journal.flushNow();
    // The journal cannot write for a moment: the second call's bytes never reach the file.
    const j = p.journal as unknown as { fd: number | null };
    const fd = j.fd;
    j.fd = 1 << 20;
    const a2 = begin(p, 'A', cap);
    // Two whole blocks of its own, which a later call could refer to.
    a2.request(history(7, 'two'));
    end(p, a2, answer(2));
    p.journal.flushNow();
    j.fd = fd;
    expect(p.journal.writeFailures).toBe(1);
    // Writing works again: the third call must not refer to the lost bytes.
    const third = history(7, 'three');
    const a3 = begin(p, 'A', cap);
    a3.request(third);
    const record = end(p, a3, answer(3));
    p.journal.flushNow();
    expect(p.capture.read(record.bodies!.request).equals(third)).toBe(true);
    await p.shutdown();
    expect(exported.some((e) => Buffer.isBuffer(e.request) && e.request.equals(third))).toBe(true);
  });

  it('writes a request sent again (the server refused the first) once its answer begins, not only at the end', async () => {
    const { pipeline: p, cap } = setup();
    await p.start();
    const a1 = begin(p, 'A', cap);
    a1.request(history(4, 'one'));
    end(p, a1, answer(1));
    const a2 = begin(p, 'A', cap);
    a2.request(history(4, 'two, with a field the server refuses'));
    a2.response(Buffer.from('{"error":{"message":"unknown field"}}'));
    a2.restart('request');
    a2.restart('response');
    const resent = history(4, 'two');
    a2.request(resent);
    a2.response(answer(2).subarray(0, 10));
    expect(p.capture.read(a2.requestFrames).equals(resent)).toBe(true);
    end(p, a2, answer(2).subarray(10));
    await p.shutdown();
  });

  it('keeps the held bytes of a body the capture cap cuts, so the record holds its exact prefix', async () => {
    const { pipeline: p, cap } = setup({ max_capture_bytes: 5 * BLOCK });
    await p.start();
    const a1 = begin(p, 'A', cap);
    a1.request(history(4, ''));
    end(p, a1, answer(1));
    const second = history(6, 'longer than the cap');
    const a2 = begin(p, 'A', cap);
    // Three whole blocks match and are held; the next chunk passes the cap.
    a2.request(second.subarray(0, 3 * BLOCK));
    a2.request(second.subarray(3 * BLOCK));
    const record = end(p, a2, answer(2));
    expect(record.truncated).toBe(true);
    expect(p.capture.read(record.bodies!.request).equals(second.subarray(0, 3 * BLOCK))).toBe(true);
    await p.shutdown();
  });
});
