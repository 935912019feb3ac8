import { readFileSync } from 'node:fs';
import { deflateRawSync } from 'node:zlib';
import { appendFile, mkdir } from 'node:fs/promises';
import { imagePath } from '../../formats/images';
import path from 'node:path';
import { BROKERS_SETTING, type KafkaExporterConfig } from '../../config/schema';
import { once } from '../../model/component';
import type { ClosedEpisode, TransitionRecord } from '../../model/records';
import type { Logger } from '../../telemetry/logger';
import type { Metrics } from '../../telemetry/metrics';
import { isEncoded, NO_JOURNAL, type Exporter, type ExportItem } from '../exporter';
import type { BodyReader } from '../../formats/extract';
import { deltaJson, PromptDeltaBytes } from '../prompt-delta-bytes';
import { TransitionWriter } from '../transition-json';
import { chunkMessages } from './chunks';
import { CONTENT_TYPE, decodeEpisode, decodeTrajectory, decodeTransition, encodeEpisode, encodeTrajectory, encodeTransition } from './encoding';
import { materializeTrajectory } from '../trajectory-json';
import { DeltaTracker } from './prompt-delta';
import type { OutMessage, Producer, SendResult } from './producer';
import { extend } from '../../model/extend';

/** Bytes Kafka adds around a record (batch, record and chunk headers), kept out of max_message_bytes. */
const RECORD_OVERHEAD = 1024;

/**
 * With gzip, how far a produce request may grow past `max_batch_bytes` (encoded bytes, before
 * compression): the broker's limit is on the compressed batch, so records that compress well go
 * in fewer, larger requests.
 */
export const GZIP_BATCH_GROWTH = 8;
/** How much of a request's records is compressed to estimate how well it compresses. */
const SAMPLE_BYTES = 128 * 1024;

export class ExportError extends Error {
  constructor(
    message: string,
    readonly retryable: boolean,
    override readonly cause?: Error,
  ) {
    super(message);
  }
}

export interface KafkaExporterDeps {
  /** What is sent per attempt (`exporters.records`); default both. */
  records?: 'trajectories' | 'transitions' | 'both';
  producer: Producer;
  logger: Logger;
  metrics: Metrics;
  deadLetterDir: string;
  /** The image store (`{data_dir}/images`): trajectories' images are sent from it to `images_topic`. */
  imagesDir?: string;
}

/** The topics an episode's records go to, in the order they are sent: images before the trajectories that name them. */
const KINDS = ['images', 'transitions', 'trajectories', 'episodes'] as const;
type Kind = (typeof KINDS)[number];

/** One record for a topic, before it is chunked. */
interface OutRecord {
  key: string;
  value: Buffer;
  headers: Record<string, string>;
  recordId: string;
  /** The record as an object, for dead-letter/. */
  record: () => unknown;
}

interface Pending {
  msg: OutMessage;
  /** The record the message (or chunk) belongs to, for dead-lettering. */
  record: () => unknown;
  recordId: string;
}

/**
 * Transitions to `topic`, trajectories to `trajectories_topic` (as `records` asks), episode
 * summaries to `episodes_topic`, keyed by rollout id so one rollout's records stay ordered on one
 * partition; an episode's summary is sent once its other records are acknowledged. A record bigger than `max_message_bytes` is
 * sent as ordered chunks (docs/kafka-records.md); only one over `max_record_bytes`, or one the
 * broker refuses for good, goes to dead-letter/. Messages are sent in produce requests of up to
 * `max_batch_bytes`, one after another; the next is encoded while one waits for its
 * acknowledgement (memory holds two batches). An export resolves only when the broker
 * acknowledged everything (acks=all); otherwise it rejects and the pipeline retries from the
 * journal. Starts without Kafka: connection is attempted on each export until it succeeds.
 * `encodeAhead` encodes an episode's records for a later export (while Kafka is away), in one
 * section per topic; `export` sends such sections as it would the records it encodes itself.
 */
export function createKafkaExporter(config: KafkaExporterConfig, deps: KafkaExporterDeps): Exporter & { readonly connected: boolean } {
  const log = deps.logger.child('exporter.kafka');
  const m = deps.metrics;
  const chunkBytes = Math.max(1024, config.max_message_bytes - RECORD_OVERHEAD);
  const sizes = new RequestSizes(config.max_batch_bytes, config.compression === 'gzip' ? GZIP_BATCH_GROWTH : 1);

  async function deadLetter(kind: string, record: unknown, reason: string): Promise<void> {
    await mkdir(deps.deadLetterDir, { recursive: true });
    await appendFile(path.join(deps.deadLetterDir, `${kind}.ndjson`), JSON.stringify({ reason, record }) + '\n');
    log.once(`dead_letter:${reason}`, 'warn', 'records Kafka cannot take are written to dead-letter/', { dir: deps.deadLetterDir, reason });
  }

  /**
   * Collects messages and sends a produce request whenever max_batch_bytes is reached. The next
   * batch is encoded while the previous one waits for the broker's acknowledgement; it is sent
   * only once that one succeeded (one request in flight, as the idempotent producer requires), so
   * a failure stops the export where it happened.
   */
  class Batcher {
    private items: Pending[] = [];
    private bytes = 0;
    /** This request's size: `max_batch_bytes` until it is full, then as far as its records are estimated to compress within it. */
    private limit = config.max_batch_bytes;
    /** The produce request in flight, if any. */
    private inflight: Promise<void> | null = null;
    /** Records that were dead-lettered part way: their remaining chunks are not sent. */
    private readonly abandoned = new Set<string>();

    constructor(
      private readonly topic: string,
      private readonly kind: Kind,
    ) {}

    async add(items: Pending[]): Promise<void> {
      for (const item of items) {
        if (this.bytes + item.msg.value.length > this.limit && this.limit === config.max_batch_bytes) this.limit = sizes.of(this.topic, this.items);
        if (this.bytes + item.msg.value.length > this.limit) await this.dispatch();
        this.items.push(item);
        this.bytes += item.msg.value.length;
      }
    }

    /** Everything added is sent and acknowledged. */
    async flush(): Promise<void> {
      await this.dispatch();
      const last = this.inflight;
      this.inflight = null;
      await last;
    }

    /** Waits for the request in flight, then sends what was collected meanwhile (not waiting). */
    private async dispatch(): Promise<void> {
      const collected = this.items;
      this.items = [];
      this.bytes = 0;
      this.limit = config.max_batch_bytes;
      const previous = this.inflight;
      this.inflight = null;
      await previous;
      // Filtered only now: the request just acknowledged may have dead-lettered a record.
      const items = collected.filter((i) => !this.abandoned.has(i.recordId));
      if (items.length === 0) return;
      const sending = this.send(items);
      sending.catch(() => {}); // observed by the next dispatch or flush
      this.inflight = sending;
    }

    private async send(items: Pending[]): Promise<void> {
      const result: SendResult = await deps.producer.send(
        this.topic,
        items.map((c) => c.msg),
      );
      if (result.status === 'success') return;
      if (result.status === 'failure' && result.tooLarge) {
        if (items.length === 1) {
          // The broker's own limit is below max_message_bytes: this record cannot go to Kafka as configured.
          m.exportOversize.inc({ action: 'dead_letter' });
          this.abandoned.add(items[0].recordId);
          await deadLetter(
            this.kind,
            items[0].record(),
            `broker refused the size: ${result.error.message} (lower exporters.kafka.max_message_bytes to the broker's limit)`,
          );
          return;
        }
        sizes.refused(this.topic);
        const half = Math.ceil(items.length / 2);
        await this.send(items.slice(0, half));
        await this.send(items.slice(half).filter((i) => !this.abandoned.has(i.recordId)));
        return;
      }
      const retryable = result.status === 'retryable';
      m.exportErrors.inc({ exporter: 'kafka', kind: retryable ? 'retryable' : 'permanent' });
      if (!retryable)
        log.once(`permanent:${result.error.message}`, 'error', `exporter kafka: ${result.error.message}; records stay in the journal and are retried`, {
          topic: this.topic,
        });
      throw new ExportError(`exporter kafka: ${result.error.message}`, retryable, result.error);
    }
  }

  /** The record's messages (chunked when big). */
  function messagesOf(r: OutRecord): Pending[] {
    if (r.value.length > chunkBytes) m.exportOversize.inc({ action: 'chunked' });
    return chunkMessages(r.key, r.value, r.headers, r.recordId, chunkBytes).map((msg) => ({ msg, record: r.record, recordId: r.recordId }));
  }

  /** Adds a record's messages to `to`, or dead-letters it when it is over max_record_bytes. */
  async function send(to: Batcher, kind: Kind, r: OutRecord): Promise<void> {
    if (r.value.length > config.max_record_bytes) {
      m.exportOversize.inc({ action: 'dead_letter' });
      await deadLetter(kind, r.record(), `larger than max_record_bytes (${r.value.length} > ${config.max_record_bytes})`);
      return;
    }
    await to.add(messagesOf(r));
  }

  const records = deps.records ?? 'both';
  /** The topics an export sends to, in order: an episode's summary goes once its other records are acknowledged. */
  const kinds = KINDS.filter((k) =>
    k === 'transitions' ? records !== 'trajectories' : k === 'trajectories' || k === 'images' ? records !== 'transitions' : true,
  );
  const topics: Record<Kind, string> = {
    images: config.images_topic,
    transitions: config.topic,
    trajectories: config.trajectories_topic,
    episodes: config.episodes_topic,
  };
  /** Images the broker acknowledged already (bounded): a conversation resends its screenshots on every turn. */
  const sentImages = new Set<string>();
  const imagesDir = deps.imagesDir ?? null;

  /** A record read back from a section `encodeAhead` wrote: for dead-lettering, its value decoded. */
  const decodeRecord: Record<Kind, (value: Buffer) => unknown> = {
    images: (v) => ({ bytes: v.length }),
    transitions: (v) => decodeTransition(v, config.encoding),
    trajectories: (v) => decodeTrajectory(v, config.encoding),
    episodes: (v) => decodeEpisode(v, config.encoding),
  };

  const exporter = {
    name: 'kafka',
    get connected() {
      return deps.producer.connected;
    },
    async start(): Promise<void> {
      // Do not wait for Kafka: agents are served and the journal holds the backlog meanwhile.
      deps.producer.connect().then(
        () => log.info('connected', { brokers: config.brokers }),
        (err: Error) => log.warn(`kafka unreachable at start; will retry on export (brokers from ${BROKERS_SETTING})`, { err, brokers: config.brokers }),
      );
    },
    async export(batch: ExportItem[], read = NO_JOURNAL): Promise<void> {
      if (!deps.producer.connected) {
        try {
          await deps.producer.connect();
        } catch (err) {
          m.exportErrors.inc({ exporter: 'kafka', kind: 'retryable' });
          const reason = `${(err as Error).message} (brokers from ${BROKERS_SETTING})`;
          throw new ExportError(`exporter kafka: cannot connect to ${config.brokers.join(',')}: ${reason}`, true, err as Error);
        }
      }
      const writer = new TransitionWriter(read);
      for (const kind of kinds) {
        const to = new Batcher(topics[kind], kind);
        const sent: string[] = [];
        for (const item of batch) {
          if (isEncoded(item)) for (const b of item.records(KINDS.indexOf(kind))) await send(to, kind, readRecord(b, decodeRecord[kind]));
          else
            for (const r of recordsOf(config, item, kind, writer, imagesDir, sentImages)) {
              if (kind === 'images') sent.push(r.key);
              await send(to, kind, r);
            }
        }
        await to.flush();
        for (const key of sent) {
          if (sentImages.size >= 100_000) sentImages.clear();
          sentImages.add(key);
        }
      }
    },
    /** The records of each topic sent to, section i for `KINDS[i]`, as `export` would send them. */
    encodeAhead(c: ClosedEpisode, read: BodyReader, write: (section: number, parts: readonly Buffer[]) => void): void {
      const writer = new TransitionWriter(read);
      KINDS.forEach((kind, i) => {
        if (kinds.includes(kind)) for (const r of recordsOf(config, c, kind, writer, imagesDir, null)) write(i, recordParts(r));
      });
    },
    shutdown: once(async () => {
      await deps.producer.disconnect();
    }),
  };
  return exporter;
}

/**
 * How big a produce request may grow, in encoded bytes: `min` (`max_batch_bytes`), or with gzip,
 * once a request holds that much, as much as its records are estimated to compress within `min`
 * (a sample of them compressed at level 1, which compresses less than the producer's gzip, with a
 * tenth to spare), up to `growth` times `min`. A topic whose broker refused a request as too large
 * stays at `min` from then on.
 */
class RequestSizes {
  private readonly stopped = new Set<string>();

  constructor(
    private readonly min: number,
    private readonly growth: number,
  ) {}

  of(topic: string, items: readonly Pending[]): number {
    if (this.growth <= 1 || this.stopped.has(topic) || items.length === 0) return this.min;
    const sample: Buffer[] = [];
    let size = 0;
    for (let i = items.length - 1; i >= 0 && size < SAMPLE_BYTES; i--) {
      sample.push(items[i].msg.value);
      size += items[i].msg.value.length;
    }
    const ratio = deflateRawSync(Buffer.concat(sample), { level: 1 }).length / Math.max(1, size);
    return Math.max(this.min, Math.min(this.min * this.growth, Math.floor((0.9 * this.min) / Math.max(ratio, 1e-3))));
  }

  /** The broker refused one of `topic`'s requests as too large. */
  refused(topic: string): void {
    this.stopped.add(topic);
  }
}

/** The headers of every message of a record (docs/kafka-records.md). */
function headers(config: KafkaExporterConfig, schema: string, t: { rollout_id: string; group_id: string | null }): Record<string, string> {
  const h: Record<string, string> = { 'content-type': CONTENT_TYPE[config.encoding], 'lightning-schema': schema, 'rollout-id': t.rollout_id };
  if (t.group_id !== null) h['group-id'] = t.group_id;
  return h;
}

/**
 * The images an episode's trajectories name, read from the image store, each once (and none the
 * broker has: `sent`), keyed by their SHA-256. One the store does not have is left out: its
 * trajectory says `images_complete: false` already.
 */
function* imageRecords(c: ClosedEpisode, dir: string | null, sent: ReadonlySet<string> | null): Generator<OutRecord> {
  if (dir === null) return;
  const seen = new Set<string>();
  for (const t of c.trajectories)
    for (const image of t.images?.images ?? []) {
      const sha = image.sha256;
      if (sha === null || seen.has(sha) || sent?.has(sha)) continue;
      seen.add(sha);
      let value: Buffer;
      try {
        value = readFileSync(imagePath(dir, sha, image.mime));
      } catch {
        continue;
      }
      const headers = { 'content-type': image.mime ?? 'application/octet-stream', 'lightning-schema': 'lightning.image.v1', 'image-sha256': sha };
      yield { key: sha, value, headers, recordId: `image:${sha}`, record: () => ({ sha256: sha, mime: image.mime, bytes: value.length }) };
    }
}

/** An episode's records for one topic, encoded one at a time as they are sent. */
function* recordsOf(
  config: KafkaExporterConfig,
  c: ClosedEpisode,
  kind: Kind,
  writer: TransitionWriter,
  imagesDir: string | null,
  sentImages: ReadonlySet<string> | null,
): Generator<OutRecord> {
  const key = keyOf(c);
  if (kind === 'images') yield* imageRecords(c, imagesDir, sentImages);
  else if (kind === 'transitions') {
    // JSON splices the delta from the model server's bytes; protobuf needs the numbers.
    const delta = config.prompt_ids !== 'delta' ? null : config.encoding === 'json' ? deltaOfBytes(writer) : deltaOfIds(writer, config.encoding);
    for (const t of c.transitions) {
      const d = delta?.(t) ?? null;
      const value = d ? d.value : encodeTransition(t, config.encoding, writer);
      const h = headers(config, 'lightning.transition.v1', t);
      if (d) h['lightning-prompt-ids'] = 'delta';
      yield { key, value, headers: h, recordId: t.transition_id, record: () => writer.materialize(t) };
    }
  } else if (kind === 'trajectories') {
    for (const t of c.trajectories)
      yield {
        key,
        value: encodeTrajectory(t, config.encoding, writer),
        headers: headers(config, 'lightning.trajectory.v1', t),
        recordId: t.trajectory_id,
        record: () => materializeTrajectory(writer, t),
      };
  } else {
    const e = c.episode;
    yield {
      key,
      value: encodeEpisode(e, config.encoding),
      headers: headers(config, 'lightning.episode.v1', e),
      recordId: `episode:${e.rollout_id}/${e.attempt_id}`,
      record: () => e,
    };
  }
}

/** Deltas as ids (protobuf): the transition encoded with its delta, or null for a full prompt. */
function deltaOfIds(writer: TransitionWriter, encoding: KafkaExporterConfig['encoding']): (t: TransitionRecord) => { value: Buffer } | null {
  const tracker = new DeltaTracker(writer);
  return (t) => {
    const d = tracker.next(t);
    return d ? { value: encodeTransition(extend(t, { prompt_token_ids: null }), encoding, writer, { prompt_token_ids_delta: d }) } : null;
  };
}

/**
 * The Kafka key of an episode's records: its GRPO group when it has one, so a group's records
 * share a partition of each topic (a consumer in a group sees whole groups; docs/kafka-records.md),
 * else its rollout. One key for all of an episode's records keeps them in order.
 */
export function keyOf(c: ClosedEpisode): string {
  return c.episode.group_id ?? c.episode.rollout_id;
}

/** Deltas as bytes (JSON): the suffix copied from the model server's answer, no id parsed. */
function deltaOfBytes(writer: TransitionWriter): (t: TransitionRecord) => { value: Buffer } | null {
  const tracker = new PromptDeltaBytes(writer);
  return (t) => {
    const d = tracker.next(t);
    return d ? { value: deltaJson(writer, t, d) } : null;
  };
}

/**
 * A record as bytes: its key, record id, headers and value, every string and the value behind a
 * u32 length, in two parts (the value as it is). The layout is private to this file: a cache,
 * never read by another version, since what waits on disk is rebuilt from the journal at start.
 */
function recordParts(r: OutRecord): Buffer[] {
  const h = Object.entries(r.headers);
  const strings = [r.key, r.recordId, ...h.flat()].map((x) => Buffer.from(x, 'utf8'));
  const head = Buffer.allocUnsafe(4 * (strings.length + 2) + strings.reduce((n, b) => n + b.length, 0));
  let i = 0;
  const put = (b: Buffer): void => {
    i = head.writeUInt32LE(b.length, i);
    i += b.copy(head, i);
  };
  put(strings[0]);
  put(strings[1]);
  i = head.writeUInt32LE(h.length, i);
  for (const b of strings.slice(2)) put(b);
  head.writeUInt32LE(r.value.length, i);
  return [head, r.value];
}

/** The record `recordParts` wrote; its value points into `buf`. */
function readRecord(buf: Buffer, decode: (value: Buffer) => unknown): OutRecord {
  let i = 0;
  const bytes = (): Buffer => {
    const n = buf.readUInt32LE(i);
    const b = buf.subarray(i + 4, i + 4 + n);
    if (b.length !== n) throw new RangeError('encoded record is cut short');
    i += 4 + n;
    return b;
  };
  const str = (): string => bytes().toString('utf8');
  const key = str();
  const recordId = str();
  const headers: Record<string, string> = {};
  let n = buf.readUInt32LE(i);
  i += 4;
  for (; n > 0; n--) {
    const k = str();
    headers[k] = str();
  }
  const value = bytes();
  if (i !== buf.length) throw new RangeError('encoded record has bytes past its value');
  return { key, value, headers, recordId, record: () => decode(value) };
}
