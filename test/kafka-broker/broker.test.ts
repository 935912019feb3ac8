import { execFileSync } from 'node:child_process';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { CompressionTypes, Kafka, logLevel } from 'kafkajs';
import { API, ERR, startKafkaTestBroker, type KafkaTestBroker } from '../support/kafka-broker';

const run = promisify(execFile);
let broker: KafkaTestBroker;
const kafka = () =>
  new Kafka({ clientId: 'broker-test', brokers: broker.brokers, logLevel: logLevel.NOTHING, retry: { retries: 8, initialRetryTime: 50, maxRetryTime: 500 } });

beforeEach(async () => {
  broker = await startKafkaTestBroker({ defaultPartitions: 2, maxMessageBytes: 64 * 1024 });
});
afterEach(() => broker.close());

describe('Kafka test broker with kafkajs', () => {
  it('creates topics and answers metadata for the admin client', async () => {
    const admin = kafka().admin();
    await admin.connect();
    expect(await admin.createTopics({ topics: [{ topic: 't1', numPartitions: 3 }] })).toBe(true);
    expect(await admin.listTopics()).toContain('t1');
    const md = await admin.fetchTopicMetadata({ topics: ['t1'] });
    expect(md.topics[0].partitions).toHaveLength(3);
    await admin.disconnect();
  });

  it.each([CompressionTypes.None, CompressionTypes.GZIP])(
    'round-trips keys, values and headers through an idempotent producer and a group consumer (compression %s)',
    async (compression) => {
      const k = kafka();
      const producer = k.producer({ idempotent: true, maxInFlightRequests: 1 });
      await producer.connect();
      const messages = Array.from({ length: 20 }, (_, i) => ({ key: `k${i % 3}`, value: `value-${i}`, headers: { n: String(i) } }));
      await producer.send({ topic: 'rt', acks: -1, compression, messages });
      await producer.disconnect();
      expect(broker.records('rt')).toHaveLength(20);

      const consumer = k.consumer({ groupId: 'g1', maxWaitTimeInMs: 100 });
      await consumer.connect();
      await consumer.subscribe({ topic: 'rt', fromBeginning: true });
      const got: { key: string; value: string; n: string; partition: number; offset: string }[] = [];
      await new Promise<void>((resolve) => {
        void consumer.run({
          eachMessage: async ({ message, partition }) => {
            got.push({ key: message.key!.toString(), value: message.value!.toString(), n: message.headers!.n!.toString(), partition, offset: message.offset });
            if (got.length === 20) resolve();
          },
        });
      });
      await consumer.disconnect();
      expect(got.map((g) => g.value).sort()).toEqual(messages.map((m) => m.value).sort());
      // Same key, same partition, in order.
      for (const key of ['k0', 'k1', 'k2']) {
        const mine = got.filter((g) => g.key === key);
        expect(new Set(mine.map((g) => g.partition)).size).toBe(1);
        expect(mine.map((g) => Number(g.n))).toEqual([...mine.map((g) => Number(g.n))].sort((a, b) => a - b));
      }
    },
  );

  it('resumes a restarted consumer from its committed offset', async () => {
    const k = kafka();
    const producer = k.producer();
    await producer.connect();
    await broker.createTopic('resume', 1);
    await producer.send({ topic: 'resume', messages: Array.from({ length: 5 }, (_, i) => ({ value: `a${i}` })) });
    const consume = async (expect: number): Promise<string[]> => {
      const c = k.consumer({ groupId: 'resumers', maxWaitTimeInMs: 100 });
      await c.connect();
      await c.subscribe({ topic: 'resume', fromBeginning: true });
      const seen: string[] = [];
      await new Promise<void>((resolve) => {
        void c.run({
          eachMessage: async ({ message }) => {
            seen.push(message.value!.toString());
            if (seen.length === expect) resolve();
          },
        });
      });
      await c.disconnect();
      return seen;
    };
    expect(await consume(5)).toEqual(['a0', 'a1', 'a2', 'a3', 'a4']);
    await producer.send({ topic: 'resume', messages: [{ value: 'b0' }, { value: 'b1' }] });
    expect(await consume(2)).toEqual(['b0', 'b1']);
    await producer.disconnect();
  });

  it('refuses a batch above the max message size with MESSAGE_TOO_LARGE', async () => {
    const producer = kafka().producer();
    await producer.connect();
    await expect(producer.send({ topic: 'big', messages: [{ value: Buffer.alloc(100 * 1024, 1) }] })).rejects.toMatchObject({ type: 'MESSAGE_TOO_LARGE' });
    await producer.disconnect();
  });

  it('injected retriable errors are retried by kafkajs and records arrive exactly once with idempotence', async () => {
    const producer = kafka().producer({ idempotent: true, maxInFlightRequests: 1 });
    await producer.connect();
    broker.failNext(API.Produce, ERR.NOT_LEADER_OR_FOLLOWER, 2);
    await producer.send({ topic: 'flaky', acks: -1, messages: [{ key: 'a', value: 'once' }] });
    broker.setErrorRate(API.Produce, ERR.REQUEST_TIMED_OUT, 0.5);
    const before = broker.requestCounts.get(API.Produce) ?? 0;
    for (let i = 0; i < 10; i++) await producer.send({ topic: 'flaky', acks: -1, messages: [{ key: 'a', value: `m${i}` }] });
    broker.setErrorRate(API.Produce, ERR.REQUEST_TIMED_OUT, 0);
    const produced = (broker.requestCounts.get(API.Produce) ?? 0) - before;
    await producer.disconnect();
    expect(produced).toBeGreaterThan(12); // some of the ten sends were refused and sent again
    expect(broker.records('flaky').map((r) => r.value!.toString())).toEqual(['once', ...Array.from({ length: 10 }, (_, i) => `m${i}`)]);
  });

  it('keeps its records across stop/start on the same port while a producer retries', async () => {
    const producer = kafka().producer({ idempotent: true, maxInFlightRequests: 1 });
    await producer.connect();
    await producer.send({ topic: 'bounce', messages: [{ value: 'before' }] });
    const port = broker.port;
    await broker.stop();
    const sending = producer.send({ topic: 'bounce', messages: [{ value: 'during' }] });
    await new Promise((r) => setTimeout(r, 200));
    await broker.start();
    await sending;
    expect(broker.port).toBe(port);
    expect(broker.records('bounce').map((r) => r.value!.toString())).toEqual(['before', 'during']);
    await producer.disconnect();
  });

  it('recordsSince hands each record of every partition out once, as the topic grows', async () => {
    expect(broker.createTopic('grow', 2)).toBe(true);
    const producer = kafka().producer();
    await producer.connect();
    const cursor: number[] = [];
    const seen: string[] = [];
    const poll = () => seen.push(...broker.recordsSince('grow', cursor).map((r) => r.value!.toString()));
    poll();
    expect(seen).toEqual([]);
    await producer.send({
      topic: 'grow',
      messages: [
        { partition: 0, value: 'a1' },
        { partition: 1, value: 'b1' },
      ],
    });
    poll();
    await producer.send({
      topic: 'grow',
      messages: [
        { partition: 0, value: 'a2' },
        { partition: 1, value: 'b2' },
        { partition: 1, value: 'c1' },
      ],
    });
    poll();
    poll();
    await producer.disconnect();
    expect(new Set(broker.records('grow').map((r) => r.partition)).size).toBe(2);
    expect(seen.sort()).toEqual(['a1', 'a2', 'b1', 'b2', 'c1']);
    expect(cursor).toHaveLength(2);
  });
});

const kcat = (() => {
  try {
    execFileSync('kcat', ['-V'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

(kcat ? describe : describe.skip)(`interop with kcat (librdkafka)${kcat ? '' : ': skipped, kcat is not installed'}`, () => {
  it('kcat consumes what kafkajs produced', async () => {
    const producer = kafka().producer();
    await producer.connect();
    await broker.createTopic('kc', 1);
    await producer.send({
      topic: 'kc',
      compression: CompressionTypes.GZIP,
      messages: [
        { key: 'k1', value: 'hello' },
        { key: 'k2', value: 'world' },
      ],
    });
    await producer.disconnect();
    const { stdout } = await run(
      'kcat',
      ['-C', '-b', broker.brokers[0], '-t', 'kc', '-e', '-o', 'beginning', '-f', '%k %s\\n', '-X', 'api.version.request=true'],
      { timeout: 15_000 },
    );
    expect(stdout.trim().split('\n')).toEqual(['k1 hello', 'k2 world']);
  });
});
