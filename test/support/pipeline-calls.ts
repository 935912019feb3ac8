import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../../src/config/load';
import type { Config } from '../../src/config/schema';
import type { BodyReader } from '../../src/formats/extract';
import type { ClosedEpisode } from '../../src/model/records';
import { CallCapture } from '../../src/receivers/llm-proxy/capture';
import { createPipeline, type Pipeline, type PipelineDeps } from '../../src/service/pipeline';
import { silentLogger } from '../../src/telemetry/logger';
import { createMetrics } from '../../src/telemetry/metrics';
import { memoryExporter } from './memory-exporter';

/**
 * A pipeline on `dataDir` whose exported batches go to `onBatch`, and proxied calls driven through
 * its capture sink the way the proxy drives it (no sockets). Episodes stay open until their end
 * record (no idle timeout within a test, no wait for tool spans); shutdown does not drain them.
 */
export function startPipeline(
  dataDir: string,
  journal: Partial<Config['service']['journal']>,
  onBatch: (batch: ClosedEpisode[], read: BodyReader) => void,
  service: Partial<Omit<Config['service'], 'journal'>> = {},
  deps: Partial<PipelineDeps> = {},
): Pipeline {
  const config = loadConfig({
    env: {},
    overrides: {
      service: { data_dir: dataDir, drain_on_shutdown: false, ...service, journal: { fsync: 'never', ...journal } },
      processors: { episodes: { idle_timeout_ms: 3_600_000, tool_span_wait_ms: 0 } },
    },
  });
  return createPipeline(config, { logger: silentLogger, metrics: createMetrics(), exporter: memoryExporter(onBatch), ...deps });
}

/** A chat call of `rollout` (named by header) whose request was sent and whose answer is about to begin. */
export function beginCall(p: Pipeline, rollout: string, seq: number, question: string): CallCapture {
  const c = new CallCapture(
    'chat.completions',
    { rolloutId: rollout, attemptId: '0', groupId: null, agentName: null, source: 'header' },
    seq,
    null,
    null,
    Date.now(),
    1 << 20,
    p.capture,
  );
  c.begin();
  c.request(Buffer.from(`{"model":"m","messages":[{"role":"user","content":"${question}"}]}`));
  c.responseStatus = 200;
  return c;
}

/** A chat completion's JSON body answering `text`. */
export const chatAnswer = (text: string) =>
  Buffer.from(`{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"${text}"},"finish_reason":"stop"}]}`);

/** The call ends as answered. */
export function endCall(p: Pipeline, c: CallCapture): void {
  p.capture.callEnded(c.finish({ status: 'ok', error: null, endedAt: Date.now(), endedMono: performance.now() }, 0));
}

/** Polls `check` until it holds or `ms` pass (the caller's next assertion says which). */
export async function until(check: () => boolean, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!check() && Date.now() < end) await new Promise((r) => setTimeout(r, 5));
}

/** Temporary directories named `prefix…`, all removed by `remove` (an afterAll). */
export function tempDirs(prefix: string): { dir: () => string; remove: () => void } {
  const dirs: string[] = [];
  return {
    dir: () => {
      const d = mkdtempSync(path.join(os.tmpdir(), prefix));
      dirs.push(d);
      return d;
    },
    remove: () => {
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
    },
  };
}
