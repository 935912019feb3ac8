'use strict';
// Kafka export against the project's Kafka test broker (test/support/kafka-broker, compiled to
// build/): journal → Kafka drain rate with acks=-1, end-to-end rate under each fsync policy, and
// reward → delivery lag.
const http = require('node:http');
const path = require('node:path');
const { writeConfig } = require('./lib');

const BROKER = path.join(__dirname, '../build/test/support/kafka-broker/index.js');

function post(port, pathName, body, headers = {}) {
  return new Promise((resolve) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        path: pathName,
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers },
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode));
      },
    );
    req.on('error', () => resolve(0));
    req.end(body);
  });
}

async function until(fn, timeoutMs) {
  const end = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 2));
  }
  return true;
}

/**
 * Drives `rollouts` rollouts of `calls` calls each over 16 connections, then rewards them all.
 * `body`: the request of every call, or a function of the call's index and the prefix giving each
 * call its own.
 */
async function drive(port, body, rollouts, calls, prefix) {
  let next = 0;
  const total = rollouts * calls;
  const bodyOf = typeof body === 'function' ? body : () => body;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < total) {
        const i = next++;
        await post(port, '/v1/chat/completions', bodyOf(i, prefix), { 'x-rollout-id': `${prefix}-${i % rollouts}` });
      }
    }),
  );
  next = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < rollouts) {
        const i = next++;
        await post(port, `/lightning/v1/rollouts/${prefix}-${i}/reward`, '{"value":1}');
      }
    }),
  );
  return total;
}

/** A sidecar exporting per-call transitions to the test broker, episodes open until rewarded. */
function kafkaEnv(broker, extra = {}) {
  return {
    LIGHTNING_EXPORTER: 'kafka',
    LIGHTNING_KAFKA_BROKERS: broker.brokers.join(','),
    LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '600000',
    LIGHTNING_EXPORT_RECORDS: 'transitions',
    ...extra,
  };
}

/** A generator of numbers in [0, 1) from `seed` (deterministic: every run sends the same requests). */
function lcg(seed) {
  return () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
}

/** At least `bytes` of varied words (2-8 random base-36 characters each), space-separated. */
function variedWords(rand, bytes) {
  const words = [];
  for (let n = 0; n < bytes;) {
    const w = Math.floor(rand() * 1e9)
      .toString(36)
      .slice(0, 2 + Math.floor(rand() * 7));
    words.push(w);
    n += w.length + 1;
  }
  return words.join(' ');
}

/** A chat request whose transition is ~64 KB: a long prompt of varied words (as compressible as text). */
const LONG_PROMPT = Buffer.from(
  JSON.stringify({
    model: 'bench-policy',
    messages: [
      { role: 'system', content: 'You are a helpful agent.' },
      { role: 'user', content: variedWords(lcg(7), 60_000) },
    ],
    max_tokens: 64,
  }),
);

/** Prompt text of the varied case's calls, bytes: with the ids and logprobs, transitions of ~4-16 KB. */
const VARIED_PROMPT_BYTES = [800, 5600];

/**
 * The varied case's request for call `i` of the rollouts named `prefix`: a prompt of its own words
 * and of its own size, asking for ids and logprobs as the growing context's agents do. Against the
 * agent model server (which tokenizes the real prompt, ~4 bytes a token) its transition carries
 * the request, the prompt's and the answer's ids and the logprobs: records of 4-16 KB that differ
 * from each other and gzip to ~44 % (measured each run: `gzip_ratio`).
 */
function variedBody(i, prefix) {
  let seed = 17;
  for (const c of `${prefix}-${i}`) seed = (seed * 31 + c.charCodeAt(0)) % 2147483648;
  const rand = lcg(seed);
  rand();
  const [lo, hi] = VARIED_PROMPT_BYTES;
  return Buffer.from(
    JSON.stringify({
      model: 'bench-policy',
      messages: [
        { role: 'system', content: 'You are a coding agent. Use the tools.' },
        { role: 'user', content: variedWords(rand, lo + Math.floor(rand() * (hi - lo))) },
      ],
      return_token_ids: true,
      logprobs: true,
      max_tokens: 128,
    }),
  );
}

/**
 * Journal → broker drain of `rollouts` × `calls` transitions piled up during an outage, then the
 * same messages (values, keys, headers) from a bare kafkajs idempotent producer (acks=-1, same
 * compression) in the fewest sends the same broker takes: records/s and bytes/s for both, the
 * sends each took, the records' sizes (min, median, max) and how well they compress together.
 * `modelPort`: the model server the sidecar calls; `body`: as `drive` takes it.
 */
async function drainCase(startKafkaTestBroker, { modelPort, startSidecar, stop }, body, rollouts, calls) {
  const broker = await startKafkaTestBroker();
  // Per-call transitions: many records of a known size, comparable from run to run.
  const sc = await startSidecar(modelPort, kafkaEnv(broker));
  const count = () => broker.recordCount('lightning.transitions');
  // A sidecar that has exported before the outage, as one in service has (its Kafka client warm,
  // as the bare producer's is): a few rollouts delivered, then the outage.
  const warm = await drive(sc.port, body, Math.max(2, Math.round(rollouts / 10)), calls, 'warm');
  await until(() => count() >= warm, 60_000);
  await new Promise((r) => setTimeout(r, 300)); // the episodes' summaries follow their transitions
  const before = count();
  // Record batches stored so far, per partition: each of the drain's produce requests adds one
  // to the topic (its single partition), so what this grows by is the sidecar's sends.
  const cursor = [];
  broker.recordsSince('lightning.transitions', cursor);
  const batchesBefore = cursor.reduce((n, b) => n + b, 0);
  broker.refuseConnections(true);
  const total = await drive(sc.port, body, rollouts, calls, 'drain');
  await new Promise((r) => setTimeout(r, 500));
  broker.refuseConnections(false);
  // Polled every 2 ms: counted without decoding what the broker holds (records() decodes every batch).
  const drained = () => count() - before;
  await until(() => drained() > 0, 60_000);
  const t0 = performance.now();
  const complete = await until(() => drained() >= total, 120_000);
  const s = (performance.now() - t0) / 1000;
  const records = broker.recordsSince('lightning.transitions', cursor).filter((r) => r.headers['rollout-id']?.toString().startsWith('drain-'));
  const bytes = records.reduce((n, r) => n + (r.value ? r.value.length : 0), 0);
  const sizes = records.map((r) => (r.value ? r.value.length : 0)).sort((a, b) => a - b);
  const out = {
    transitions: total,
    warm_up_transitions: warm,
    delivered: records.length,
    complete,
    transitions_per_s: records.length / s,
    bytes_per_s: bytes / s,
    avg_record_bytes: bytes / Math.max(1, records.length),
    record_bytes: { min: sizes[0], median: sizes[Math.floor(sizes.length / 2)], max: sizes[sizes.length - 1] },
    sends: cursor.reduce((n, b) => n + b, 0) - batchesBefore,
    acks: -1,
  };
  await stop(sc.proc);

  const messages = records.map((r) => ({ key: r.key, value: r.value, headers: r.headers }));
  const { Kafka, CompressionTypes, logLevel } = require('kafkajs');
  const kafka = new Kafka({ brokers: broker.brokers, logLevel: logLevel.NOTHING, clientId: 'bench-bare' });
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  // As few sends as the broker takes: parts whose gzip-compressed size stays under its 1 MB
  // record-batch limit (the compression ratio measured before the clock starts); one send when
  // everything fits.
  const raw = messages.reduce((n, m) => n + m.value.length, 0);
  const ratio = require('node:zlib').gzipSync(Buffer.concat(messages.map((m) => m.value))).length / Math.max(1, raw);
  out.gzip_ratio = ratio;
  const budget = 900_000 / Math.max(ratio, 1e-3);
  const parts = [];
  for (let i = 0, size = 0; i < messages.length; i++) {
    if (parts.length === 0 || size + messages[i].value.length > budget) {
      parts.push([]);
      size = 0;
    }
    parts[parts.length - 1].push(messages[i]);
    size += messages[i].value.length;
  }
  // Warm, as the sidecar is: the same sends once, untimed, to another topic.
  for (const part of parts) await producer.send({ topic: 'bench.bare.warm', acks: -1, compression: CompressionTypes.GZIP, messages: part });
  const b0 = performance.now();
  for (const part of parts) await producer.send({ topic: 'bench.bare', acks: -1, compression: CompressionTypes.GZIP, messages: part });
  const bs = (performance.now() - b0) / 1000;
  await producer.disconnect();
  out.bare_producer = {
    sends: parts.length,
    compression_ratio: ratio,
    messages: messages.length,
    delivered: broker.records('bench.bare').length,
    messages_per_s: messages.length / bs,
    bytes_per_s: bytes / bs,
    acks: -1,
  };
  out.vs_bare = out.transitions_per_s / out.bare_producer.messages_per_s;
  await broker.close();
  return out;
}

async function benchKafka({ modelPort, agentModelPort, startSidecar, stop, quick, body }) {
  const { startKafkaTestBroker } = require(BROKER);
  const out = {};
  const rollouts = quick ? 50 : 250;
  const calls = 20;

  // Drain: transitions pile up in the journal while the broker refuses connections, then flow;
  // at ~2 KB records (the JSON scenario's call, the same every call: the bare producer sends them
  // all in one send), at ~64 KB (a long prompt) and at 4-16 KB records that differ from each other
  // (each call's own prompt of its own size, against the agent model server: ids of the real
  // prompt; neither side gets one send), each against a bare kafkajs producer sending the same
  // messages.
  // A drain of 5,000 records lasts about half a second, and one run's ratio moved 0.34-0.68 from
  // run to run on this machine: each case runs three times, and the run with the median ratio is
  // the figure (every run's ratio is kept beside it).
  const median = async (n, one) => {
    const runs = [];
    for (let i = 0; i < n; i++) runs.push(await one());
    const byRatio = [...runs].sort((a, b) => a.vs_bare - b.vs_bare);
    return { ...byRatio[Math.floor(runs.length / 2)], runs_vs_bare: runs.map((r) => r.vs_bare) };
  };
  const runs = quick ? 1 : 3;
  out.drain = await median(runs, () => drainCase(startKafkaTestBroker, { modelPort, startSidecar, stop }, body, rollouts, calls));
  out.bare_producer = out.drain.bare_producer;
  out.drain_vs_bare = out.drain.vs_bare;
  out.drain_64k = await median(runs, () => drainCase(startKafkaTestBroker, { modelPort, startSidecar, stop }, LONG_PROMPT, quick ? 10 : 30, calls));
  if (agentModelPort)
    out.drain_varied = await median(runs, () =>
      drainCase(startKafkaTestBroker, { modelPort: agentModelPort, startSidecar, stop }, variedBody, quick ? 25 : 100, calls),
    );

  // Bytes a growing-context episode puts on Kafka: per-call transitions with full prompts and
  // with prompt deltas, and trajectories (the default) in JSON and protobuf, each trajectory
  // checked against what its agent sent.
  if (agentModelPort) {
    const { runAgents, verifyTrajectories } = require('./growing-context');
    const broker = await startKafkaTestBroker();
    const agents = quick ? 4 : 8;
    const turns = quick ? 12 : 24;
    out.growing_bytes = { agents, turns };
    const modes = [
      { mode: 'full', records: 'transitions', config: 'prompt_ids: full' },
      { mode: 'delta', records: 'transitions', config: 'prompt_ids: delta' },
      { mode: 'trajectories_json', records: 'trajectories', config: 'encoding: json' },
      { mode: 'trajectories_protobuf', records: 'trajectories', config: 'encoding: protobuf' },
    ];
    for (const { mode, records, config } of modes) {
      const topic = `growing.${mode}`;
      const sc = await startSidecar(agentModelPort, {
        LIGHTNING_EXPORTER: 'kafka',
        LIGHTNING_KAFKA_BROKERS: broker.brokers.join(','),
        LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '600000',
        LIGHTNING_EXPORT_RECORDS: records,
        LIGHTNING_CONFIG: writeConfig(`exporters:\n  kafka:\n    topic: ${topic}\n    trajectories_topic: ${topic}\n    ${config}\n`),
      });
      const run = await runAgents({ port: sc.port, agents, turns, prefix: `gb-${mode}` });
      for (let a = 0; a < agents; a++) await post(sc.port, `/lightning/v1/rollouts/gb-${mode}-${a}/end`, '{}');
      const records_ = () => broker.records(topic);
      // Whole records = unchunked messages + last chunks; bytes = every message's value.
      const whole = () =>
        records_().filter((r) => !r.headers['lightning-chunk'] || r.headers['lightning-chunk-index'] === String(Number(r.headers['lightning-chunk-count']) - 1))
          .length;
      await until(() => whole() >= agents * (records === 'transitions' ? turns : 1), 120_000);
      const bytes = records_().reduce((n, r) => n + (r.value ? r.value.length : 0), 0);
      out.growing_bytes[mode] = {
        records: whole(),
        messages: records_().length,
        bytes_per_record: bytes / Math.max(1, whole()),
        bytes_per_episode: bytes / agents,
      };
      if (records === 'trajectories')
        Object.assign(
          out.growing_bytes[mode],
          checkTrajectories(reassembled(records_()), mode.endsWith('protobuf') ? 'protobuf' : 'json', run, verifyTrajectories),
        );
      await stop(sc.proc);
    }
    await broker.close();
  }

  // End to end (proxied calls → journal → Kafka) under each fsync policy.
  for (const fsync of ['always', '1000', 'never']) {
    const broker = await startKafkaTestBroker();
    const sc = await startSidecar(modelPort, kafkaEnv(broker, { LIGHTNING_CONFIG: writeFsyncConfig(fsync) }));
    const t0 = performance.now();
    const total = await drive(sc.port, body, Math.round(rollouts / 2), calls, `e2e-${fsync}`);
    const complete = await until(() => broker.recordCount('lightning.transitions') >= total, 120_000);
    const s = (performance.now() - t0) / 1000;
    out[`end_to_end_fsync_${fsync}`] = { transitions: total, complete, transitions_per_s: broker.recordCount('lightning.transitions') / s };

    // Lag: one call, a final reward, then poll the broker for the transition.
    if (fsync === '1000') {
      const lags = [];
      for (let i = 0; i < (quick ? 10 : 40); i++) {
        const id = `lag-${i}`;
        await post(sc.port, '/v1/chat/completions', body, { 'x-rollout-id': id });
        const before = broker.recordCount('lightning.transitions');
        const t = performance.now();
        await post(sc.port, `/lightning/v1/rollouts/${id}/reward`, '{"value":1}');
        await until(() => broker.recordCount('lightning.transitions') > before, 10_000);
        lags.push(performance.now() - t);
      }
      lags.sort((a, b) => a - b);
      out.reward_to_delivery_ms = {
        p50: lags[Math.floor(lags.length / 2)],
        p99: lags[Math.min(lags.length - 1, Math.floor(lags.length * 0.99))],
        samples: lags.length,
      };
    }
    await stop(sc.proc);
    await broker.close();
  }
  return out;
}

/** Whole record values from messages of one partition in order (chunks joined). */
function reassembled(messages) {
  const out = [];
  let parts = [];
  for (const m of messages) {
    if (!m.headers['lightning-chunk']) {
      out.push(m.value);
      continue;
    }
    parts.push(m.value);
    if (m.headers['lightning-chunk-index'] === String(Number(m.headers['lightning-chunk-count']) - 1)) {
      out.push(Buffer.concat(parts));
      parts = [];
    }
  }
  return out;
}

/**
 * Trajectories read back from Kafka: decoded (protobuf with the sidecar's own decoder), written to
 * a file as a consumer would see them and checked as the growing context's are; and each record's
 * size against its own token_ids, loss_mask and logprobs arrays in the same encoding.
 */
function checkTrajectories(values, encoding, run, verifyTrajectories) {
  const fs = require('node:fs');
  const os = require('node:os');
  const { decodeTrajectory } = require('../dist/exporters/kafka/encoding');
  const protobuf = require('protobufjs');
  const type = new protobuf.Root()
    .loadSync(path.join(__dirname, '../proto/lightning/v1/records.proto'), { keepCase: true })
    .lookupType('lightning.v1.Trajectory');
  let maxRatio = 0;
  const lines = [];
  for (const v of values) {
    const t = decodeTrajectory(v, encoding);
    lines.push(JSON.stringify(t));
    const arrays =
      encoding === 'json'
        ? JSON.stringify(t.token_ids).length + JSON.stringify(t.loss_mask).length + JSON.stringify(t.logprobs).length
        : type.encode(type.fromObject({ token_ids: t.token_ids, loss_mask: t.loss_mask, logprobs: t.logprobs ?? [] })).finish().length;
    maxRatio = Math.max(maxRatio, v.length / arrays);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-trajectories-'));
  fs.mkdirSync(path.join(dir, 'trajectories'));
  fs.writeFileSync(path.join(dir, 'trajectories', 'read-back.ndjson'), lines.join('\n') + '\n');
  const v = verifyTrajectories(dir, run.conversations[0].rollout.replace(/-\d+$/, ''), run.conversations);
  fs.rmSync(dir, { recursive: true, force: true });
  return { checked_rollouts: v.rollouts, wrong: v.wrong, max_record_to_arrays: maxRatio };
}

function writeFsyncConfig(fsync) {
  return writeConfig(`service:\n  journal:\n    fsync: ${fsync === 'always' || fsync === 'never' ? fsync : Number(fsync)}\n`);
}

module.exports = { benchKafka, drainCase, LONG_PROMPT, variedBody };
