import { loadConfig } from '../../../src/config/load';
import { SequenceCounter } from '../../../src/model/sequence';
import { createLlmProxy } from '../../../src/receivers/llm-proxy/proxy';
import { createLogger } from '../../../src/telemetry/logger';
import { createMetrics } from '../../../src/telemetry/metrics';
import { startFakeModelServer } from '../../support/fake-model-server';
import { memoryCapture } from '../../support/memory-capture';

/**
 * How a call's end is written through before the agent gets its last bytes: at once when the call
 * is the only one in flight (nothing could share the write), with the other calls ending in the
 * same turn of the event loop otherwise.
 */
describe('write-through at a call’s end', () => {
  async function setUp(delayMs: number) {
    const upstream = await startFakeModelServer({ delayMs });
    const config = loadConfig({ env: {}, overrides: { receivers: { llm_proxy: { endpoint: '127.0.0.1:0', upstream_url: upstream.url } } } });
    const { sink, ended } = memoryCapture();
    const writes: string[] = [];
    const proxy = createLlmProxy(config.receivers.llm_proxy, {
      logger: createLogger({ level: 'error', write: () => {} }),
      metrics: createMetrics(),
      sequences: new SequenceCounter(),
      capture: {
        ...sink,
        flush: () => void writes.push(`flush after ${ended.length} ended`),
        afterWrite: (then) => {
          writes.push(`shared after ${ended.length} ended`);
          setImmediate(then);
        },
      },
    });
    await proxy.start();
    const call = async (): Promise<string> => {
      const res = await fetch(`http://127.0.0.1:${proxy.port()}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"model":"m","messages":[{"role":"user","content":"hi"}]}',
      });
      expect(res.status).toBe(200);
      return ((await res.json()) as { object: string }).object;
    };
    const close = async () => {
      await proxy.shutdown(1000);
      await upstream.close();
    };
    return { call, writes, ended, close };
  }

  it('writes a lone call through at once, after its end record and before its answer', async () => {
    const t = await setUp(0);
    try {
      expect(await t.call()).toBe('chat.completion');
      // The write came once the end record was in, and the agent had its answer only after it.
      expect(t.writes).toEqual(['flush after 1 ended']);
      expect(await t.call()).toBe('chat.completion');
      expect(t.writes).toEqual(['flush after 1 ended', 'flush after 2 ended']);
    } finally {
      await t.close();
    }
  });

  it('lets calls in flight together share the write of the turn their ends come in', async () => {
    const t = await setUp(50);
    try {
      // Both wait on the model server together: the first to end has the other still in flight.
      expect(await Promise.all([t.call(), t.call()])).toEqual(['chat.completion', 'chat.completion']);
      expect(t.ended).toHaveLength(2);
      expect(t.writes[0]).toBe('shared after 1 ended');
      expect(t.writes).toHaveLength(2);
    } finally {
      await t.close();
    }
  });
});
