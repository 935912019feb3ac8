import { randomBytes } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { decodeEpisode, decodeTrajectory, decodeTransition, encodeEpisode, encodeTrajectory, encodeTransition } from '../../../src/exporters/kafka/encoding';
import { TransitionWriter } from '../../../src/exporters/transition-json';
import { materializeTrajectory, trajectoryJsonParts } from '../../../src/exporters/trajectory-json';
import { createKafkaExporter, ExportError } from '../../../src/exporters/kafka/kafka-exporter';
import { classify } from '../../../src/exporters/kafka/kafkajs-producer';
import type { OutMessage, Producer, SendResult } from '../../../src/exporters/kafka/producer';
import { configSchema } from '../../../src/config/schema';
import { buildEpisode } from '../../../src/processors/rewards/transitions';
import { silentLogger } from '../../../src/telemetry/logger';
import { createMetrics } from '../../../src/telemetry/metrics';
import { callRecord } from '../../support/records';
import { ChunkReassembler } from '../../../src/trainer/chunk-reassembly';
import type { ClosedEpisode, RoutingArray, SamplingParams, TrajectoryRecord, Transition, WeightVersionSpan } from '../../../src/model/records';
import { NO_JOURNAL, type EncodedEpisode } from '../../../src/exporters/exporter';

function episode(rolloutId: string, calls: number, bodyBytes = 10) {
  return buildEpisode(
    {
      rolloutId,
      attemptId: '0',
      groupId: 'grp',
      calls: Array.from({ length: calls }, (_, i) =>
        callRecord(rolloutId, i, 10 + i, {
          request: { messages: [{ role: 'user', content: 'b'.repeat(bodyBytes) }] },
          toolCalls: [{ id: `c${i}`, name: 'calc', arguments: '{}' }],
        }),
      ),
      toolSpans: [],
      rewards: [{ name: 'primary', value: 1, final: true }],
      finalReward: 1,
      startedAt: 0,
      endedAt: 100,
    },
    'completed',
    { credit: { mode: 'identical', gamma: 1 }, airWeight: 0, air: null, includeAgents: [], excludeAgents: [] },
  );
}

/** An episode of three calls whose prompts continue each other (deltas apply); `recordSampling` as `processors.sampling.record`. */
function continuing(rolloutId: string, recordSampling = false) {
  let prompt = Array.from({ length: 300 }, (_, i) => 1000 + i);
  const calls = [0, 1, 2].map((seq) => {
    const response = [7 + seq, 8 + seq];
    const c = callRecord(rolloutId, seq, 10 + seq, {
      promptTokenIds: prompt,
      choices: [{ index: 0, finishReason: 'stop', responseTokenIds: response, responseLogprobs: [-0.5, -0.25], promptTokenIds: null, toolCalls: [] }],
    });
    prompt = [...prompt, ...response, 5];
    return c;
  });
  return buildEpisode(
    { rolloutId, attemptId: '0', groupId: null, calls, toolSpans: [], rewards: [], finalReward: 1, startedAt: 0, endedAt: 100 },
    'completed',
    { credit: { mode: 'identical', gamma: 1 }, airWeight: 0, air: null, includeAgents: [], excludeAgents: [], recordSampling },
  );
}

class FakeProducer implements Producer {
  sent: { topic: string; messages: OutMessage[] }[] = [];
  connected = true;
  next: SendResult[] = [];
  maxBytes = Infinity;
  async connect() {
    if (!this.connected) throw new Error('ECONNREFUSED');
  }
  async send(topic: string, messages: OutMessage[]): Promise<SendResult> {
    const scripted = this.next.shift();
    if (scripted) return scripted;
    if (messages.reduce((n, m) => n + m.value.length, 0) > this.maxBytes) return { status: 'failure', error: new Error('too large'), tooLarge: true };
    this.sent.push({ topic, messages });
    return { status: 'success' };
  }
  async disconnect() {}
}

/**
 * What the queue does while the broker is away: each record the exporter encodes ahead is written
 * to disk (copied here, its parts as one) and read back, a record at a time, when the batch is sent.
 */
function ahead(exporter: ReturnType<typeof setup>['exporter'], c: ClosedEpisode): EncodedEpisode {
  const sections: Buffer[][] = [];
  let last = 0;
  exporter.encodeAhead!(c, NO_JOURNAL, (i, parts) => {
    // Section after section, in order.
    expect(i).toBeGreaterThanOrEqual(last);
    last = i;
    (sections[i] ??= []).push(Buffer.concat(parts));
  });
  return { encoded: true, transitions: c.transitions.length, trajectories: c.trajectories.length, endedAt: [], records: (i) => sections[i] ?? [] };
}

const kafkaConfig = (extra: Record<string, unknown> = {}) =>
  configSchema.parse({ exporters: { kafka: { brokers: ['127.0.0.1:9'], ...extra } } }).exporters.kafka;

/** An exporter of transitions (what most cases here check); `records` picks others. */
function setup(extra: Record<string, unknown> = {}, records: 'transitions' | 'trajectories' | 'both' = 'transitions') {
  const producer = new FakeProducer();
  const deadLetterDir = path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-kafka-')), 'dead-letter');
  const metrics = createMetrics();
  const exporter = createKafkaExporter(kafkaConfig(extra), { records, producer, logger: silentLogger, metrics, deadLetterDir });
  return { producer, exporter, deadLetterDir, metrics };
}

describe('kafka exporter', () => {
  it('sends trajectories to their topic before the episode, chunked like any record, equal to the record in JSON and protobuf', async () => {
    for (const encoding of ['json', 'protobuf'] as const) {
      const { producer, exporter } = setup({ encoding, max_message_bytes: 1200 }, 'trajectories');
      // Three calls whose prompts continue each other (400 ids and growing): one segment, chunked.
      let prompt = Array.from({ length: 400 }, (_, i) => 1000 + i);
      const calls = [0, 1, 2].map((seq) => {
        const response = [7 + seq, 8 + seq];
        const c = callRecord('tr', seq, 10 + seq, {
          promptTokenIds: prompt,
          choices: [{ index: 0, finishReason: 'stop', responseTokenIds: response, responseLogprobs: [-0.5, -0.25], promptTokenIds: null, toolCalls: [] }],
        });
        prompt = [...prompt, ...response, 5];
        return c;
      });
      const closed = buildEpisode(
        { rolloutId: 'tr', attemptId: '0', groupId: 'grp', calls, toolSpans: [], rewards: [], finalReward: 1, startedAt: 0, endedAt: 100 },
        'completed',
        { credit: { mode: 'identical', gamma: 1 }, airWeight: 0, air: null, includeAgents: [], excludeAgents: [] },
      );
      expect(closed.trajectories.map((t) => t.turns.length)).toEqual([3]);
      await exporter.export([closed]);
      expect([...new Set(producer.sent.map((s) => s.topic))]).toEqual(['lightning.trajectories', 'lightning.episodes']);
      const reassembler = new ChunkReassembler({ timeoutMs: 1000, maxBytes: 1 << 20 });
      const got: unknown[] = [];
      let offset = 0;
      for (const s of producer.sent.filter((x) => x.topic === 'lightning.trajectories'))
        for (const m of s.messages) {
          expect([m.key, m.headers['lightning-schema'], m.headers['rollout-id']]).toEqual(['grp', 'lightning.trajectory.v1', 'tr']);
          const out = reassembler.add({ topic: s.topic, partition: 0, offset: offset++ }, m.headers, m.value, 0);
          if (out.kind === 'record') got.push(decodeTrajectory(out.record.value, encoding));
        }
      const writer = new TransitionWriter(() => {
        throw new Error('no journal');
      });
      expect(got).toEqual(closed.trajectories.map((t) => materializeTrajectory(writer, t)));
      const e = decodeEpisode(producer.sent[producer.sent.length - 1].messages[0].value, encoding);
      expect([e.trajectory_ids, e.exported]).toEqual([closed.trajectories.map((t) => t.trajectory_id), ['transitions', 'trajectories']]);
    }
  });

  it('sends transitions keyed by their group (a rollout without one by its rollout id) with schema headers, then episodes to their topic', async () => {
    const { producer, exporter } = setup();
    await exporter.export([episode('r1', 2)]);
    expect(producer.sent.map((s) => s.topic)).toEqual(['lightning.transitions', 'lightning.episodes']);
    const [t0] = producer.sent[0].messages;
    // Every record of a group shares a key, so a consumer in a consumer group sees whole groups.
    expect(t0.key).toBe('grp');
    expect(producer.sent[1].messages[0].key).toBe('grp');
    const solo = episode('solo', 1);
    solo.episode.group_id = null;
    const other = setup();
    await other.exporter.export([solo]);
    expect(other.producer.sent.flatMap((s) => s.messages.map((m) => m.key))).toEqual(['solo', 'solo']);
    expect(t0.headers).toEqual({ 'content-type': 'application/json', 'lightning-schema': 'lightning.transition.v1', 'rollout-id': 'r1', 'group-id': 'grp' });
    expect(JSON.parse(t0.value.toString()).transition_id).toBe('r1/0/0');
    expect(producer.sent[1].messages[0].headers['lightning-schema']).toBe('lightning.episode.v1');
  });

  it('sends a record above max_message_bytes as ordered chunks that reassemble to it exactly; dead-letters only over max_record_bytes', async () => {
    const { producer, exporter, deadLetterDir, metrics } = setup({ max_message_bytes: 3000, max_batch_bytes: 5000 });
    const ep = episode('big', 2, 9000);
    await exporter.export([ep]);
    const messages = producer.sent.filter((s) => s.topic === 'lightning.transitions').flatMap((s) => s.messages);
    expect(messages.length).toBeGreaterThan(4);
    expect(messages.every((m) => m.key === 'grp' && m.value.length <= 3000)).toBe(true);
    // Chunks of one record are consecutive and in index order; each says what it belongs to.
    const first = messages.filter((m) => m.headers['lightning-record-id'] === 'big/0/0');
    expect(first.map((m) => m.headers['lightning-chunk-index'])).toEqual(first.map((_, i) => String(i)));
    expect(first[0].headers).toMatchObject({
      'lightning-chunk': 'v1',
      'lightning-chunk-count': String(first.length),
      'lightning-schema': 'lightning.transition.v1',
      'rollout-id': 'big',
      'group-id': 'grp',
    });
    // Interleaved and duplicated on the wire, they still reassemble to the exact records.
    const r = new ChunkReassembler({ timeoutMs: 1000, maxBytes: 1 << 20 });
    const wire = [...messages.slice(0, 2), ...messages.slice(0, 1), ...messages.slice(2)];
    const whole = wire.flatMap((msg, offset) => {
      const out = r.add({ topic: 't', partition: 0, offset }, msg.headers, msg.value, 0);
      return out.kind === 'record' ? [JSON.parse(out.record.value.toString()) as Transition] : [];
    });
    expect(whole.map((t) => t.transition_id)).toEqual(['big/0/0', 'big/0/1']);
    expect(whole[1].request).toEqual({ messages: [{ role: 'user', content: 'b'.repeat(9000) }] });
    expect(whole[1]).toMatchObject({ prompt_token_ids: [1, 2], response_token_ids: [3] });
    expect(existsSync(deadLetterDir)).toBe(false);
    expect(await metrics.registry.getSingleMetricAsString('lightning_sidecar_export_oversize_total')).toContain('action="chunked"} 2');

    const capped = setup({ max_message_bytes: 3000, max_record_bytes: 8000 });
    await capped.exporter.export([episode('huge', 1, 9000)]);
    expect(capped.producer.sent.map((s) => s.topic)).toEqual(['lightning.episodes']);
    const dl = readFileSync(path.join(capped.deadLetterDir, 'transitions.ndjson'), 'utf8').trim().split('\n');
    expect(dl).toHaveLength(1);
    expect(JSON.parse(dl[0])).toMatchObject({ reason: expect.stringContaining('max_record_bytes'), record: { transition_id: 'huge/0/0' } });
  });

  it('with prompt_ids: delta, sends only the new prompt ids of a call that continues the previous one', async () => {
    const calls = [
      callRecord('d', 0, 10, {
        promptTokenIds: [1, 2],
        choices: [{ index: 0, finishReason: 'stop', responseTokenIds: [3, 4], responseLogprobs: null, promptTokenIds: null, toolCalls: [] }],
      }),
      callRecord('d', 1, 11, {
        promptTokenIds: [1, 2, 3, 4, 5, 6],
        choices: [{ index: 0, finishReason: 'stop', responseTokenIds: [7], responseLogprobs: null, promptTokenIds: null, toolCalls: [] }],
      }),
      callRecord('d', 2, 12, {
        promptTokenIds: [9, 9],
        choices: [{ index: 0, finishReason: 'stop', responseTokenIds: [8], responseLogprobs: null, promptTokenIds: null, toolCalls: [] }],
      }),
    ];
    const ep = buildEpisode(
      { rolloutId: 'd', attemptId: '0', groupId: null, calls, toolSpans: [], rewards: [], finalReward: null, startedAt: 0, endedAt: 20 },
      'completed',
      { credit: { mode: 'identical', gamma: 1 }, airWeight: 0, air: null, includeAgents: [], excludeAgents: [] },
    );
    for (const encoding of ['json', 'protobuf'] as const) {
      const { producer, exporter } = setup({ prompt_ids: 'delta', encoding });
      await exporter.export([ep]);
      const [m0, m1, m2] = producer.sent[0].messages;
      const [t0, t1, t2] = [m0, m1, m2].map((m) => decodeTransition(m.value, encoding));
      expect(t0.prompt_token_ids).toEqual([1, 2]);
      expect(m0.headers['lightning-prompt-ids']).toBeUndefined();
      expect(t1.prompt_token_ids).toBeNull();
      expect(t1.prompt_token_ids_delta).toEqual({ previous_transition_id: 'd/0/0', prefix_length: 4, suffix: [5, 6] });
      expect(m1.headers['lightning-prompt-ids']).toBe('delta');
      // A call that starts over carries its full prompt.
      expect(t2).toMatchObject({ prompt_token_ids: [9, 9], continues_previous: false });
    }
  });

  it('splits a batch the broker refuses for size, and dead-letters a single record it still refuses', async () => {
    const { producer, exporter, deadLetterDir } = setup({ max_batch_bytes: 1 << 20 });
    producer.maxBytes = 2500;
    await exporter.export([episode('s', 6, 400)]);
    const delivered = producer.sent
      .filter((s) => s.topic === 'lightning.transitions')
      .flatMap((s) => s.messages.map((m) => JSON.parse(m.value.toString()).transition_id));
    expect(delivered.sort()).toEqual(['s/0/0', 's/0/1', 's/0/2', 's/0/3', 's/0/4', 's/0/5']);
    producer.maxBytes = 10;
    producer.sent = [];
    await exporter.export([episode('t', 1)]);
    expect(readFileSync(path.join(deadLetterDir, 'transitions.ndjson'), 'utf8')).toContain('broker refused the size');
  });

  it('sends an episode encoded ahead exactly as it would send it now: every topic, chunks, deltas, JSON and protobuf', async () => {
    for (const encoding of ['json', 'protobuf'] as const)
      for (const prompt_ids of ['full', 'delta'] as const) {
        const extra = { encoding, prompt_ids, max_message_bytes: 1500, max_batch_bytes: 4000 };
        const eps = [episode('a', 3, 2500), episode('b', 2), continuing('c')];
        const now = setup(extra, 'both');
        await now.exporter.export(eps);
        const later = setup(extra, 'both');
        // Mixed, as a batch can be: some episodes encoded ahead, one built when sent.
        await later.exporter.export([ahead(later.exporter, eps[0]), eps[1], ahead(later.exporter, eps[2])]);
        expect(later.producer.sent.map((x) => x.topic)).toEqual(now.producer.sent.map((x) => x.topic));
        expect(later.producer.sent).toEqual(now.producer.sent);
        // The case covers chunks and deltas.
        const headers = now.producer.sent.flatMap((x) => x.messages.map((m) => m.headers));
        expect(headers.some((h) => h['lightning-chunk'] === 'v1')).toBe(true);
        expect(headers.some((h) => h['lightning-prompt-ids'] === 'delta')).toBe(prompt_ids === 'delta');
      }
  });

  it('dead-letters a record encoded ahead as it would the record itself (broker size refusal and max_record_bytes)', async () => {
    for (const encoding of ['json', 'protobuf'] as const) {
      const now = setup({ encoding, max_record_bytes: 3000 });
      const later = setup({ encoding, max_record_bytes: 3000 });
      const big = episode('big', 2, 4000);
      const small = episode('small', 1);
      await now.exporter.export([big]);
      await later.exporter.export([ahead(later.exporter, big)]);
      const lines = (d: string) =>
        readFileSync(path.join(d, 'transitions.ndjson'), 'utf8')
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l));
      expect(lines(later.deadLetterDir)).toEqual(lines(now.deadLetterDir));
      expect(lines(later.deadLetterDir).map((l) => l.record.transition_id)).toEqual(['big/0/0', 'big/0/1']);
      // Refused by the broker one at a time.
      now.producer.maxBytes = later.producer.maxBytes = 10;
      await now.exporter.export([small]);
      await later.exporter.export([ahead(later.exporter, small)]);
      expect(lines(later.deadLetterDir)).toEqual(lines(now.deadLetterDir));
      expect(lines(later.deadLetterDir)[2]).toMatchObject({
        reason: expect.stringContaining('broker refused the size'),
        record: { transition_id: 'small/0/0' },
      });
    }
  });

  it('keeps one produce request in flight, in order; a failed one stops the export before the next is sent', async () => {
    // Each send waits until the test lets it finish.
    class GatedProducer extends FakeProducer {
      gates: (() => void)[] = [];
      inflight = 0;
      maxInflight = 0;
      calls: string[][] = [];
      override async send(topic: string, messages: OutMessage[]): Promise<SendResult> {
        this.calls.push(messages.map((m) => JSON.parse(m.value.toString()).transition_id ?? 'episode'));
        this.inflight++;
        this.maxInflight = Math.max(this.maxInflight, this.inflight);
        await new Promise<void>((r) => this.gates.push(r));
        this.inflight--;
        return super.send(topic, messages);
      }
    }
    const producer = new GatedProducer();
    const exporter = createKafkaExporter(kafkaConfig({ max_batch_bytes: 1500 }), {
      producer,
      logger: silentLogger,
      metrics: createMetrics(),
      deadLetterDir: path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-kafka-')), 'dead-letter'),
    });
    const tick = () => new Promise((r) => setImmediate(r));
    const done = exporter.export([episode('p', 6, 400)]);
    let settled = false;
    void done.then(() => (settled = true));
    for (let i = 0; i < 50 && !settled; i++) {
      await tick();
      // Only ever one request waiting on the broker: the next starts after it is acknowledged.
      expect(producer.inflight).toBeLessThanOrEqual(1);
      producer.gates.shift()?.();
    }
    await done;
    expect(producer.maxInflight).toBe(1);
    expect(producer.calls.length).toBeGreaterThan(2);
    const sent = producer.sent
      .filter((s) => s.topic === 'lightning.transitions')
      .flatMap((s) => s.messages.map((m) => JSON.parse(m.value.toString()).transition_id));
    expect(sent).toEqual(['p/0/0', 'p/0/1', 'p/0/2', 'p/0/3', 'p/0/4', 'p/0/5']);

    // The first request fails: the export rejects and nothing after it is sent.
    producer.sent = [];
    producer.calls = [];
    producer.next = [{ status: 'retryable', error: new Error('NOT_ENOUGH_REPLICAS') }];
    const failing = exporter.export([episode('q', 6, 400)]);
    const outcome = failing.then(
      () => 'resolved',
      (e: unknown) => e,
    );
    for (let i = 0; i < 10; i++) {
      await tick();
      producer.gates.shift()?.();
    }
    expect(await outcome).toBeInstanceOf(ExportError);
    expect(producer.calls).toHaveLength(1);
    expect(producer.sent).toEqual([]);
  });

  it('rejects with a retryable error when the broker is unreachable or answers a retriable error', async () => {
    const { producer, exporter, metrics } = setup();
    producer.connected = false;
    const unreachable = await exporter.export([episode('x', 1)]).catch((e: unknown) => e);
    expect(unreachable).toMatchObject({ retryable: true });
    // Says where the brokers come from.
    expect((unreachable as ExportError).message).toMatch(
      /^exporter kafka: cannot connect to .*\(brokers from exporters\.kafka\.brokers, or LIGHTNING_KAFKA_BROKERS=host:port,host:port\)$/,
    );
    producer.connected = true;
    producer.next = [{ status: 'retryable', error: new Error('NOT_LEADER_OR_FOLLOWER') }];
    const err = await exporter.export([episode('x', 1)]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ExportError);
    expect((err as ExportError).retryable).toBe(true);
    producer.next = [{ status: 'failure', error: new Error('TOPIC_AUTHORIZATION_FAILED'), tooLarge: false }];
    await expect(exporter.export([episode('x', 1)])).rejects.toMatchObject({ retryable: false });
    expect(await metrics.registry.getSingleMetricAsString('lightning_sidecar_export_errors_total')).toMatch(/kind="permanent"\} 1/);
  });

  it('classifies kafkajs errors: retriable, retries exhausted, size and authorization', () => {
    expect(classify(Object.assign(new Error('x'), { retriable: true, type: 'NOT_LEADER_OR_FOLLOWER' })).status).toBe('retryable');
    const exhausted = Object.assign(new Error('retries'), {
      name: 'KafkaJSNumberOfRetriesExceeded',
      retriable: false,
      cause: Object.assign(new Error('t/o'), { retriable: true, type: 'REQUEST_TIMED_OUT' }),
    });
    expect(classify(exhausted).status).toBe('retryable');
    expect(classify(Object.assign(new Error('big'), { retriable: false, type: 'MESSAGE_TOO_LARGE' }))).toMatchObject({ status: 'failure', tooLarge: true });
    expect(classify(Object.assign(new Error('no'), { retriable: false, type: 'TOPIC_AUTHORIZATION_FAILED' }))).toMatchObject({
      status: 'failure',
      tooLarge: false,
    });
    expect(classify(Object.assign(new Error('Connection error: ECONNREFUSED'), { name: 'KafkaJSConnectionError', retriable: true })).status).toBe('retryable');
  });

  it.each(['json', 'protobuf'] as const)('encodes transitions and episodes so they decode to the same record (%s)', (encoding) => {
    const c = episode('enc', 2);
    c.transitions[1] = {
      ...c.transitions[1],
      response_logprobs: null,
      group_id: null,
      tool_calls: [{ id: 'c1', name: 'calc', status: 'error', reward: -0.5, span_id: 'abcdef0123456789', join: 'trace_and_name' }],
      intermediate_reward: -0.5,
    };
    for (const t of c.transitions) expect(decodeTransition(encodeTransition(t, encoding), encoding)).toEqual(t);
    expect(decodeEpisode(encodeEpisode(c.episode, encoding), encoding)).toEqual(c.episode);
  });
});

describe('trajectory routing (routed experts) in JSON and protobuf', () => {
  const writer = new TransitionWriter(() => {
    throw new Error('no journal');
  });
  /** The one trajectory of three continuing calls (308 ids: 307 rows), with `routing` as given. */
  function routed(routing: TrajectoryRecord['routing']): TrajectoryRecord {
    const [t] = continuing('rt').trajectories;
    return { ...t, routing };
  }
  /** 2 layers × top-2 expert ids `i % mod` for every row, rows 0-2 missing (0 there). */
  function routing(make: (n: number) => RoutingArray, mod: number): NonNullable<TrajectoryRecord['routing']> {
    const data = make(307 * 4);
    for (let i = 0; i < data.length; i++) data[i] = i < 3 * 4 ? 0 : (i % mod) - (data instanceof Int16Array || data instanceof Int32Array ? 1 : 0);
    return { rows: 307, layers: 2, topK: 2, data, missing: [[0, 3]], coverage: 1, complete: false, problems: ['rows 0-3 missing'] };
  }

  it('gives the same object, keys in the same order, through either encoding, for every dtype', () => {
    const cases: [string, RoutingArray][] = [
      ['uint8', routing((n) => new Uint8Array(n), 256).data],
      ['int16', routing((n) => new Int16Array(n), 300).data],
      ['uint16', routing((n) => new Uint16Array(n), 40000).data],
      ['int32', routing((n) => new Int32Array(n), 70000).data],
    ];
    for (const [dtype, data] of cases) {
      const t = routed({ ...routing(() => data, 1), data });
      const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
      const proto = decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf');
      expect(proto).toEqual(json);
      expect(Object.keys(proto)).toEqual(Object.keys(json));
      expect(json).toEqual(materializeTrajectory(writer, t));
      const keys = Object.keys(json);
      expect(keys.slice(keys.indexOf('logprobs'), keys.indexOf('turns') + 1)).toEqual([
        'logprobs',
        'routed_experts',
        'routing_coverage',
        'routing_complete',
        'turns',
      ]);
      expect(json.routed_experts).toEqual({ dtype, shape: [307, 2, 2], data: expect.any(String), missing: [[0, 3]] });
      expect(json.token_ids).toHaveLength(308);
      expect([json.routing_coverage, json.routing_complete]).toEqual([1, false]);
      // The base64 is the values' little-endian bytes, C order.
      const bytes = Buffer.from(json.routed_experts!.data, 'base64');
      expect(bytes.equals(Buffer.from(data.buffer, data.byteOffset, data.byteLength))).toBe(true);
    }
  });

  it('carries the values as raw bytes in protobuf, not base64', () => {
    const data = new Uint8Array(307 * 4).fill(0xab);
    const t = routed({ rows: 307, layers: 2, topK: 2, data, missing: [], coverage: 0.5, complete: true, problems: [] });
    const bytes = encodeTrajectory(t, 'protobuf', writer);
    expect(bytes.includes(Buffer.from(data))).toBe(true);
    expect(bytes.includes(Buffer.from(Buffer.from(data).toString('base64')))).toBe(false);
    const back = decodeTrajectory(bytes, 'protobuf');
    expect([back.routed_experts!.missing, back.routing_coverage, back.routing_complete]).toEqual([[], 0.5, true]);
  });

  it('writes routing of many base64 pieces (half a MiB, not a multiple of 3 bytes) as the same values in every writer', () => {
    const data = new Int32Array(307 * 61 * 7);
    for (let i = 0; i < data.length; i++) data[i] = (i * 2654435761) % 70001;
    const bytes = Buffer.from(data.buffer);
    expect(bytes.length % 3).not.toBe(0);
    const t = routed({ rows: 307, layers: 61, topK: 7, data, missing: [], coverage: 1, complete: true, problems: [] });
    const json = encodeTrajectory(t, 'json', writer);
    // The file writer's pieces are the same bytes as the one buffer Kafka's JSON is written into.
    expect(Buffer.concat(trajectoryJsonParts(writer, t).map((p) => (typeof p === 'string' ? Buffer.from(p) : p))).equals(json)).toBe(true);
    const fromJson = decodeTrajectory(json, 'json');
    expect(Buffer.from(fromJson.routed_experts!.data, 'base64').equals(bytes)).toBe(true);
    expect(fromJson.routed_experts!.shape).toEqual([307, 61, 7]);
    expect(decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf')).toEqual(fromJson);
  });

  it('keeps an empty routing (no layers: none of it could be read) as it is, rows and all', () => {
    const t = routed({ rows: 307, layers: 0, topK: 0, data: new Uint8Array(0), missing: [[0, 307]], coverage: 0, complete: false, problems: [] });
    const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
    expect(decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf')).toEqual(json);
    expect(json.routed_experts).toEqual({ dtype: 'uint8', shape: [307, 0, 0], data: '', missing: [[0, 307]] });
  });

  it('has none of the routing keys when no call returned routing, in either encoding', () => {
    const t = routed(null);
    const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
    const proto = decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf');
    for (const x of [json, proto]) for (const k of ['routed_experts', 'routing_coverage', 'routing_complete']) expect(x).not.toHaveProperty(k);
    expect(proto).toEqual(json);
    expect(Object.keys(proto)).toEqual(Object.keys(json));
  });
});

describe('sampling parameters in JSON and protobuf', () => {
  const writer = new TransitionWriter(() => {
    throw new Error('no journal');
  });
  const SAMPLING_KEYS = ['temperature', 'top_p', 'top_k', 'min_p', 'seed', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'max_tokens'];
  /** Numbers a double must carry exactly (an integer beyond 2^32, the smallest normal, a negative top_k), nulls between. */
  const SAMPLINGS: SamplingParams[] = [
    {
      temperature: 0.7,
      top_p: null,
      top_k: null,
      min_p: null,
      seed: 7,
      presence_penalty: null,
      frequency_penalty: null,
      repetition_penalty: null,
      max_tokens: 256,
    },
    {
      temperature: 0,
      top_p: 0.1,
      top_k: -1,
      min_p: 2.2250738585072014e-308,
      seed: 2 ** 53 - 1,
      presence_penalty: -1.5,
      frequency_penalty: 1e-7,
      repetition_penalty: 1.05,
      max_tokens: 1e21,
    },
  ];
  const ALL_NULL = Object.fromEntries(SAMPLING_KEYS.map((k) => [k, null])) as unknown as SamplingParams;

  /** Decoded from both encodings: equal, keys in the same order, nested `sampling` too. */
  function same<T extends object>(json: T, proto: T): void {
    expect(proto).toEqual(json);
    expect(Object.keys(proto)).toEqual(Object.keys(json));
  }

  it("carries a transition's sampling as its last key, every parameter kept, nulls as nulls", () => {
    const c = continuing('ts', true);
    for (const t of c.transitions) {
      // The record as built: the key last, after upstream_replica, all null without a request in the journal.
      expect(Object.keys(t).slice(-2)).toEqual(['upstream_replica', 'sampling']);
      expect(t.sampling).toEqual(ALL_NULL);
    }
    for (const sampling of [...SAMPLINGS, ALL_NULL]) {
      const t = { ...c.transitions[1], sampling };
      const json = decodeTransition(encodeTransition(t, 'json', writer), 'json');
      const proto = decodeTransition(encodeTransition(t, 'protobuf', writer), 'protobuf');
      same(json, proto);
      expect(Object.keys(json).slice(-2)).toEqual(['upstream_replica', 'sampling']);
      expect(json.sampling).toEqual(sampling);
      expect(Object.keys(proto.sampling!)).toEqual(SAMPLING_KEYS);
      expect(proto.sampling).toEqual(sampling);
      // With a prompt delta the delta comes after it, in either encoding.
      const delta = { prompt_token_ids_delta: { previous_transition_id: c.transitions[0].transition_id, prefix_length: 302, suffix: [5] } };
      const jd = decodeTransition(encodeTransition(t, 'json', writer, delta), 'json');
      const pd = decodeTransition(encodeTransition(t, 'protobuf', writer, delta), 'protobuf');
      same(jd, pd);
      expect(Object.keys(pd).slice(-3)).toEqual(['upstream_replica', 'sampling', 'prompt_token_ids_delta']);
    }
  });

  it('gives a transition without sampling no key, in either encoding, the protobuf keys in the JSON order', () => {
    const c = continuing('tn');
    for (const t of c.transitions) {
      expect(t).not.toHaveProperty('sampling');
      const json = decodeTransition(encodeTransition(t, 'json', writer), 'json');
      const proto = decodeTransition(encodeTransition(t, 'protobuf', writer), 'protobuf');
      same(json, proto);
      expect(proto).not.toHaveProperty('sampling');
      expect(Object.keys(proto).at(-1)).toBe('upstream_replica');
    }
  });

  it("carries each trajectory turn's sampling as the turn's last key", () => {
    const [built] = continuing('tj', true).trajectories;
    for (const turn of built.turns) {
      expect(Object.keys(turn).slice(-2)).toEqual(['policy_version', 'sampling']);
      expect(turn.sampling).toEqual(ALL_NULL);
    }
    const t: TrajectoryRecord = { ...built, turns: built.turns.map((turn, i) => ({ ...turn, sampling: [...SAMPLINGS, ALL_NULL][i] })) };
    const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
    const proto = decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf');
    same(json, proto);
    expect(json).toEqual(materializeTrajectory(writer, t));
    expect(json.turns.map((turn) => turn.sampling)).toEqual([...SAMPLINGS, ALL_NULL]);
    proto.turns.forEach((turn, i) => {
      same(json.turns[i], turn);
      expect(Object.keys(turn).slice(-2)).toEqual(['policy_version', 'sampling']);
      expect(Object.keys(turn.sampling!)).toEqual(SAMPLING_KEYS);
    });
    // One turn with, one without: only the first has the key.
    const mixed: TrajectoryRecord = {
      ...built,
      turns: [{ ...built.turns[0], sampling: SAMPLINGS[0] }, ...built.turns.slice(1).map(({ sampling: _, ...u }) => u)],
    };
    const mj = decodeTrajectory(encodeTrajectory(mixed, 'json', writer), 'json');
    const mp = decodeTrajectory(encodeTrajectory(mixed, 'protobuf', writer), 'protobuf');
    same(mj, mp);
    expect(mp.turns.map((turn) => 'sampling' in turn)).toEqual([true, false, false]);
  });

  it("keeps the list of the server's defaults applied, last, in either encoding", () => {
    const [built] = continuing('sd', true).trajectories;
    const sampling: SamplingParams = { ...SAMPLINGS[0], top_k: 20, server_defaults: ['top_k'] };
    const t: TrajectoryRecord = { ...built, turns: built.turns.map((turn) => ({ ...turn, sampling })) };
    const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
    const proto = decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf');
    same(json, proto);
    for (const x of [json, proto]) for (const turn of x.turns) expect(Object.keys(turn.sampling!)).toEqual([...SAMPLING_KEYS, 'server_defaults']);
    expect(proto.turns[0].sampling).toEqual(sampling);
  });

  it('gives trajectory turns without sampling no key, in either encoding', () => {
    const [t] = continuing('tk').trajectories;
    const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
    const proto = decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf');
    same(json, proto);
    for (const turn of [...json.turns, ...proto.turns]) {
      expect(turn).not.toHaveProperty('sampling');
      expect(Object.keys(turn).at(-1)).toBe('policy_version');
    }
  });
});

describe('trajectory weight versions in JSON and protobuf', () => {
  const writer = new TransitionWriter(() => {
    throw new Error('no journal');
  });
  /** The one trajectory of three continuing calls (308 ids; sampled at 300-301, 303-304, 306-307), with `weightVersions` as given. */
  function versioned(weightVersions: WeightVersionSpan[] | null, routing: TrajectoryRecord['routing'] = null): TrajectoryRecord {
    const [t] = continuing('wv').trajectories;
    return { ...t, routing, weightVersions };
  }
  const SPANS: WeightVersionSpan[] = [
    { version: 'step-41', start: 300, end: 302 },
    { version: 'step-41', start: 303, end: 305 },
    { version: 'step-42', start: 306, end: 307 },
    { version: 'step-43', start: 307, end: 308 },
  ];
  function both(t: TrajectoryRecord) {
    const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
    const proto = decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf');
    expect(proto).toEqual(json);
    expect(Object.keys(proto)).toEqual(Object.keys(json));
    expect(json).toEqual(materializeTrajectory(writer, t));
    return { json, proto };
  }
  const around = (o: object) => {
    const keys = Object.keys(o);
    return keys.slice(keys.indexOf('logprobs'), keys.indexOf('turns') + 1);
  };

  it('gives the same spans, keys in the same order, through either encoding, right before turns', () => {
    for (const spans of [SPANS, SPANS.slice(0, 1), [{ version: '', start: 0, end: 0 }]]) {
      const { json, proto } = both(versioned(spans));
      expect(json.weight_versions).toEqual(spans);
      for (const x of [json, proto]) {
        expect(around(x)).toEqual(['logprobs', 'weight_versions', 'turns']);
        for (const s of x.weight_versions!) expect(Object.keys(s)).toEqual(['version', 'start', 'end']);
      }
    }
  });

  it('puts them after the routing keys when the trajectory has both', () => {
    const data = new Uint8Array(307 * 4).fill(3);
    const { json, proto } = both(versioned(SPANS, { rows: 307, layers: 2, topK: 2, data, missing: [], coverage: 1, complete: true, problems: [] }));
    for (const x of [json, proto]) {
      expect(around(x)).toEqual(['logprobs', 'routed_experts', 'routing_coverage', 'routing_complete', 'weight_versions', 'turns']);
      expect(x.weight_versions).toEqual(SPANS);
    }
  });

  it('keeps an empty list as an empty list, not as no key', () => {
    const { json, proto } = both(versioned([]));
    expect(json.weight_versions).toEqual([]);
    expect(proto.weight_versions).toEqual([]);
  });

  it('has no key when no call said, in either encoding, and the records are those of a trajectory without the field', () => {
    const t = versioned(null);
    const { json, proto } = both(t);
    for (const x of [json, proto]) {
      expect(x).not.toHaveProperty('weight_versions');
      expect(around(x)).toEqual(['logprobs', 'turns']);
    }
    const text = encodeTrajectory(t, 'json', writer).toString('utf8');
    expect(text).not.toContain('weight_versions');
    expect(text).toBe(JSON.stringify(materializeTrajectory(writer, t)));
    // Protobuf: no spans and no flag on the wire; an empty list adds only the flag (field 31, varint: 0xf8 0x01 0x01).
    const none = encodeTrajectory(t, 'protobuf', writer);
    const empty = encodeTrajectory(versioned([]), 'protobuf', writer);
    expect(empty.length - none.length).toBe(3);
    expect(empty.includes(Buffer.from([0xf8, 0x01, 0x01]))).toBe(true);
  });
});

describe('trajectory sampling masks in JSON and protobuf', () => {
  const writer = new TransitionWriter(() => {
    throw new Error('no journal');
  });
  /** The trajectory of three continuing calls (308 ids; sampled at 300-301, 303-304, 306-307) with masks on the first two turns. */
  function masked(logprobsMode: string | null, complete = true): TrajectoryRecord {
    const [t] = continuing('sm').trajectories;
    const offsets = new Int32Array(309);
    const rows: Record<number, number[]> = { 300: [5, 6, 7], 301: [8], 303: [9, 10], 304: [11, 12, 13, 14] };
    const ids: number[] = [];
    for (let p = 0; p < 308; p++) {
      ids.push(...(rows[p] ?? []));
      offsets[p + 1] = ids.length;
    }
    const samplingMask = {
      offsets,
      ids: Int32Array.from(ids),
      missing: [[306, 308]] as [number, number][],
      coverage: 4 / 6,
      complete,
      violations: complete ? 0 : 2,
      problems: [],
    };
    return { ...t, weightVersions: [{ version: 'v1', start: 300, end: 308 }], samplingMask, logprobsMode };
  }

  it('gives the same rows, flags and mode through either encoding, after weight_versions and before turns', () => {
    for (const t of [masked('processed_logprobs'), masked(null, false)]) {
      const json = decodeTrajectory(encodeTrajectory(t, 'json', writer), 'json');
      const proto = decodeTrajectory(encodeTrajectory(t, 'protobuf', writer), 'protobuf');
      expect(proto).toEqual(json);
      expect(Object.keys(proto)).toEqual(Object.keys(json));
      expect(json).toEqual(materializeTrajectory(writer, t));
      const keys = Object.keys(json);
      const tail = [
        'weight_versions',
        'sampling_mask',
        'sampling_mask_coverage',
        'sampling_mask_complete',
        'sampling_mask_violations',
        ...(t.logprobsMode ? ['logprobs_mode'] : []),
        'turns',
      ];
      expect(keys.slice(keys.indexOf('weight_versions'), keys.indexOf('turns') + 1)).toEqual(tail);
      const m = json.sampling_mask!;
      expect(m.offsets).toHaveLength(309);
      expect(m.ids.slice(m.offsets[304], m.offsets[305])).toEqual([11, 12, 13, 14]);
      expect(m.missing).toEqual([[306, 308]]);
      expect(json.sampling_mask_complete).toBe(t.samplingMask!.complete);
      expect(json.sampling_mask_violations).toBe(t.samplingMask!.violations);
      if (t.logprobsMode) expect(json.logprobs_mode).toBe('processed_logprobs');
      else expect(json).not.toHaveProperty('logprobs_mode');
    }
  });
});

describe('kafka produce request size', () => {
  /** A broker whose limit is on the compressed batch: `ratio` of the encoded bytes. */
  class CompressingBroker extends FakeProducer {
    sizes: { bytes: number; ok: boolean }[] = [];
    constructor(
      private readonly ratio: number,
      private readonly limit: number,
    ) {
      super();
    }
    override async send(topic: string, messages: OutMessage[]): Promise<SendResult> {
      const bytes = messages.reduce((n, m) => n + m.value.length, 0);
      const ok = bytes * this.ratio <= this.limit;
      if (topic === 'lightning.transitions') this.sizes.push({ bytes, ok });
      if (!ok) return { status: 'failure', error: new Error('MESSAGE_TOO_LARGE'), tooLarge: true };
      return super.send(topic, messages);
    }
  }
  const exporterOn = (producer: Producer, extra: Record<string, unknown>) =>
    createKafkaExporter(kafkaConfig(extra), {
      records: 'transitions',
      producer,
      logger: silentLogger,
      metrics: createMetrics(),
      deadLetterDir: path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-kafka-')), 'dead-letter'),
    });
  const ids = (p: FakeProducer) =>
    p.sent.filter((s) => s.topic === 'lightning.transitions').flatMap((s) => s.messages.map((m) => JSON.parse(m.value.toString()).transition_id as string));

  it('with gzip, lets a request of records that compress well grow to 8x max_batch_bytes, every record in order', async () => {
    // The records here (a long run of one letter) compress ~20x: 8x of 20 KB is estimated to fit.
    const broker = new CompressingBroker(0.1, 1_000_000);
    const exporter = exporterOn(broker, { max_batch_bytes: 20_000 });
    const batch = [episode('g', 120, 1000)];
    await exporter.export(batch);
    const sizes = broker.sizes.map((s) => s.bytes);
    expect(broker.sizes.every((s) => s.ok)).toBe(true);
    const record = Math.max(...broker.sent.flatMap((s) => s.messages.map((m) => m.value.length)));
    for (const b of sizes.slice(0, -1)) {
      expect(b).toBeLessThanOrEqual(160_000);
      expect(b).toBeGreaterThan(160_000 - record);
    }
    expect(ids(broker)).toEqual(batch[0].transitions.map((t) => t.transition_id));
  });

  it('with gzip, a request grows only as far as its records compress within max_batch_bytes', async () => {
    // A broker that gzips each request and takes it when that is within 20 KB.
    class GzipBroker extends FakeProducer {
      sizes: { bytes: number; gzipped: number }[] = [];
      override async send(topic: string, messages: OutMessage[]): Promise<SendResult> {
        const raw = Buffer.concat(messages.map((m) => m.value));
        const gzipped = gzipSync(raw).length;
        if (topic === 'lightning.transitions') this.sizes.push({ bytes: raw.length, gzipped });
        if (gzipped > 20_000) return { status: 'failure', error: new Error('MESSAGE_TOO_LARGE'), tooLarge: true };
        return super.send(topic, messages);
      }
    }
    const broker = new GzipBroker();
    const exporter = exporterOn(broker, { max_batch_bytes: 20_000 });
    // Random text in the requests (base64: it compresses to about three quarters).
    const random = episode('r', 60, 10);
    for (const t of random.transitions) (t as unknown as { request: unknown }).request = { noise: randomBytes(900).toString('base64') };
    await exporter.export([random]);
    expect(broker.sizes.every((s) => s.gzipped <= 20_000)).toBe(true);
    expect(Math.max(...broker.sizes.map((s) => s.bytes))).toBeGreaterThan(20_000);
    expect(Math.max(...broker.sizes.map((s) => s.bytes))).toBeLessThan(80_000);
    expect(ids(broker)).toEqual(random.transitions.map((t) => t.transition_id));
  });

  it('without compression, keeps max_batch_bytes', async () => {
    const broker = new CompressingBroker(1, 1_000_000);
    const exporter = exporterOn(broker, { max_batch_bytes: 20_000, compression: 'none' });
    await exporter.export([episode('n', 60, 1000)]);
    expect(Math.max(...broker.sizes.map((s) => s.bytes))).toBeLessThanOrEqual(20_000);
    expect(broker.sizes.length).toBeGreaterThan(3);
  });

  it('splits a request the broker refuses as too large, and keeps that topic at max_batch_bytes from then on', async () => {
    // The broker's own estimate of compression is worse than the sidecar's: 8x is too large for it.
    const broker = new CompressingBroker(0.5, 50_000);
    const exporter = exporterOn(broker, { max_batch_bytes: 40_000 });
    const first = episode('h', 150, 1000);
    const second = episode('h2', 150, 1000);
    await exporter.export([first]);
    expect(broker.sizes.some((s) => !s.ok)).toBe(true);
    const before = broker.sizes.length;
    await exporter.export([second]);
    expect(broker.sizes.slice(before).every((s) => s.ok && s.bytes <= 40_000)).toBe(true);
    expect(ids(broker)).toEqual([...first.transitions, ...second.transitions].map((t) => t.transition_id));
  });
});
