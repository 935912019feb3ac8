import net from 'node:net';
import { Reader, Writer } from './codec';
import { Group } from './group-coordinator';
import { decodeRecords, splitBatches, withBaseOffset, type StoredRecord } from './record-batch';

/**
 * A Kafka wire-protocol broker for tests: one node on 127.0.0.1, records in memory, just the
 * APIs (and versions) kafkajs's producer, admin and consumer-group paths need, plus fault
 * controls. Test code, not a Kafka.
 */
export const API = {
  Produce: 0,
  Fetch: 1,
  ListOffsets: 2,
  Metadata: 3,
  OffsetCommit: 8,
  OffsetFetch: 9,
  FindCoordinator: 10,
  JoinGroup: 11,
  Heartbeat: 12,
  LeaveGroup: 13,
  SyncGroup: 14,
  ApiVersions: 18,
  CreateTopics: 19,
  InitProducerId: 22,
} as const;

/** The versions implemented; each is advertised as its own min and max. */
const VERSIONS: Record<number, [number, number]> = {
  [API.Produce]: [3, 3],
  [API.Fetch]: [4, 4],
  [API.ListOffsets]: [1, 1],
  [API.Metadata]: [1, 1],
  [API.OffsetCommit]: [2, 2],
  [API.OffsetFetch]: [1, 1],
  [API.FindCoordinator]: [0, 0],
  [API.JoinGroup]: [0, 1],
  [API.Heartbeat]: [0, 0],
  [API.LeaveGroup]: [0, 0],
  [API.SyncGroup]: [0, 0],
  [API.ApiVersions]: [0, 2],
  [API.CreateTopics]: [0, 0],
  [API.InitProducerId]: [0, 0],
};

export const ERR = {
  NONE: 0,
  CORRUPT_MESSAGE: 2,
  UNKNOWN_TOPIC_OR_PARTITION: 3,
  NOT_LEADER_OR_FOLLOWER: 6,
  REQUEST_TIMED_OUT: 7,
  MESSAGE_TOO_LARGE: 10,
  UNSUPPORTED_VERSION: 35,
  TOPIC_ALREADY_EXISTS: 36,
} as const;

interface Batch {
  base: number;
  last: number;
  bytes: Buffer;
}

interface Partition {
  batches: Batch[];
  next: number;
}

/** The records of partition `index`'s batches from `from` on, decoded and tagged with the partition. */
function decoded(p: Partition, index: number, from = 0): (StoredRecord & { partition: number })[] {
  return p.batches.slice(from).flatMap((b) => decodeRecords(b.bytes).map((r) => ({ ...r, partition: index })));
}

/** The most requests in a row a rate fault (setErrorRate) fails. */
const MAX_FAULT_RUN = 3;

export interface KafkaTestBrokerOptions {
  port?: number;
  autoCreateTopics?: boolean;
  defaultPartitions?: number;
  /** Largest record batch accepted, like the broker's message.max.bytes. */
  maxMessageBytes?: number;
}

export class KafkaTestBroker {
  private server: net.Server | null = null;
  private readonly sockets = new Set<net.Socket>();
  private readonly topicsMap = new Map<string, Partition[]>();
  private readonly groups = new Map<string, Group>();
  private readonly producerSeq = new Map<string, { lastSeq: number; base: number }>();
  private readonly waiters = new Set<() => void>();
  private nextProducerId = 1000n;
  private refusing = false;
  private latencyMs = 0;
  private readonly failures = new Map<number, { code: number; count: number; rate: number; run: number }>();
  /** Faults drawn from a fixed-seed generator, so a test run sees the same faults every time. */
  private faultSeed = 0x9e3779b9;
  private sweeper: NodeJS.Timeout | null = null;
  port = 0;
  /** Requests seen, by API name (for tests that check what a client did). */
  readonly requestCounts = new Map<number, number>();

  constructor(private readonly options: KafkaTestBrokerOptions = {}) {}

  get brokers(): string[] {
    return [`127.0.0.1:${this.port}`];
  }

  async start(): Promise<void> {
    if (this.server) return;
    const server = net.createServer((s) => this.accept(s));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port || this.options.port || 0, '127.0.0.1', () => resolve());
    });
    this.port = (server.address() as net.AddressInfo).port;
    this.server = server;
    this.sweeper = setInterval(() => {
      for (const g of this.groups.values()) g.expire(Date.now());
    }, 500);
    this.sweeper.unref();
  }

  /** Closes the listener and every connection; records and offsets are kept for a later start(). */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = null;
    if (this.sweeper) clearInterval(this.sweeper);
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
    if (server) await new Promise<void>((r) => server.close(() => r()));
  }

  close(): Promise<void> {
    return this.stop();
  }

  /** While on, new connections are closed at once and open ones are dropped. */
  refuseConnections(on: boolean): void {
    this.refusing = on;
    if (on) for (const s of this.sockets) s.destroy();
  }

  setLatencyMs(ms: number): void {
    this.latencyMs = ms;
  }

  /** Answers the next `count` requests of `apiKey` with `code` (partition-level errors, nothing stored). */
  failNext(apiKey: number, code: number, count = 1): void {
    this.failures.set(apiKey, { code, count, rate: 0, run: 0 });
  }

  /**
   * Answers a `fraction` of `apiKey` requests with `code` until cleared with fraction 0. The draws are
   * deterministic (fixed seed) and never fail more than MAX_FAULT_RUN requests in a row, so a client
   * with a few retries always gets through: the fault tests retrying, not a client's retry budget.
   */
  setErrorRate(apiKey: number, code: number, fraction: number): void {
    if (fraction <= 0) this.failures.delete(apiKey);
    else this.failures.set(apiKey, { code, count: 0, rate: fraction, run: 0 });
  }

  createTopic(name: string, partitions = this.options.defaultPartitions ?? 1): boolean {
    if (this.topicsMap.has(name)) return false;
    this.topicsMap.set(
      name,
      Array.from({ length: partitions }, () => ({ batches: [], next: 0 })),
    );
    return true;
  }

  topics(): string[] {
    return [...this.topicsMap.keys()];
  }

  /** How many records the topic holds (cheap: no batch is decoded; for polling). */
  recordCount(topic: string): number {
    return (this.topicsMap.get(topic) ?? []).reduce((n, p) => n + p.next, 0);
  }

  /**
   * The records of a topic appended since `cursor` was last passed here (all partitions), decoded;
   * `cursor` (batches already read, per partition) is advanced. For polling a topic that grows:
   * each batch is decoded once, where `records` decodes the whole topic on every call.
   */
  recordsSince(topic: string, cursor: number[]): (StoredRecord & { partition: number })[] {
    return (this.topicsMap.get(topic) ?? []).flatMap((p, i) => {
      const out = decoded(p, i, cursor[i] ?? 0);
      cursor[i] = p.batches.length;
      return out;
    });
  }

  /** Every record of a topic (all partitions, or one), decoded. */
  records(topic: string, partition?: number): (StoredRecord & { partition: number })[] {
    return (this.topicsMap.get(topic) ?? []).flatMap((p, i) => (partition === undefined || partition === i ? decoded(p, i) : []));
  }

  private accept(socket: net.Socket): void {
    if (this.refusing) {
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    socket.setNoDelay(true);
    let pending: Buffer = Buffer.alloc(0);
    let chain: Promise<void> = Promise.resolve();
    socket.on('data', (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      while (pending.length >= 4) {
        const size = pending.readInt32BE(0);
        if (pending.length < 4 + size) break;
        const frame = pending.subarray(4, 4 + size);
        pending = pending.subarray(4 + size);
        // Responses go out in request order on a connection, as Kafka guarantees.
        chain = chain
          .then(() => this.handle(socket, Buffer.from(frame)))
          .catch(() => {
            socket.destroy();
          });
      }
    });
    socket.on('error', () => {});
    socket.on('close', () => this.sockets.delete(socket));
  }

  private async handle(socket: net.Socket, frame: Buffer): Promise<void> {
    const r = new Reader(frame);
    const apiKey = r.int16();
    const version = r.int16();
    const correlationId = r.int32();
    const clientId = r.nullableString() ?? '';
    this.requestCounts.set(apiKey, (this.requestCounts.get(apiKey) ?? 0) + 1);
    if (this.latencyMs > 0) await new Promise((res) => setTimeout(res, this.latencyMs));
    const range = VERSIONS[apiKey];
    let body: Buffer | null;
    if (!range || version < range[0] || version > range[1]) {
      body =
        apiKey === API.ApiVersions
          ? new Writer()
              .int16(ERR.UNSUPPORTED_VERSION)
              .array([], () => {})
              .build()
          : null;
      if (!body) {
        socket.destroy();
        return;
      }
    } else {
      body = await this.dispatch(apiKey, version, r, clientId);
    }
    if (body === null || socket.destroyed) return;
    const out = new Writer()
      .int32(body.length + 4)
      .int32(correlationId)
      .raw(body)
      .build();
    socket.write(out);
  }

  private injected(apiKey: number): number | null {
    const f = this.failures.get(apiKey);
    if (!f) return null;
    if (f.count > 0) {
      if (--f.count === 0) this.failures.delete(apiKey);
      return f.code;
    }
    if (f.rate <= 0 || f.run >= MAX_FAULT_RUN || this.nextFaultDraw() >= f.rate) {
      f.run = 0;
      return null;
    }
    f.run++;
    return f.code;
  }

  /** mulberry32: a uniform draw in [0, 1) from the broker's fault seed. */
  private nextFaultDraw(): number {
    let t = (this.faultSeed = (this.faultSeed + 0x6d2b79f5) | 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  private async dispatch(apiKey: number, version: number, r: Reader, clientId: string): Promise<Buffer | null> {
    const w = new Writer();
    switch (apiKey) {
      case API.ApiVersions: {
        w.int16(ERR.NONE).array(Object.entries(VERSIONS), (x, [key, [min, max]]) => x.int16(Number(key)).int16(min).int16(max));
        if (version >= 1) w.int32(0);
        return w.build();
      }
      case API.Metadata: {
        const names = r.nullableArray((x) => x.string());
        const wanted = names ?? [...this.topicsMap.keys()];
        if (this.options.autoCreateTopics !== false) for (const n of wanted) this.createTopic(n);
        return this.metadataBody(wanted);
      }
      case API.CreateTopics: {
        const reqs = r.array((x) => {
          const topic = x.string();
          const partitions = x.int32();
          x.int16();
          x.array((y) => [y.int32(), y.array((z) => z.int32())]);
          x.array((y) => [y.string(), y.nullableString()]);
          return { topic, partitions };
        });
        r.int32();
        return w
          .array(reqs, (x, t) => x.string(t.topic).int16(this.createTopic(t.topic, t.partitions > 0 ? t.partitions : 1) ? ERR.NONE : ERR.TOPIC_ALREADY_EXISTS))
          .build();
      }
      case API.InitProducerId: {
        r.nullableString();
        r.int32();
        return w.int32(0).int16(ERR.NONE).int64(this.nextProducerId++).int16(0).build();
      }
      case API.Produce:
        return this.produce(r);
      case API.Fetch:
        return this.fetch(r);
      case API.ListOffsets: {
        r.int32();
        const topics = r.array((x) => ({ topic: x.string(), partitions: x.array((y) => ({ partition: y.int32(), timestamp: y.int64() })) }));
        return w
          .array(topics, (x, t) =>
            x.string(t.topic).array(t.partitions, (y, p) => {
              const part = this.topicsMap.get(t.topic)?.[p.partition];
              const first = part?.batches[0]?.base ?? part?.next ?? 0;
              y.int32(p.partition)
                .int16(part ? ERR.NONE : ERR.UNKNOWN_TOPIC_OR_PARTITION)
                .int64(-1)
                .int64(p.timestamp === -2n ? first : (part?.next ?? 0));
            }),
          )
          .build();
      }
      case API.FindCoordinator: {
        r.string();
        return w.int16(ERR.NONE).int32(0).string('127.0.0.1').int32(this.port).build();
      }
      case API.JoinGroup: {
        const groupId = r.string();
        const sessionTimeout = r.int32();
        const rebalanceTimeout = version >= 1 ? r.int32() : sessionTimeout;
        const memberId = r.string();
        r.string();
        const protocols = r.array((x) => ({ name: x.string(), metadata: x.bytes() ?? Buffer.alloc(0) }));
        const res = await this.group(groupId).join(memberId, clientId, sessionTimeout, protocols, rebalanceTimeout);
        return w
          .int16(res.error)
          .int32(res.generationId)
          .string(res.protocol)
          .string(res.leaderId)
          .string(res.memberId)
          .array(res.members, (x, m) => x.string(m.id).bytes(m.metadata))
          .build();
      }
      case API.SyncGroup: {
        const groupId = r.string();
        const generation = r.int32();
        const memberId = r.string();
        const assignments = r.array((x) => ({ memberId: x.string(), assignment: x.bytes() ?? Buffer.alloc(0) }));
        const res = await this.group(groupId).sync(memberId, generation, assignments);
        return w.int16(res.error).bytes(res.assignment).build();
      }
      case API.Heartbeat: {
        const groupId = r.string();
        const generation = r.int32();
        return w.int16(this.group(groupId).heartbeat(r.string(), generation)).build();
      }
      case API.LeaveGroup: {
        const groupId = r.string();
        return w.int16(this.group(groupId).leave(r.string())).build();
      }
      case API.OffsetCommit: {
        const group = this.group(r.string());
        r.int32();
        r.string();
        r.int64();
        const topics = r.array((x) => ({
          topic: x.string(),
          partitions: x.array((y) => ({ partition: y.int32(), offset: y.int64(), meta: y.nullableString() })),
        }));
        for (const t of topics) for (const p of t.partitions) group.offsets.set(`${t.topic}:${p.partition}`, p.offset);
        return w.array(topics, (x, t) => x.string(t.topic).array(t.partitions, (y, p) => y.int32(p.partition).int16(ERR.NONE))).build();
      }
      case API.OffsetFetch: {
        const group = this.group(r.string());
        const topics = r.array((x) => ({ topic: x.string(), partitions: x.array((y) => y.int32()) }));
        return w
          .array(topics, (x, t) =>
            x.string(t.topic).array(t.partitions, (y, p) =>
              y
                .int32(p)
                .int64(group.offsets.get(`${t.topic}:${p}`) ?? -1n)
                .string('')
                .int16(ERR.NONE),
            ),
          )
          .build();
      }
    }
    return null;
  }

  private metadataBody(names: string[]): Buffer {
    const w = new Writer();
    w.array([0], (x) => x.int32(0).string('127.0.0.1').int32(this.port).string(null)).int32(0);
    w.array(names, (x, name) => {
      const parts = this.topicsMap.get(name);
      x.int16(parts ? ERR.NONE : ERR.UNKNOWN_TOPIC_OR_PARTITION)
        .string(name)
        .bool(false);
      x.array(
        (parts ?? []).map((_, i) => i),
        (y, i) =>
          y
            .int16(ERR.NONE)
            .int32(i)
            .int32(0)
            .array([0], (z, n) => z.int32(n))
            .array([0], (z, n) => z.int32(n)),
      );
    });
    return w.build();
  }

  private group(id: string): Group {
    let g = this.groups.get(id);
    if (!g) {
      g = new Group();
      this.groups.set(id, g);
    }
    return g;
  }

  private produce(r: Reader): Buffer | null {
    r.nullableString();
    const acks = r.int16();
    r.int32();
    const topics = r.array((x) => ({ topic: x.string(), partitions: x.array((y) => ({ partition: y.int32(), set: y.bytes() ?? Buffer.alloc(0) })) }));
    const injected = this.injected(API.Produce);
    const results = topics.map((t) => ({
      topic: t.topic,
      partitions: t.partitions.map((p) => {
        if (injected !== null) return { partition: p.partition, error: injected, base: -1 };
        return { partition: p.partition, ...this.append(t.topic, p.partition, p.set) };
      }),
    }));
    if (acks === 0) return null;
    return new Writer()
      .array(results, (x, t) => x.string(t.topic).array(t.partitions, (y, p) => y.int32(p.partition).int16(p.error).int64(p.base).int64(-1)))
      .int32(0)
      .build();
  }

  private append(topic: string, partition: number, set: Buffer): { error: number; base: number } {
    if (this.options.autoCreateTopics !== false) this.createTopic(topic);
    const part = this.topicsMap.get(topic)?.[partition];
    if (!part) return { error: ERR.UNKNOWN_TOPIC_OR_PARTITION, base: -1 };
    const batches = splitBatches(set);
    if (batches.length === 0) return { error: ERR.CORRUPT_MESSAGE, base: -1 };
    for (const b of batches) {
      if (b.header.magic !== 2 || !b.header.crcOk) return { error: ERR.CORRUPT_MESSAGE, base: -1 };
      if (b.bytes.length > (this.options.maxMessageBytes ?? 1_048_588)) return { error: ERR.MESSAGE_TOO_LARGE, base: -1 };
    }
    let first = -1;
    for (const b of batches) {
      const key = `${b.header.producerId}:${topic}:${partition}`;
      const seen = b.header.producerId >= 0n ? this.producerSeq.get(key) : undefined;
      if (seen && b.header.baseSequence <= seen.lastSeq) {
        // An idempotent producer retrying a batch we already stored: acknowledge, do not store twice.
        if (first < 0) first = seen.base;
        continue;
      }
      const base = part.next;
      part.batches.push({ base, last: base + b.header.lastOffsetDelta, bytes: withBaseOffset(b.bytes, base) });
      part.next = base + b.header.lastOffsetDelta + 1;
      if (b.header.producerId >= 0n) this.producerSeq.set(key, { lastSeq: b.header.baseSequence + b.header.count - 1, base });
      if (first < 0) first = base;
    }
    for (const wake of this.waiters) wake();
    return { error: ERR.NONE, base: first };
  }

  private async fetch(r: Reader): Promise<Buffer> {
    r.int32();
    const maxWait = r.int32();
    r.int32();
    const maxBytes = r.int32();
    r.int8();
    const topics = r.array((x) => ({ topic: x.string(), partitions: x.array((y) => ({ partition: y.int32(), offset: Number(y.int64()), max: y.int32() })) }));
    const collect = () =>
      topics.map((t) => ({
        topic: t.topic,
        partitions: t.partitions.map((p) => {
          const part = this.topicsMap.get(t.topic)?.[p.partition];
          if (!part) return { partition: p.partition, error: ERR.UNKNOWN_TOPIC_OR_PARTITION, hw: -1, set: Buffer.alloc(0) };
          const chosen: Buffer[] = [];
          let size = 0;
          for (const b of part.batches) {
            if (b.last < p.offset) continue;
            if (chosen.length > 0 && (size + b.bytes.length > p.max || size + b.bytes.length > maxBytes)) break;
            chosen.push(b.bytes);
            size += b.bytes.length;
          }
          return { partition: p.partition, error: ERR.NONE, hw: part.next, set: Buffer.concat(chosen) };
        }),
      }));
    let result = collect();
    if (result.every((t) => t.partitions.every((p) => p.set.length === 0)) && maxWait > 0) {
      await new Promise<void>((resolve) => {
        const wake = () => {
          this.waiters.delete(wake);
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(wake, Math.min(maxWait, 1000));
        timer.unref();
        this.waiters.add(wake);
      });
      result = collect();
    }
    return new Writer()
      .int32(0)
      .array(result, (x, t) =>
        x.string(t.topic).array(t.partitions, (y, p) =>
          y
            .int32(p.partition)
            .int16(p.error)
            .int64(p.hw)
            .int64(p.hw)
            .array([], () => {})
            .bytes(p.set),
        ),
      )
      .build();
  }
}

export async function startKafkaTestBroker(options: KafkaTestBrokerOptions = {}): Promise<KafkaTestBroker> {
  const broker = new KafkaTestBroker(options);
  await broker.start();
  return broker;
}
