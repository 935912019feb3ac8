import { loadConfig } from '../../../src/config/load';
import type { CallStartRecord } from '../../../src/model/records';
import { SequenceCounter } from '../../../src/model/sequence';
import { createLlmProxy } from '../../../src/receivers/llm-proxy/proxy';
import { silentLogger } from '../../../src/telemetry/logger';
import { createMetrics } from '../../../src/telemetry/metrics';
import { startFakeModelServer } from '../../support/fake-model-server';

describe('call sequence numbers', () => {
  it('count calls per rollout, and keep nothing for the rollout ids the sidecar makes up for uncorrelated calls', async () => {
    const upstream = await startFakeModelServer();
    const config = loadConfig({ env: {}, overrides: { receivers: { llm_proxy: { endpoint: '127.0.0.1:0', upstream_url: upstream.url } } } });
    const sequences = new SequenceCounter();
    const starts: CallStartRecord[] = [];
    const proxy = createLlmProxy(config.receivers.llm_proxy, {
      logger: silentLogger,
      metrics: createMetrics(),
      sequences,
      capture: {
        callStarted: (r) => starts.push(r),
        body: () => true,
        restartBody: () => {},
        bodyFlush: () => true,
        callEnded: () => {},
        flush: () => {},
        afterWrite: (then) => then(),
        writeSoon: () => {},
        beforeWrite: (then) => then(),
        read: () => Buffer.alloc(0),
      },
    });
    await proxy.start();
    try {
      const call = async (headers: Record<string, string>) => {
        const res = await fetch(`http://127.0.0.1:${proxy.port()}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...headers },
          body: '{"model":"m","messages":[]}',
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
      };
      for (let i = 0; i < 3; i++) await call({ 'x-rollout-id': 'r-1' });
      for (let i = 0; i < 5; i++) await call({});
      expect(starts.slice(0, 3).map((s) => [s.correlation.rolloutId, s.seq])).toEqual([
        ['r-1', 0],
        ['r-1', 1],
        ['r-1', 2],
      ]);
      const made = starts.slice(3);
      expect(made.every((s) => s.correlation.source === 'self' && s.seq === 0)).toBe(true);
      expect(new Set(made.map((s) => s.correlation.rolloutId)).size).toBe(5);
      expect(sequences.size).toBe(1);
    } finally {
      await proxy.shutdown(1000);
      await upstream.close();
    }
  });
});
