import { loadConfig } from '../../../src/config/load';
import { SequenceCounter } from '../../../src/model/sequence';
import { createLlmProxy } from '../../../src/receivers/llm-proxy/proxy';
import { createLogger } from '../../../src/telemetry/logger';
import { createMetrics } from '../../../src/telemetry/metrics';
import { startFakeModelServer } from '../../support/fake-model-server';
import { memoryCapture } from '../../support/memory-capture';

describe('capture failures', () => {
  it('never fail or change the agent’s call; they are counted and logged once', async () => {
    const upstream = await startFakeModelServer();
    const config = loadConfig({ env: {}, overrides: { receivers: { llm_proxy: { endpoint: '127.0.0.1:0', upstream_url: upstream.url } } } });
    const metrics = createMetrics();
    const logs: string[] = [];
    let starts = 0;
    const proxy = createLlmProxy(config.receivers.llm_proxy, {
      logger: createLogger({ level: 'info', write: (l) => logs.push(l) }),
      metrics,
      sequences: new SequenceCounter(),
      capture: {
        // The first three calls fail to register; the next three register and fail at every later step.
        callStarted: () => {
          if (++starts <= 3) throw new Error('pipeline exploded at start');
          return starts;
        },
        body: () => {
          throw new Error('pipeline exploded on a body');
        },
        restartBody: () => {
          throw new Error('pipeline exploded on a restart');
        },
        bodyFlush: () => {
          throw new Error('pipeline exploded on a flush');
        },
        callEnded: () => {
          throw new Error('pipeline exploded at end');
        },
        flush: () => {
          throw new Error('pipeline exploded on flush');
        },
        afterWrite: () => {
          throw new Error('pipeline exploded waiting for a write');
        },
        writeSoon: () => {
          throw new Error('pipeline exploded asked to write');
        },
        beforeWrite: () => {
          throw new Error('pipeline exploded asked to wait for a write');
        },
        read: () => {
          throw new Error('pipeline exploded on read');
        },
      },
    });
    await proxy.start();
    try {
      for (let i = 0; i < 6; i++) {
        const res = await fetch(`http://127.0.0.1:${proxy.port()}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: '{"model":"m","messages":[]}',
        });
        expect(res.status).toBe(200);
        expect(((await res.json()) as { object: string }).object).toBe('chat.completion');
      }
      await new Promise((r) => setImmediate(r));
      expect(await metrics.registry.getSingleMetricAsString('lightning_sidecar_capture_drops_total')).toContain('reason="capture_error"} 6');
      expect(logs.filter((l) => l.includes('capture')).length).toBe(2);
    } finally {
      await proxy.shutdown(1000);
      await upstream.close();
    }
  });

  it('counts bytes the journal refused once, as the journal counted them, not as the capture cap', async () => {
    const upstream = await startFakeModelServer();
    const config = loadConfig({ env: {}, overrides: { receivers: { llm_proxy: { endpoint: '127.0.0.1:0', upstream_url: upstream.url } } } });
    const metrics = createMetrics();
    const { sink, ended } = memoryCapture();
    // The journal took the call's start and then refused its bytes (it reached its cap in between):
    // the sink counts that itself, as the pipeline does (journal_full).
    const proxy = createLlmProxy(config.receivers.llm_proxy, {
      logger: createLogger({ level: 'error', write: () => {} }),
      metrics,
      sequences: new SequenceCounter(),
      capture: { ...sink, body: () => false, bodyFlush: () => false },
    });
    await proxy.start();
    try {
      const res = await fetch(`http://127.0.0.1:${proxy.port()}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"model":"m","messages":[]}',
      });
      expect(res.status).toBe(200);
      await res.json();
      await new Promise((r) => setImmediate(r));
      expect(ended).toHaveLength(1);
      expect(ended[0].truncated).toBe(true);
      expect(await metrics.registry.getSingleMetricAsString('lightning_sidecar_capture_drops_total')).toContain('reason="capture_cap"} 0');
    } finally {
      await proxy.shutdown(1000);
      await upstream.close();
    }
  });
});
