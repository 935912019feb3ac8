import { execFile, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import { deflateRawSync, gunzipSync, gzipSync } from 'node:zlib';
import fc from 'fast-check';
import { gzipInPieces, ONE_THREAD_BELOW, PIECEWISE_GZIP } from '../../../src/exporters/kafka/parallel-gzip';
import { kafkajs } from '../../../src/exporters/kafka/kafkajs-producer';
import { startKafkaTestBroker } from '../../support/kafka-broker';

const run = promisify(execFile);

/** Text of words drawn from a small vocabulary: compresses well, and mostly by matches far back. */
function text(bytes: number, seed: number): Buffer {
  const words = Array.from({ length: 300 }, (_, i) => `w${((i * 7919 + seed) % 9973).toString(36)}`);
  const out: string[] = [];
  let s = seed >>> 0;
  for (let n = 0; n <= bytes;) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    const w = words[s % words.length];
    out.push(w);
    n += w.length + 1;
  }
  return Buffer.from(out.join(' ').slice(0, bytes));
}

describe('gzipInPieces', () => {
  it.each([
    ['empty', 0],
    ['one byte', 1],
    ['a piece and a half (one gzip)', 6144],
    ['just over a piece and a half', 6145],
    ['three pieces and a short tail (joined to the last piece)', 3 * 4096 + 100],
    ['seven and a half pieces', 7 * 4096 + 2048],
  ])('writes one gzip member that gunzip reads back: %s', async (_name, size) => {
    for (const input of [text(size, 1), randomBytes(size)]) {
      const out = await gzipInPieces(input, 6, 4096, 2, 0);
      expect(out.subarray(0, 3)).toEqual(Buffer.from([0x1f, 0x8b, 8]));
      expect(gunzipSync(out).equals(input)).toBe(true);
      // One member: its trailer is the whole input's CRC-32 and size, at the very end.
      expect(out.readUInt32LE(out.length - 4)).toBe(size);
    }
  });

  it('reads back for any input, piece size and number at once', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.uint8Array({ maxLength: 40_000 }),
        fc.integer({ min: 1, max: 9000 }),
        fc.integer({ min: 1, max: 4 }),
        fc.integer({ min: 0, max: 9 }),
        fc.constantFrom(0, ONE_THREAD_BELOW, 1),
        async (bytes, piece, atOnce, level, oneThreadBelow) => {
          const input = Buffer.from(bytes);
          expect(gunzipSync(await gzipInPieces(input, level, piece, atOnce, oneThreadBelow)).equals(input)).toBe(true);
        },
      ),
      { numRuns: 150 },
    );
  });

  it('compresses text about as well as one deflate of the whole', async () => {
    const input = text(64 * 4096, 7);
    // A sync flush is 5 bytes a piece, and each piece's first block brings a Huffman table of its own.
    const pieces = await gzipInPieces(input, 6, 4096, 2);
    expect(pieces.equals(gzipSync(input, { level: 6 }))).toBe(false);
    expect(pieces.length).toBeLessThan(gzipSync(input).length * 1.1);
  });

  it('gives each piece the input before it as its dictionary', async () => {
    // A 6,000-byte block of random text, 40 times: each 4 KiB piece is mostly a match further back.
    const input = Buffer.from(randomBytes(4500).toString('base64').repeat(40));
    const whole = gzipSync(input).length;
    let cold = 0;
    for (let at = 0; at < input.length; at += 4096) cold += deflateRawSync(input.subarray(at, at + 4096)).length;
    expect(cold).toBeGreaterThan(input.length / 2);
    expect((await gzipInPieces(input, 6, 4096, 2, 0)).length).toBeLessThan(whole + 40 * Math.ceil(input.length / 4096));
  });

  it('compresses bytes that compress very well as one zlib.gzip: its first piece decides', async () => {
    // The same 400 characters again and again: the first piece compresses far below a fifth.
    const input = Buffer.from(randomBytes(300).toString('base64').repeat(200));
    expect((await gzipInPieces(input, 6, 4096, 2)).equals(gzipSync(input, { level: 6 }))).toBe(true);
    // Told to use threads whatever the ratio, it compresses in pieces.
    expect((await gzipInPieces(input, 6, 4096, 2, 0)).equals(gzipSync(input, { level: 6 }))).toBe(false);
  });

  it('is the codec kafkajs uses for gzip once the sidecar loads kafkajs, and reads what kafkajs wrote', async () => {
    const k = kafkajs();
    expect(k.CompressionCodecs[k.CompressionTypes.GZIP]()).toBe(PIECEWISE_GZIP);
    const input = text(1_000_000, 3);
    expect((await PIECEWISE_GZIP.decompress(gzipSync(input))).equals(input)).toBe(true);
  });
});

const kcat = spawnSync('kcat', ['-V'], { stdio: 'ignore' }).status === 0;
if (!kcat && !process.env.CI) process.stderr.write('parallel-gzip.test.ts: kcat is not installed (apt-get install kcat): librdkafka reading SKIPPED\n');

(kcat || process.env.CI ? describe : describe.skip)('produced through kafkajs, read by librdkafka (kcat)', () => {
  it('a produce request compressed in pieces comes back whole, every record in order', async () => {
    const broker = await startKafkaTestBroker({ defaultPartitions: 1 });
    const k = kafkajs();
    const producer = new k.Kafka({ brokers: broker.brokers, logLevel: k.logLevel.NOTHING }).producer({ idempotent: true, maxInFlightRequests: 1 });
    try {
      await producer.connect();
      // ~2 MB of records in one request: eight pieces and more.
      const values = Array.from({ length: 200 }, (_, i) => `${i} ${text(4000 + ((i * 37) % 12_000), i).toString()}`);
      await producer.send({ topic: 'pieces', acks: -1, compression: k.CompressionTypes.GZIP, messages: values.map((value, i) => ({ key: `k${i}`, value })) });
      expect(broker.records('pieces').map((r) => r.value?.toString())).toEqual(values);
      const { stdout } = await run('kcat', ['-C', '-b', broker.brokers[0], '-t', 'pieces', '-e', '-o', 'beginning', '-f', '%s\\n'], {
        timeout: 30_000,
        maxBuffer: 64 * 1024 * 1024,
      });
      expect(stdout.split('\n').slice(0, -1)).toEqual(values);
    } finally {
      await producer.disconnect();
      await broker.close();
    }
  });
});
