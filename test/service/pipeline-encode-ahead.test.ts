import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, writeFileSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { configSchema } from '../../src/config/schema';
import { isEncoded, type Exporter } from '../../src/exporters/exporter';
import { createKafkaExporter } from '../../src/exporters/kafka/kafka-exporter';
import type { OutMessage, Producer, SendResult } from '../../src/exporters/kafka/producer';
import type { Pipeline } from '../../src/service/pipeline';
import { silentLogger } from '../../src/telemetry/logger';
import { createMetrics, type Metrics } from '../../src/telemetry/metrics';
import { beginCall, chatAnswer, endCall, startPipeline, tempDirs, until } from '../support/pipeline-calls';

/**
 * While the Kafka exporter is away (its exports fail, or one hangs in the client's retries),
 * closed episodes are encoded as they will be sent and wait on disk: once the broker is back the
 * drain only sends bytes. What arrives is what an export without the wait would have sent, once,
 * in close order.
 */

/** A producer whose broker is away until `up`; while `hang`, a send waits for the broker instead of failing. */
class Broker implements Producer {
  up = false;
  hang = false;
  connected = true;
  sent: { topic: string; messages: OutMessage[] }[] = [];
  private waiting: (() => void)[] = [];
  async connect(): Promise<void> {}
  async send(topic: string, messages: OutMessage[]): Promise<SendResult> {
    while (!this.up && this.hang) await new Promise<void>((r) => this.waiting.push(r));
    if (!this.up) return { status: 'retryable', error: new Error('broker away') };
    this.sent.push({ topic, messages });
    return { status: 'success' };
  }
  back(): void {
    this.up = true;
    for (const w of this.waiting.splice(0)) w();
  }
  async disconnect(): Promise<void> {}
  /** Transitions' rollout ids and requests in the order they arrived. */
  transitions(): { rollout: string; request: string }[] {
    return this.sent
      .filter((s) => s.topic === 'lightning.transitions')
      .flatMap((s) => s.messages.map((m) => JSON.parse(m.value.toString('utf8'))))
      .map((t) => ({ rollout: t.rollout_id, request: t.request.messages[0].content }));
  }
}

/** The Kafka exporter over `broker`, counting the episodes it was given encoded ahead. */
function kafka(broker: Broker, metrics: Metrics): { exporter: Exporter; encoded: () => number; built: () => number } {
  const config = configSchema.parse({ exporters: { kafka: { brokers: ['127.0.0.1:9'] } } }).exporters.kafka;
  const inner = createKafkaExporter(config, {
    records: 'both',
    producer: broker,
    logger: silentLogger,
    metrics,
    deadLetterDir: path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-dl-')), 'dead-letter'),
  });
  let encoded = 0;
  let built = 0;
  const exporter: Exporter = {
    name: inner.name,
    start: () => inner.start(),
    shutdown: () => inner.shutdown(),
    encodeAhead: (c, read, write) => inner.encodeAhead!(c, read, write),
    async export(batch, read) {
      await inner.export(batch, read);
      // Counted once delivered (a failed attempt is tried again).
      for (const item of batch)
        if (isEncoded(item)) encoded++;
        else built++;
    },
  };
  return { exporter, encoded: () => encoded, built: () => built };
}

async function rollouts(p: Pipeline, from: number, to: number): Promise<void> {
  for (let i = from; i < to; i++) {
    const c = beginCall(p, `r${i}`, 0, `question ${i}`);
    c.response(chatAnswer(`answer ${i}`));
    endCall(p, c);
    await p.submit({ type: 'reward', rolloutId: `r${i}`, attemptId: '0', name: 'final', value: 1, final: true, at: Date.now(), source: 'rollout_api' });
  }
}

const gauge = async (m: Metrics, name: string): Promise<number> => {
  const metric = await m.registry.getSingleMetric(name)?.get();
  return metric?.values[0]?.value ?? NaN;
};

/** Polls an async `check` until it holds or `ms` pass (the caller's next assertion says which). */
async function untilAsync(check: () => Promise<boolean>, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check()) && Date.now() < end) await new Promise((r) => setTimeout(r, 5));
}

/** Polls a gauge until it is above 0 and the same 100 ms apart (or 10 s pass); its last value. */
async function untilSettled(m: Metrics, name: string): Promise<number> {
  let last = -1;
  await untilAsync(async () => {
    const now = await gauge(m, name);
    const settled = now > 0 && now === last;
    last = now;
    await new Promise((r) => setTimeout(r, 100));
    return settled;
  }, 10_000);
  return last;
}

const spillFiles = (d: string) => (existsSync(path.join(d, 'spill')) ? readdirSync(path.join(d, 'spill')) : []);

describe('a backlog encoded ahead while the Kafka exporter is away', () => {
  const { dir, remove } = tempDirs('lightning-ahead-');
  afterAll(remove);

  const expectAll = (broker: Broker, n: number) => {
    const got = broker.transitions();
    expect(got.map((t) => t.rollout)).toEqual(Array.from({ length: n }, (_, i) => `r${i}`));
    expect(got.map((t) => t.request)).toEqual(Array.from({ length: n }, (_, i) => `question ${i}`));
    // Every episode summary once, after its transitions.
    const episodes = broker.sent
      .filter((s) => s.topic === 'lightning.episodes')
      .flatMap((s) => s.messages.map((m) => JSON.parse(m.value.toString()).rollout_id));
    expect(episodes).toEqual(Array.from({ length: n }, (_, i) => `r${i}`));
  };

  it('exports fail: every waiting episode is encoded on disk, then sent as it would have been, once, in order', async () => {
    const d = dir();
    const broker = new Broker();
    const metrics = createMetrics();
    const k = kafka(broker, metrics);
    // A memory budget the closes overrun at once: most go to disk as facts first, and are read
    // back and encoded while the broker is away.
    const p = startPipeline(d, {}, () => {}, { export_backlog_memory_records: 10 }, { exporter: k.exporter, metrics });
    await p.start();
    const n = 300;
    try {
      await rollouts(p, 0, n);
      // All of it waits on disk, encoded: nothing of the backlog is left in memory. (On disk as
      // facts counts as spilled too: the encoding is done once its bytes stop growing.)
      await untilAsync(async () => (await gauge(metrics, 'lightning_sidecar_export_backlog_spilled_records')) === 2 * n, 10_000);
      await untilSettled(metrics, 'lightning_sidecar_export_backlog_encoded_bytes');
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_spilled_records')).toBe(2 * n);
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_encoded_bytes')).toBeGreaterThan(n * 500);
      expect(spillFiles(d).length).toBeGreaterThan(0);
      broker.back();
      await until(() => broker.transitions().length >= n, 20_000);
      await until(() => k.encoded() + k.built() >= n, 5000);
      expectAll(broker, n);
      expect([k.encoded(), k.built()]).toEqual([n, 0]);
      await until(() => spillFiles(d).length === 0);
      expect(spillFiles(d)).toEqual([]);
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_encoded_bytes')).toBe(0);
    } finally {
      await p.shutdown();
    }
  });

  it('an export that hangs in the client: what waits behind it is encoded meanwhile', async () => {
    const d = dir();
    const broker = new Broker();
    broker.hang = true;
    const metrics = createMetrics();
    const k = kafka(broker, metrics);
    const p = startPipeline(d, {}, () => {}, {}, { exporter: k.exporter, metrics });
    await p.start();
    const n = 200;
    try {
      await rollouts(p, 0, n);
      // Everything but the batch under way (at most 64 episodes of 2 records) waits on disk, encoded.
      await untilAsync(async () => (await gauge(metrics, 'lightning_sidecar_export_backlog_spilled_records')) >= 2 * (n - 64), 10_000);
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_spilled_records')).toBeGreaterThanOrEqual(2 * (n - 64));
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_encoded_bytes')).toBeGreaterThan(0);
      broker.back();
      await until(() => k.encoded() + k.built() >= n, 20_000);
      expectAll(broker, n);
      // The first batch was under way when the export hung: built; the rest was encoded.
      expect(k.built()).toBeGreaterThan(0);
      expect(k.encoded()).toBeGreaterThanOrEqual(n - 64);
      await until(() => spillFiles(d).length === 0);
      expect(spillFiles(d)).toEqual([]);
    } finally {
      await p.shutdown();
    }
  });

  it('past export_backlog_encoded_bytes the rest waits as facts and is built when sent', async () => {
    const d = dir();
    const broker = new Broker();
    const metrics = createMetrics();
    const k = kafka(broker, metrics);
    // Room for a few episodes' records (~1.6 KB each).
    const p = startPipeline(d, {}, () => {}, { export_backlog_encoded_bytes: 20_000 }, { exporter: k.exporter, metrics });
    await p.start();
    const n = 300;
    try {
      await rollouts(p, 0, n);
      // Past the budget the head of the queue stays in memory (as when nothing is encoded) and the
      // rest waits on disk as facts: once the backlog on disk stops growing, the writing is done.
      expect(await untilSettled(metrics, 'lightning_sidecar_export_backlog_spilled_records')).toBeGreaterThan(0);
      const bytes = await gauge(metrics, 'lightning_sidecar_export_backlog_encoded_bytes');
      expect(bytes).toBeGreaterThan(0);
      // Encoding stops at the first episode past the budget.
      expect(bytes).toBeLessThan(20_000 + 5000);
      broker.back();
      await until(() => k.encoded() + k.built() >= n, 20_000);
      expectAll(broker, n);
      expect(k.encoded()).toBeGreaterThan(0);
      expect(k.built()).toBeGreaterThan(n / 2);
      await until(() => spillFiles(d).length === 0);
      expect(spillFiles(d)).toEqual([]);
    } finally {
      await p.shutdown();
    }
  });

  it('an episode whose encoded records cannot be read back is quarantined, not retried for ever; the rest goes, in order', async () => {
    const d = dir();
    const broker = new Broker();
    const metrics = createMetrics();
    const k = kafka(broker, metrics);
    const p = startPipeline(d, {}, () => {}, {}, { exporter: k.exporter, metrics });
    await p.start();
    const n = 100;
    try {
      await rollouts(p, 0, n);
      await untilAsync(async () => (await gauge(metrics, 'lightning_sidecar_export_backlog_spilled_records')) === 2 * n, 10_000);
      // The disk goes bad under the first episode's records (its trailer, at its end, still reads).
      const files = spillFiles(d);
      expect(files).toHaveLength(1);
      const fd = openSync(path.join(d, 'spill', files[0]), 'r+');
      writeSync(fd, Buffer.alloc(8, 0xff), 0, 8, 0);
      closeSync(fd);
      broker.back();
      await until(() => k.encoded() >= n - 1, 20_000);
      const got = broker.transitions().map((t) => t.rollout);
      // What of the batch went before the bad records goes again (at least once); nothing of r0.
      expect([...new Set(got)]).toEqual(Array.from({ length: n - 1 }, (_, i) => `r${i + 1}`));
      expect(k.encoded()).toBe(n - 1);
      const quarantined = readFileSync(path.join(d, 'quarantine', 'records.ndjson'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      expect(quarantined).toHaveLength(1);
      expect(quarantined[0].error).toMatch(/cut short/);
      await until(() => spillFiles(d).length === 0);
      expect(spillFiles(d)).toEqual([]);
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_records')).toBe(0);
    } finally {
      await p.shutdown();
    }
  });

  it('a disk that cannot take the backlog: nothing is encoded ahead, episodes wait in memory and are all sent once the broker is back', async () => {
    const d = dir();
    const broker = new Broker();
    const metrics = createMetrics();
    const k = kafka(broker, metrics);
    const p = startPipeline(d, {}, () => {}, {}, { exporter: k.exporter, metrics });
    await p.start();
    // The spill directory cannot be made: a file stands where it would be.
    writeFileSync(path.join(d, 'spill'), 'not a directory');
    const n = 200;
    try {
      await rollouts(p, 0, n);
      await new Promise((r) => setTimeout(r, 300));
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_encoded_bytes')).toBe(0);
      expect(await gauge(metrics, 'lightning_sidecar_export_backlog_records')).toBe(2 * n);
      broker.back();
      await until(() => k.encoded() + k.built() >= n, 20_000);
      expectAll(broker, n);
      expect([k.encoded(), k.built()]).toEqual([0, n]);
    } finally {
      await p.shutdown();
    }
  });
});
