import { mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startChildSidecar, type ChildSidecar } from '../support/child-sidecar';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest, type Turn } from '../support/fake-model-server';
import { API, ERR, KafkaTestBroker } from '../support/kafka-broker';

/**
 * The soak and its contract checker (the OpenTelemetry Collector testbed's idea, for this
 * product). Every rollout, call, span and reward carries a unique test id. Mixed traffic runs while
 * faults are injected; at the end, what Kafka holds is compared with what the load generator was
 * told: every accepted item is there (duplicates only as same-id redeliveries), nothing unknown
 * appears, and what was refused was refused with a retryable status and retried.
 */

export interface SoakOptions {
  durationMs: number;
  /** Concurrent agents. */
  agents: number;
  /** SIGKILL + restart of the sidecar, at these fractions of the run. */
  killsAt: number[];
  /** Broker down between these fractions. */
  kafkaDown: [number, number] | null;
  /** Broker answers Produce with a retriable error 70 % of the time between these fractions. */
  retryStorm: [number, number] | null;
  journalMaxBytes: number;
  /**
   * Bytes of context (a system message of the rollout's own) that every call of a rollout starts
   * with, so that its second call is journaled as references to its first's bytes; 0 for none.
   * The checker then also compares every exported request's context with what was sent.
   */
  contextBytes?: number;
  log?: (line: string) => void;
}

export interface SoakReport {
  duration_s: number;
  rollouts: { started: number; rewarded: number };
  calls: { attempted: number; accepted: number; retried: number; streamed: number };
  spans: { accepted: number; refused_retryable: number; other_failures: number };
  rewards: { accepted: number; refused_retryable: number };
  kafka: { transitions: number; distinct: number; redelivered: number; episodes: number };
  contract: {
    missing_calls: string[];
    missing_calls_in_kill_window: string[];
    missing_episodes: string[];
    wrong_rewards: string[];
    unknown: string[];
    missing_span_joins: string[];
    /** Transitions whose exported request is not the bytes the agent sent (the context differs). */
    wrong_requests: string[];
    holds: boolean;
  };
  faults: { kills: number; kafka_outage_ms: number; retry_storm_ms: number };
  /**
   * Captures the sidecar dropped, by reason (`lightning_sidecar_capture_drops_total`, summed over
   * its lives). The sidecar serves a call whose capture the journal cannot take (its cap reached)
   * rather than fail it, so a run whose backlog outgrows the journal loses those calls by design.
   */
  capture_drops: Record<string, number>;
  samples: { t_s: number; rss_mib: number; fds: number; journal_bytes: number }[];
  peak: { rss_mib: number; fds: number; journal_bytes: number };
}

const tools = [{ type: 'function', function: { name: 'calculator', parameters: { type: 'object', properties: {} } } }];

/** First call asks for the calculator; after the tool result it answers. */
function script(r: ReceivedRequest): Turn {
  const messages = (r.json?.messages ?? []) as { role: string }[];
  return messages.some((m) => m.role === 'tool') ? { content: 'done' } : { toolCalls: [{ name: 'calculator', arguments: { expression: '1+1' } }] };
}

/** The context every call of `rollout` starts with (its own text, so a reference to another rollout's bytes shows). */
function contextOf(rollout: string, bytes: number): string {
  let out = '';
  for (let i = 0; out.length < bytes; i++) out += `${rollout}: line ${i} of the repository map\n`;
  return out.slice(0, bytes);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function fdCount(pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return -1;
  }
}

function rssMiB(pid: number): number {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024;
  } catch {
    return -1;
  }
}

export async function runSoak(opts: SoakOptions): Promise<SoakReport> {
  const log = opts.log ?? (() => {});
  const broker = new KafkaTestBroker();
  await broker.start();
  const upstream: FakeModelServer = await startFakeModelServer({ flavor: 'vllm', script, chunkDelayMs: 1 });
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-soak-'));
  const env = {
    LIGHTNING_UPSTREAM_URL: upstream.url,
    LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
    LIGHTNING_DATA_DIR: dataDir,
    LIGHTNING_EXPORTER: 'kafka',
    LIGHTNING_KAFKA_BROKERS: broker.brokers.join(','),
    LIGHTNING_TOOL_SPAN_WAIT_MS: '300',
    LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '60000',
    LIGHTNING_LOG_LEVEL: 'warn',
    LIGHTNING_CONFIG: writeConfig(dataDir, opts.journalMaxBytes),
    // SOAK_NODE_OPTIONS: node flags for the sidecar, e.g. --heapsnapshot-signal=SIGUSR2 to look at its heap mid-run.
    ...(process.env.SOAK_NODE_OPTIONS ? { NODE_OPTIONS: process.env.SOAK_NODE_OPTIONS } : {}),
    // glibc's malloc settings (MALLOC_*), as an image or pod would set them.
    ...Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => e[0].startsWith('MALLOC_') && e[1] !== undefined)),
  };
  let sidecar: ChildSidecar = await startChildSidecar(env);
  let restarting: Promise<void> | null = null;
  const kills: number[] = [];

  const report: SoakReport = {
    duration_s: 0,
    rollouts: { started: 0, rewarded: 0 },
    calls: { attempted: 0, accepted: 0, retried: 0, streamed: 0 },
    spans: { accepted: 0, refused_retryable: 0, other_failures: 0 },
    rewards: { accepted: 0, refused_retryable: 0 },
    kafka: { transitions: 0, distinct: 0, redelivered: 0, episodes: 0 },
    contract: {
      missing_calls: [],
      missing_calls_in_kill_window: [],
      missing_episodes: [],
      wrong_rewards: [],
      unknown: [],
      missing_span_joins: [],
      wrong_requests: [],
      holds: false,
    },
    faults: { kills: 0, kafka_outage_ms: 0, retry_storm_ms: 0 },
    capture_drops: {},
    samples: [],
    peak: { rss_mib: 0, fds: 0, journal_bytes: 0 },
  };
  /** test id → when the accepted attempt was sent and when the client had the whole response. */
  const acceptedCalls = new Map<string, { sent: number; done: number }>();
  const acceptedRewards = new Map<string, number>();
  /** rollout → the span id of its accepted tool span and the tool call id it named. */
  const acceptedSpans = new Map<string, { spanId: string; callId: string }>();

  /** Retries an operation while the sidecar restarts or refuses retryably; bounded. */
  async function withRetry<T>(what: () => Promise<T | 'retry'>): Promise<T | null> {
    for (let attempt = 0; attempt < 60; attempt++) {
      if (restarting) await restarting;
      try {
        const r = await what();
        if (r !== 'retry') return r;
      } catch {
        // connection refused or reset: the sidecar is restarting
      }
      await sleep(100);
    }
    return null;
  }

  const context = opts.contextBytes ?? 0;
  async function call(rollout: string, seq: number, messages: unknown[], stream: boolean): Promise<{ toolCallId: string | null } | null> {
    const tid = `tid:${rollout}:${seq}`;
    let tries = 0;
    let sent = 0;
    const result = await withRetry(async () => {
      if (tries++ > 0) report.calls.retried++;
      sent = Date.now();
      report.calls.attempted++;
      const res = await fetch(`${sidecar.origin}/rollout/${rollout}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer sk-soak-secret-999' },
        body: JSON.stringify(
          context > 0
            ? {
                model: 'policy',
                messages: [{ role: 'system', content: contextOf(rollout, context) }, { role: 'user', content: tid }, ...messages],
                tools,
                stream,
              }
            : { model: 'policy', stream, tools, messages: [{ role: 'user', content: tid }, ...messages] },
        ),
      });
      const text = await res.text();
      if (res.status !== 200) return 'retry';
      if (stream && !text.includes('data: [DONE]')) return 'retry';
      let toolCallId: string | null = null;
      if (stream) toolCallId = /"id":"(call_[^"]+)"/.exec(text)?.[1] ?? null;
      else toolCallId = (JSON.parse(text) as { choices: { message: { tool_calls?: { id: string }[] } }[] }).choices[0].message.tool_calls?.[0]?.id ?? null;
      return { toolCallId };
    });
    if (result) {
      acceptedCalls.set(tid, { sent, done: Date.now() });
      report.calls.accepted++;
      if (stream) report.calls.streamed++;
    }
    return result;
  }

  async function span(rollout: string, callId: string, n: number): Promise<void> {
    const spanId = (0x1000000 + n).toString(16).padStart(16, '0');
    const body = JSON.stringify({
      resourceSpans: [
        {
          resource: { attributes: [{ key: 'service.name', value: { stringValue: 'soak-agent' } }] },
          scopeSpans: [
            {
              spans: [
                {
                  traceId: (0x5000000 + n).toString(16).padStart(32, '0'),
                  spanId,
                  name: 'execute_tool calculator',
                  kind: 1,
                  startTimeUnixNano: String(Date.now() * 1e6),
                  endTimeUnixNano: String(Date.now() * 1e6 + 1000),
                  attributes: [
                    { key: 'gen_ai.operation.name', value: { stringValue: 'execute_tool' } },
                    { key: 'gen_ai.tool.name', value: { stringValue: 'calculator' } },
                    { key: 'gen_ai.tool.call.id', value: { stringValue: callId } },
                    { key: 'lightning.rollout_id', value: { stringValue: rollout } },
                  ],
                  status: { code: 1 },
                },
              ],
            },
          ],
        },
      ],
    });
    const ok = await withRetry(async () => {
      const res = await fetch(`http://127.0.0.1:${sidecar.otlpHttpPort}/v1/traces`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      await res.arrayBuffer();
      if (res.status === 200) return true;
      if (res.status === 503 || res.status === 429) report.spans.refused_retryable++;
      else report.spans.other_failures++;
      return 'retry';
    });
    if (ok) {
      report.spans.accepted++;
      acceptedSpans.set(rollout, { spanId, callId });
    }
  }

  async function reward(rollout: string, value: number): Promise<void> {
    const ok = await withRetry(async () => {
      const res = await fetch(`${sidecar.origin}/lightning/v1/rollouts/${rollout}/reward`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ value }),
      });
      await res.arrayBuffer();
      if (res.status === 202) return true;
      if (res.status === 503) report.rewards.refused_retryable++;
      return 'retry';
    });
    if (ok) {
      report.rewards.accepted++;
      acceptedRewards.set(rollout, value);
    }
  }

  const t0 = Date.now();
  const at = (f: number) => t0 + f * opts.durationMs;
  let n = 0;
  const agent = async (a: number): Promise<void> => {
    while (Date.now() < at(1)) {
      const i = n++;
      const rollout = `soak-${a}-${i}`;
      report.rollouts.started++;
      const stream = i % 2 === 1;
      const first = await call(rollout, 0, [], stream);
      if (first?.toolCallId) {
        await span(rollout, first.toolCallId, i);
        await call(
          rollout,
          1,
          [
            { role: 'assistant', content: null, tool_calls: [{ id: first.toolCallId, type: 'function', function: { name: 'calculator', arguments: '{}' } }] },
            { role: 'tool', tool_call_id: first.toolCallId, content: '2' },
          ],
          !stream,
        );
      }
      await reward(rollout, Number(((i % 997) / 1000).toFixed(3)));
    }
  };

  const faults = (async () => {
    const events: [number, () => Promise<void>][] = [];
    if (opts.kafkaDown) {
      const [from, to] = opts.kafkaDown;
      events.push([from, async () => void (await broker.stop(), log('fault: kafka down'))]);
      events.push([to, async () => void (await broker.start(), log('fault: kafka up'))]);
      report.faults.kafka_outage_ms = (to - from) * opts.durationMs;
    }
    if (opts.retryStorm) {
      const [from, to] = opts.retryStorm;
      events.push([from, async () => void (broker.setErrorRate(API.Produce, ERR.NOT_LEADER_OR_FOLLOWER, 0.7), log('fault: 70 % retriable produce errors'))]);
      events.push([to, async () => void (broker.setErrorRate(API.Produce, ERR.NOT_LEADER_OR_FOLLOWER, 0), log('fault: produce errors off'))]);
      report.faults.retry_storm_ms = (to - from) * opts.durationMs;
    }
    for (const k of opts.killsAt) {
      events.push([
        k,
        async () => {
          let done!: () => void;
          restarting = new Promise<void>((r) => (done = r));
          kills.push(Date.now());
          await dropsOfThisLife();
          await sidecar.kill('SIGKILL');
          log('fault: sidecar SIGKILLed');
          // A restart replays the journal: with a long outage's backlog that takes a while (it is
          // ready once replayed), so it gets more than a cold start's time.
          sidecar = await startChildSidecar(env, [], 180_000);
          endLife();
          report.faults.kills++;
          restarting = null;
          done();
        },
      ]);
    }
    events.sort((a, b) => a[0] - b[0]);
    for (const [f, fn] of events) {
      const wait = at(f) - Date.now();
      if (wait > 0) await sleep(wait);
      await fn();
    }
  })();

  // Drop counters start at zero with each life of the sidecar: the last figures read of a life are
  // added up when it is killed.
  let lifeDrops: Record<string, number> = {};
  async function dropsOfThisLife(): Promise<void> {
    const life = sidecar;
    try {
      const text = await (await fetch(`${life.telemetryOrigin}/metrics`, { signal: AbortSignal.timeout(2000) })).text();
      // A reading of a life that has ended since (killed while this was on its way) is not this life's.
      if (life !== sidecar) return;
      for (const m of text.matchAll(/^lightning_sidecar_capture_drops_total\{[^}]*reason="([^"]+)"[^}]*\} (\d+)/gm)) lifeDrops[m[1]] = Number(m[2]);
    } catch {
      // Restarting or busy: the figures read last stand.
    }
  }
  function endLife(): void {
    for (const [reason, n] of Object.entries(lifeDrops)) report.capture_drops[reason] = (report.capture_drops[reason] ?? 0) + n;
    lifeDrops = {};
  }
  const sampler = setInterval(
    () => {
      void dropsOfThisLife();
      const pid = sidecar.proc.pid!;
      const sample = { t_s: (Date.now() - t0) / 1000, rss_mib: rssMiB(pid), fds: fdCount(pid), journal_bytes: dirBytes(path.join(dataDir, 'journal')) };
      report.samples.push(sample);
      report.peak.rss_mib = Math.max(report.peak.rss_mib, sample.rss_mib);
      report.peak.fds = Math.max(report.peak.fds, sample.fds);
      report.peak.journal_bytes = Math.max(report.peak.journal_bytes, sample.journal_bytes);
    },
    Math.max(250, opts.durationMs / 40),
  );

  await Promise.all([faults, ...Array.from({ length: opts.agents }, (_, a) => agent(a))]);
  report.rollouts.rewarded = acceptedRewards.size;

  // Let delivery finish: every rewarded rollout's episode in Kafka (bounded).
  // The broker runs on this event loop: each poll decodes only what arrived since the last one
  // (decoding the whole topic every 200 ms starved the broker of a long run, until the sidecar's
  // produce requests timed out).
  const have = new Set<string>();
  const cursor: number[] = [];
  // A minute at least; a long run's outage (15 % of it) leaves a backlog that grows with its length.
  const until = Date.now() + Math.max(60_000, opts.durationMs / 5);
  let lastLog = 0;
  for (;;) {
    for (const r of broker.recordsSince('lightning.episodes', cursor)) have.add((JSON.parse(r.value!.toString()) as { rollout_id: string }).rollout_id);
    const missing = [...acceptedRewards.keys()].filter((r) => !have.has(r));
    if (missing.length === 0 || Date.now() > until) break;
    if (Date.now() - lastLog > 5000) {
      lastLog = Date.now();
      log(`waiting for ${missing.length} episodes, e.g. ${missing.slice(0, 3).join(', ')}`);
    }
    await sleep(200);
  }
  clearInterval(sampler);
  await dropsOfThisLife();
  endLife();
  report.duration_s = (Date.now() - t0) / 1000;

  // The contract.
  // Only what the checks below need is kept of each transition: a long run with many agents and
  // context puts ~100k of them in the broker, and holding them parsed whole ran out of heap.
  const transitions = broker.records('lightning.transitions').map((r) => {
    const t = JSON.parse(r.value!.toString()) as {
      transition_id: string;
      rollout_id: string;
      request: { messages: { role: string; content: string }[] } | null;
      tool_calls: { id: string; span_id: string | null }[] | null;
    };
    const messages = t.request?.messages;
    return {
      transition_id: t.transition_id,
      tid: messages?.[context > 0 ? 1 : 0]?.content,
      contextOk: context === 0 || messages?.[0]?.content === contextOf(t.rollout_id, context),
      tool_calls: (t.tool_calls ?? []).map((c) => ({ id: c.id, span_id: c.span_id })),
    };
  });
  const seenTids = new Map<string, number>();
  for (const t of transitions) {
    const tid = t.tid;
    if (typeof tid !== 'string' || !tid.startsWith('tid:')) {
      report.contract.unknown.push(t.transition_id);
      continue;
    }
    seenTids.set(tid, (seenTids.get(tid) ?? 0) + 1);
    if (!t.contextOk) report.contract.wrong_requests.push(t.transition_id);
  }
  const generated = new Set<string>();
  for (let a = 0; a < opts.agents; a++) for (let i = 0; i < n; i++) for (const s of [0, 1]) generated.add(`tid:soak-${a}-${i}:${s}`);
  for (const tid of seenTids.keys()) if (!generated.has(tid)) report.contract.unknown.push(tid);
  const distinctIds = new Set(transitions.map((t) => t.transition_id));
  report.kafka = {
    transitions: transitions.length,
    distinct: distinctIds.size,
    redelivered: transitions.length - distinctIds.size,
    episodes: broker.records('lightning.episodes').length,
  };
  for (const [tid, at] of acceptedCalls) {
    if (seenTids.has(tid)) continue;
    // The journal is written through before an answer completes, so no answered call may be
    // missing, kill or not; those near a kill are listed apart to show where a loss came from.
    if (kills.some((k) => k >= at.sent && k <= at.done + 250)) report.contract.missing_calls_in_kill_window.push(tid);
    else report.contract.missing_calls.push(tid);
  }
  const episodes = new Map<string, (number | null)[]>();
  for (const r of broker.records('lightning.episodes')) {
    const e = JSON.parse(r.value!.toString()) as { rollout_id: string; final_reward: number | null };
    episodes.set(e.rollout_id, [...(episodes.get(e.rollout_id) ?? []), e.final_reward]);
  }
  for (const [rollout, value] of acceptedRewards) {
    const rewards = episodes.get(rollout);
    if (!rewards) report.contract.missing_episodes.push(rollout);
    else if (!rewards.includes(value)) report.contract.wrong_rewards.push(rollout);
  }
  // The transition whose tool call the span answered must carry the span (by tool call id).
  const byCallId = new Map<string, { id: string; span_id: string | null }[]>();
  for (const t of transitions) for (const c of t.tool_calls ?? []) if (c.id) byCallId.set(c.id, [...(byCallId.get(c.id) ?? []), c]);
  for (const [rollout, s] of acceptedSpans) {
    const calls = byCallId.get(s.callId);
    if (calls && !calls.some((c) => c.span_id === s.spanId)) report.contract.missing_span_joins.push(rollout);
  }
  const c = report.contract;
  c.holds =
    c.missing_calls.length === 0 &&
    c.missing_calls_in_kill_window.length === 0 &&
    c.missing_episodes.length === 0 &&
    c.wrong_rewards.length === 0 &&
    c.unknown.length === 0 &&
    c.missing_span_joins.length === 0 &&
    c.wrong_requests.length === 0;

  await sidecar.kill('SIGTERM');
  await upstream.close();
  await broker.close();
  return report;
}

function dirBytes(dir: string): number {
  try {
    return readdirSync(dir).reduce((n, f) => n + statSync(path.join(dir, f)).size, 0);
  } catch {
    return 0;
  }
}

function writeConfig(dir: string, maxBytes: number): string {
  const file = path.join(dir, '..', `${path.basename(dir)}.yaml`);
  writeFileSync(file, `service:\n  journal:\n    max_bytes: ${maxBytes}\n    segment_bytes: ${Math.max(65536, Math.floor(maxBytes / 16))}\n`);
  return file;
}
