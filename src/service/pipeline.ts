import { appendFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import type { Config } from '../config/schema';
import type { Exporter } from '../exporters/exporter';
import { isBodyPayload, readBodyHeader } from '../journal/frame';
import { Journal, type RecoveryReport } from '../journal/journal';
import { BaseStore, BodyWriter } from '../journal/repeats';
import { Spill, type SpillRef } from '../journal/spill';
import { EpisodeAssembler, keyOf, type EpisodeClose } from '../processors/episodes/assembler';
import type { Logger } from '../telemetry/logger';
import type { Metrics } from '../telemetry/metrics';
import { once, RefusedError, RejectedError, type CaptureSink } from '../model/component';
import type { CallRecord, CallStartRecord, ClosedEpisode, EpisodeStatus, PipelineRecord } from '../model/records';
import type { SequenceCounter } from '../model/sequence';
import { spanRecords, TraceRouter, type SpanObservation } from './span-router';

/** Journal markers: where an episode closed, and how far delivery got. */
export interface EpisodeClosedMarker {
  type: 'episode_closed';
  rolloutId: string;
  attemptId: string;
  status: EpisodeStatus;
  at: number;
}
export interface DeliveredMarker {
  type: 'delivered';
  /** Every episode whose close marker is at or below this offset is delivered. */
  upTo: number;
}
export type JournalRecord = Exclude<PipelineRecord, { type: 'tool_span' } | { type: 'agent_span' }> | SpanObservation | EpisodeClosedMarker | DeliveredMarker;

/** Closed episodes exported in one batch at most, and how long a first one waits for company. */
const EXPORT_BATCH = 64;
const EXPORT_LINGER_MS = 20;
/**
 * Memory the bytes of open rollouts' latest bodies may keep alive (each later body is compared
 * with them byte for byte); beyond it the least recently used keep block digests instead.
 */
const MAX_BASE_BYTES = 32 * 1024 * 1024;

interface Queued {
  /** What closed; null while it waits on disk (`spilled`). */
  close: EpisodeClose | null;
  /** Where it waits on disk, when the backlog in memory is full (`export_backlog_memory_records`). */
  spilled: SpillRef | null;
  /** Lowest journal offset among its records (what must be kept until delivery). */
  firstOffset: number;
  /** Its transitions, built when its batch is first exported. */
  built: ClosedEpisode | null;
  /** It could not be built: left out of the export. */
  quarantined?: boolean;
  /** Offset of its close marker; set once the marker is appended. */
  marker: number;
  durable: Promise<unknown>;
  /** Records it holds (see `max_export_backlog`), in memory unless spilled. */
  weight: number;
}

export interface PipelineDeps {
  logger: Logger;
  metrics: Metrics;
  exporter: Exporter;
  /** Seeded from replayed calls so new calls of a resumed rollout continue its `seq`. */
  sequences?: SequenceCounter;
  now?: () => number;
}

/**
 * Records in, closed episodes out. Every record is appended to the journal first: its offset
 * is assigned synchronously and the record is applied to the assembler in that order, so a
 * replay of the journal rebuilds the same state. Intake is acknowledged once the record is
 * durable. Episode closes and deliveries are journaled as markers; closed episodes go to the
 * exporter in close order, retried with backoff; segments below the lowest offset still needed
 * are deleted.
 */
export function createPipeline(config: Config, deps: PipelineDeps) {
  const log = deps.logger.child('pipeline');
  const m = deps.metrics;
  const now = deps.now ?? Date.now;
  const dataDir = path.resolve(config.service.data_dir);
  const j = config.service.journal;
  const journal = new Journal(
    { dir: path.join(dataDir, 'journal'), fsync: j.fsync, maxBytes: j.max_bytes, segmentBytes: j.segment_bytes, highWatermark: j.high_watermark },
    log.child('journal'),
  );
  m.journalHighWatermark.set(Math.floor(j.max_bytes * j.high_watermark));
  // Started at 0 so an alert's increase() sees the first error.
  for (const kind of ['retryable', 'permanent']) m.exportErrors.inc({ exporter: deps.exporter.name, kind }, 0);
  const read = (offsets: readonly number[], scratch?: Buffer) => journal.readBodies(offsets, scratch);
  const assembler = new EpisodeAssembler({
    episodes: config.processors.episodes,
    credit: config.processors.credit,
    air: config.processors.air,
    capture: config.processors.capture,
    read,
    records: config.exporters.records,
    onLate: (kind, rolloutId, attemptId) => {
      const outcome = kind === 'call' ? 'new_episode' : 'dropped';
      m.lateRecords.inc({ kind, outcome });
      warnLimited(
        `late_${kind}`,
        kind === 'call'
          ? 'a call came after its episode closed; it starts a new episode with the same rollout and attempt ids'
          : `a ${kind.replace('_', ' ')} came after its episode closed (it was in flight or waited for its trace); dropped`,
        { rollout_id: rolloutId, attempt_id: attemptId },
      );
    },
  });
  /** Last warning per key and how many were held back since: at most one line per key each 10 s. */
  const warned = new Map<string, { at: number; suppressed: number }>();
  function warnLimited(key: string, msg: string, fields: object): void {
    const at = Date.now();
    const last = warned.get(key);
    if (last && at - last.at < 10_000) {
      last.suppressed++;
      return;
    }
    log.warn(msg, last?.suppressed ? { ...fields, suppressed_since_last: last.suppressed } : fields);
    warned.set(key, { at, suppressed: 0 });
  }
  const router = new TraceRouter({ waitMs: config.processors.spans.unattributed_wait_ms, maxParked: config.processors.spans.max_pending_spans });
  const queue: Queued[] = [];
  /**
   * Records (calls, spans, rewards) the queued episodes hold in memory. While the exporter is away
   * closed episodes wait here; above `max_export_backlog` intake is refused as when the journal is
   * full, so memory stays bounded even under a journal cap larger than memory.
   */
  let backlog = 0;
  const maxBacklog = config.service.max_export_backlog;
  /**
   * Past this many records in memory, closed episodes wait for the exporter on disk (a copy of
   * their facts, which the journal holds too) and are read back when their batch is built: an
   * exporter outage costs disk, not memory. The first batches due stay in memory.
   */
  let inMemory = 0;
  const maxInMemory = config.service.export_backlog_memory_records;
  const spill = new Spill(path.join(dataDir, 'spill'));
  let pumping: Promise<void> | null = null;
  let timer: NodeJS.Timeout | null = null;
  let backoffMs = 0;
  let stopping = false;
  let recovery: RecoveryReport | null = null;
  /** Delivered batches whose delivered marker is not written yet: the first offset of their episodes, kept. */
  let unmarked: { upTo: number; floor: number }[] = [];

  /**
   * Calls of a rollout in flight, by call id: their bodies are journaled as what they add to the
   * rollout's previous call (see journal/repeats.ts). `floor` is the first offset of the call's
   * open episode: an older base is not used, and nothing from `floor` on is released while the call
   * is in flight (its references are written as it goes), so a reference never outlives what it
   * names. `failures` is the journal's count of failed writes when the call began: a call that saw
   * one may name frames that never reached the file, and is no base for the next.
   */
  const writing = new Map<number, { key: string; floor: number; failures: number; request: BodyWriter | null; response: BodyWriter | null }>();
  const maxBases = config.processors.episodes.max_open_episodes;
  /** The bodies of each rollout attempt's latest complete call, while its episode is open. */
  const bases = new BaseStore<string>(maxBases, MAX_BASE_BYTES);
  let basesFailures = 0;

  function writerFor(callId: number, kind: 'request' | 'response'): BodyWriter | null {
    const w = writing.get(callId);
    if (!w) return null;
    const existing = w[kind];
    if (existing) return existing;
    if (basesFailures !== journal.writeFailures) {
      // A write failed: a base may name frames that are not in the journal.
      bases.clear();
      basesFailures = journal.writeFailures;
    }
    const base = bases.get(w.key, kind);
    return (w[kind] = new BodyWriter(journal, callId, kind, base && base.lowest >= w.floor ? base : null));
  }

  function keepBases(record: CallRecord): void {
    const w = record.callId === undefined ? undefined : writing.get(record.callId);
    if (!w) return;
    writing.delete(record.callId!);
    const usable = record.status === 'ok' && !record.truncated && record.httpStatus !== null && record.httpStatus < 300 && w.failures === journal.writeFailures;
    if (usable) bases.set(w.key, w.request?.result() ?? null, w.response?.result() ?? null);
    w.request?.close();
    w.response?.close();
  }

  /** The lowest offset a call in flight may still name in a reference. */
  function writingFloor(): number {
    let low = Infinity;
    for (const w of writing.values()) low = Math.min(low, w.floor);
    return low;
  }

  /** Applies one journaled record; returns what closed. */
  function applyRecord(record: JournalRecord, offset: number): EpisodeClose[] {
    switch (record.type) {
      case 'span': {
        const r = router.route(record, offset);
        if (r === 'parked') return [];
        if (r === 'dropped') {
          m.spansClassified.inc({ kind: record.what.kind, result: 'dropped' });
          log.once('parked_full', 'warn', 'too many spans wait for their rollout; dropping new ones', {
            max_pending_spans: config.processors.spans.max_pending_spans,
          });
          return [];
        }
        return spanRecords(record, r).flatMap((rec) => assembler.step(rec, offset));
      }
      case 'call_start': {
        const closed = assembler.step(record, offset);
        if (record.traceId) {
          const released = router.noteTrace(record.traceId, { rolloutId: record.correlation.rolloutId, attemptId: record.correlation.attemptId });
          for (const p of released) for (const rec of spanRecords(p.observation, record.correlation)) closed.push(...assembler.step(rec, p.offset));
        }
        return closed;
      }
      case 'episode_closed': {
        const c = assembler.forceClose(record.rolloutId, record.attemptId, record.status, record.at);
        return c ? [c] : [];
      }
      case 'delivered': {
        let n = 0;
        while (n < queue.length && queue[n].marker <= record.upTo) n++;
        dequeue(n);
        return [];
      }
      default:
        return assembler.step(record, offset);
    }
  }

  function queued(close: EpisodeClose, marker: number, durable: Promise<unknown>): void {
    const f = close.facts;
    const weight = f.calls.length + f.toolSpans.length + f.rewards.length + (f.agentSpans?.length ?? 0);
    const q: Queued = { close, spilled: null, firstOffset: close.firstOffset, built: null, marker, durable, weight };
    if (inMemory + weight > maxInMemory && queue.length >= 2 * EXPORT_BATCH) {
      try {
        q.spilled = spill.write(close);
        q.close = null;
      } catch (err) {
        log.once('spill', 'warn', 'closed episodes cannot wait on disk; they wait in memory', { err, dir: path.join(dataDir, 'spill') });
      }
    }
    if (q.close) inMemory += weight;
    queue.push(q);
    backlog += weight;
    updateBacklogMetrics();
  }

  /** The first `n` queued episodes are delivered. */
  function dequeue(n: number): void {
    for (const q of queue.splice(0, n)) {
      backlog -= q.weight;
      if (q.spilled) spill.release(q.spilled);
      else inMemory -= q.weight;
    }
    updateBacklogMetrics();
  }

  function updateBacklogMetrics(): void {
    m.exportBacklog.set(backlog);
    m.exportBacklogSpilled.set(backlog - inMemory);
  }

  /** What closed, read back from disk when it waited there. */
  function closeOf(q: Queued): EpisodeClose {
    return q.close ?? (spill.read(q.spilled!) as EpisodeClose);
  }

  /** Journals close markers for what the rules closed (live), queues them for export. */
  function enqueue(closed: EpisodeClose[], replayMarker?: number): void {
    for (const c of closed) {
      const { rolloutId, attemptId } = c.facts;
      // Its calls are no base for a later episode's.
      bases.delete(keyOf(rolloutId, attemptId));
      // A replayed close was counted by the process that closed it.
      if (replayMarker === undefined) m.episodesClosed.inc({ status: c.status });
      if (replayMarker !== undefined || c.closedByRecord !== undefined) {
        // Replayed, or closed by its own record (which a replay closes again): no marker to journal.
        queued(c, c.closedByRecord ?? replayMarker!, Promise.resolve());
        continue;
      }
      const marker: EpisodeClosedMarker = { type: 'episode_closed', rolloutId, attemptId, status: c.status, at: c.facts.endedAt };
      try {
        const { offset, durable } = journal.append(Buffer.from(JSON.stringify(marker)), true);
        queued(c, offset, durable);
      } catch (err) {
        // The journal refuses (full/closed): export anyway; a replay may close this episode again.
        log.once('marker', 'warn', 'journal refused a close marker; exporting without it', { err });
        queued(c, -1, Promise.resolve());
      }
    }
    m.openEpisodes.set(assembler.openCount);
    if (!stopping || closed.length > 0) pump();
  }

  /**
   * A queued episode's transitions, built once (their calls' facts extracted from the journal).
   * An episode that cannot be built is quarantined and left out of its batch, as a record that
   * cannot be processed is: it must not hold every later export back.
   */
  function built(q: Queued): ClosedEpisode | null {
    if (q.built !== null || q.quarantined) return q.built;
    let c: ClosedEpisode;
    let close: EpisodeClose | null = null;
    try {
      close = closeOf(q);
      c = q.built = assembler.build(close);
    } catch (err) {
      q.quarantined = true;
      const episode = close
        ? { rolloutId: close.facts.rolloutId, attemptId: close.facts.attemptId, status: close.status, calls: close.facts.calls.map((call) => call.callId) }
        : { spilled: q.spilled };
      quarantine(q.marker, { episode }, err);
      return null;
    }
    m.trajectorySegments.observe(c.trajectories.length);
    for (const t of c.trajectories) {
      m.trajectoryTokens.observe(t.length);
      m.trajectoryCalls.inc({ outcome: 'new_segment', reason: t.start_reason });
      if (t.turns.length > 1) m.trajectoryCalls.inc({ outcome: 'merged', reason: 'continued' }, t.turns.length - 1);
    }
    for (const u of c.episode.unmerged_calls) m.trajectoryCalls.inc({ outcome: 'left_out', reason: u.reason });
    for (const t of c.transitions) {
      if (t.choice_index === 0) countTokens(t);
      for (const tc of t.tool_calls) {
        m.toolSpans.inc({ outcome: tc.status ?? 'unobserved' });
        if (tc.reward !== null) m.airRewards.observe(tc.reward);
      }
    }
    return c;
  }

  /** The batch's episodes, built (those that cannot be are left out). */
  function ready(batch: Queued[]): ClosedEpisode[] {
    const out: ClosedEpisode[] = [];
    for (const q of batch) {
      const c = built(q);
      if (c) out.push(c);
    }
    return out;
  }

  function pump(): void {
    if (pumping || queue.length === 0 || recovery === null) return;
    pumping = lingerThenDrain().finally(() => {
      pumping = null;
      if (queue.length > 0 && !stopping) pump();
    });
  }

  /**
   * Episodes that close within 20 ms of each other are exported together (up to 64): one write
   * or produce request, one delivery marker and one release for many (as a Kafka producer's linger).
   */
  async function lingerThenDrain(): Promise<void> {
    if (!stopping && queue.length < EXPORT_BATCH) await new Promise((r) => setTimeout(r, EXPORT_LINGER_MS).unref());
    await drainQueue();
  }

  async function drainQueue(): Promise<void> {
    while (queue.length > 0) {
      const batch = queue.slice(0, EXPORT_BATCH);
      await Promise.all(batch.map((q) => q.durable.catch(() => {})));
      try {
        const exporting = deps.exporter.export(ready(batch), read);
        // While the exporter waits on the broker, the next batch is built (extraction is CPU work).
        for (let i = batch.length; i < Math.min(queue.length, 2 * EXPORT_BATCH); i++) built(queue[i]);
        await exporting;
      } catch (err) {
        m.exportErrors.inc({ exporter: deps.exporter.name, kind: 'retryable' });
        backoffMs = Math.min(Math.max(backoffMs * 2, 100), 10_000);
        log.once('export_failed', 'error', 'export failed; retrying with backoff', { err, exporter: deps.exporter.name });
        if (stopping) throw err;
        await new Promise((r) => setTimeout(r, backoffMs).unref());
        continue;
      }
      backoffMs = 0;
      const delivered = ready(batch);
      dequeue(batch.length);
      const records = config.exporters.records;
      if (records !== 'trajectories')
        m.transitionsExported.inc(
          { exporter: deps.exporter.name },
          delivered.reduce((n, c) => n + c.transitions.length, 0),
        );
      if (records !== 'transitions')
        m.trajectoriesExported.inc(
          { exporter: deps.exporter.name },
          delivered.reduce((n, c) => n + c.trajectories.length, 0),
        );
      const deliveredAt = Date.now();
      for (const c of delivered) for (const t of c.transitions) m.exportLag.observe(Math.max(0, deliveredAt - Date.parse(t.ended_at)) / 1000);
      const upTo = Math.max(...batch.map((q) => q.marker));
      if (upTo >= 0) {
        // Until the marker is written a replay exports these episodes again, reading their bodies:
        // what they need stays in the journal until then (a later marker, covering these, does too).
        unmarked.push({ upTo, floor: Math.min(...batch.map((q) => q.firstOffset)) });
        try {
          // Lazy: it goes with the next write (within a few ms); the release waits for it.
          const { durable } = journal.append(Buffer.from(JSON.stringify({ type: 'delivered', upTo } satisfies DeliveredMarker)), true, true);
          durable.then(
            () => {
              unmarked = unmarked.filter((u) => u.upTo > upTo);
              return release();
            },
            () => {
              // Not written: a replay exports these again (at-least-once, same transition ids), so they stay.
            },
          );
        } catch {
          // Not appended: as above.
        }
      }
      await release();
    }
  }

  async function release(): Promise<void> {
    // A loop, not a spread: the queue can hold hundreds of thousands of episodes after a long
    // outage, more arguments than a call can take.
    let low = Math.min(assembler.minOffset(), router.minParkedOffset(), writingFloor(), journal.next);
    for (const q of queue) if (q.firstOffset < low) low = q.firstOffset;
    for (const u of unmarked) if (u.floor < low) low = u.floor;
    const removed = await journal.release(low).catch((err) => {
      log.once('release', 'error', 'journal: could not delete delivered segments', { err });
      return 0;
    });
    if (removed > 0) updateJournalMetrics();
  }

  function updateJournalMetrics(): void {
    m.journalBytes.set(journal.bytes);
    m.journalSegments.set(journal.segmentCount);
  }

  /** Appends, applies in offset order, and resolves when durable. Throws RefusedError when full. */
  function submit(record: JournalRecord): Promise<unknown> {
    return submitAt(record).durable;
  }

  function submitAt(record: JournalRecord): { offset: number; durable: Promise<unknown> } {
    // A call's end record completes a call whose start the journal took (the proxy journals an end
    // only then; so does replay for a call a crash cut): it may use the room above the high
    // watermark, as rewards and ends do, so the call is recorded, truncated where its bytes were
    // refused, instead of lost. One record per call in flight when the watermark is crossed (no
    // new call starts above it); its size grows with the body frames it lists (~10 bytes each: a
    // long stream, or a translated one with a frame per event, can reach tens of KB).
    const priority = record.type === 'reward' || record.type === 'end' || record.type === 'call';
    if (!priority && backlog >= maxBacklog) throw backlogRefusal();
    // A call's start goes with its answer's first bytes (or anything else written before).
    const { offset, durable } = journal.append(Buffer.from(JSON.stringify(record)), priority, record.type === 'call_start');
    if (record.type === 'call') {
      // A call's end is applied once the proxy is done with the call (a microtask): the agent's
      // answer waits for the journal's write, not for the episode's bookkeeping.
      if (deferred.length === 0) queueMicrotask(applyDeferred);
      deferred.push({ record, offset });
    } else {
      // Records apply in offset order: ends not yet applied go first.
      applyDeferred();
      apply(record, offset);
    }
    updateJournalMetrics();
    return { offset, durable };
  }

  /**
   * Why a reward, end or tool span cannot reach an episode, or null when it can: its episode
   * closed (within the last `closed_window` closes), or, for a reward or end, no episode of its
   * rollout attempt exists. Checked against the assembler's state where the record would apply
   * (call ends not yet applied go first), so what is accepted is applied.
   */
  function rejection(record: JournalRecord): { error: RejectedError; kind: 'reward' | 'end' | 'tool_span'; source: string } | null {
    let rollout: { rolloutId: string; attemptId: string } | null;
    let kind: 'reward' | 'end' | 'tool_span';
    let source: string;
    if (record.type === 'reward' || record.type === 'end') {
      rollout = record;
      kind = record.type;
      source = record.type === 'reward' ? record.source : 'rollout_api';
    } else if (record.type === 'span' && record.what.kind !== 'agent') {
      rollout = router.rolloutOf(record);
      kind = record.what.kind === 'reward' ? 'reward' : 'tool_span';
      source = 'span';
    } else return null;
    if (!rollout) return null;
    applyDeferred();
    const s = assembler.standing(rollout.rolloutId, rollout.attemptId);
    if (s.state === 'open') return null;
    const what = kind === 'tool_span' ? 'a tool span' : kind === 'end' ? 'an end' : 'a reward';
    const who = `rollout '${rollout.rolloutId}' attempt '${rollout.attemptId}'`;
    if (s.state === 'closed') {
      const closed = `${s.status} at ${new Date(s.at).toISOString()}, final_reward ${s.finalReward}`;
      return {
        error: new RejectedError('episode_closed', `${what} for ${who} came after its episode closed (${closed}) and cannot be applied; ${lateHint(s.status)}`),
        kind,
        source,
      };
    }
    // A tool span may come before anything else of its rollout (an agent that traces tools only).
    if (kind === 'tool_span') return null;
    const window = config.processors.episodes.closed_window;
    return {
      error: new RejectedError(
        'unknown_rollout',
        `${what} for ${who}, but no call of that rollout attempt went through this sidecar (or its episode closed more than ${window} closes ago): name the rollout and attempt_id of the calls it rewards`,
      ),
      kind,
      source,
    };
  }

  function lateHint(status: EpisodeStatus): string {
    const e = config.processors.episodes;
    switch (status) {
      case 'timed_out':
        return `it had been idle for processors.episodes.idle_timeout_ms (${e.idle_timeout_ms} ms): raise it if rewards take longer`;
      case 'completed':
        return `a final reward or end closed it (after processors.episodes.tool_span_wait_ms, ${e.tool_span_wait_ms} ms): send other rewards before the final one`;
      case 'evicted':
        return `more than processors.episodes.max_open_episodes (${e.max_open_episodes}) episodes were open`;
      case 'shutdown':
        return 'the sidecar stopped while it was open';
    }
  }

  /** Call end records appended but not yet applied, in offset order. */
  let deferred: { record: JournalRecord; offset: number }[] = [];

  function applyDeferred(): void {
    while (deferred.length > 0) {
      const batch = deferred;
      deferred = [];
      for (const d of batch) apply(d.record, d.offset);
    }
  }

  function apply(record: JournalRecord, offset: number): void {
    try {
      enqueue(applyRecord(record, offset));
    } catch (err) {
      quarantine(offset, record, err);
    }
  }

  function backlogMessage(): string {
    return `export backlog: closed episodes holding ${backlog} records wait for the exporter (service.max_export_backlog ${maxBacklog})`;
  }

  function backlogRefusal(): RefusedError {
    return new RefusedError('EXPORT_BACKLOG', backlogMessage(), 1000);
  }

  function quarantine(offset: number, record: unknown, err: unknown): void {
    m.journalQuarantined.inc();
    log.once('quarantine', 'error', 'a record could not be processed; it is quarantined and skipped', { err, offset });
    try {
      const dir = path.join(dataDir, 'quarantine');
      mkdirSync(dir, { recursive: true });
      appendFileSync(path.join(dir, 'records.ndjson'), JSON.stringify({ offset, error: String(err), record }) + '\n');
    } catch {
      // Counted and logged already; the quarantine itself is best effort.
    }
  }

  function tick(): void {
    applyDeferred();
    const at = now();
    for (const o of router.expire(at)) m.spansClassified.inc({ kind: o.what.kind, result: 'unattributed' });
    m.pendingSpans.set(router.pending);
    enqueue(assembler.step({ type: 'tick', at }));
  }

  /** Token counts and calls without ids, counted when their transitions are built. */
  function countTokens(t: ClosedEpisode['transitions'][number]): void {
    if (t.status === 'ok' && t.response_token_ids === null) m.missingTokenIds.inc({ api: t.api });
    const usage = t.usage as { prompt_tokens?: unknown; completion_tokens?: unknown; input_tokens?: unknown; output_tokens?: unknown } | null;
    const prompt = usage?.prompt_tokens ?? usage?.input_tokens;
    const completion = usage?.completion_tokens ?? usage?.output_tokens;
    if (typeof prompt === 'number') m.tokens.inc({ kind: 'prompt' }, prompt);
    if (typeof completion === 'number') m.tokens.inc({ kind: 'response' }, completion);
  }

  const capture: CaptureSink = {
    callStarted(record: CallStartRecord): number | null {
      const id = submitCapture(record);
      const { rolloutId, attemptId, source } = record.correlation;
      const floor = id === null || source === 'self' ? null : assembler.floorOf(rolloutId, attemptId);
      // Beyond the cap (calls that never end, which the proxy does not do), calls are journaled whole.
      if (floor !== null && writing.size < maxBases) {
        writing.set(id!, { key: keyOf(rolloutId, attemptId), floor, failures: journal.writeFailures, request: null, response: null });
      }
      return id;
    },
    body(callId: number, kind: 'request' | 'response' | 'agent_request' | 'agent_response', bytes: Buffer | readonly Buffer[], frames: number[]): boolean {
      try {
        const writer = kind === 'request' || kind === 'response' ? writerFor(callId, kind) : null;
        if (writer) {
          if (Buffer.isBuffer(bytes)) writer.write(bytes, frames);
          else writer.writeParts(bytes, frames);
        }
        // Journaled as they are (a call that names no rollout, whose episode is exported as soon
        // as it ends): a copy stays in memory for that export.
        else frames.push(journal.appendBody(callId, kind, bytes, true));
        return true;
      } catch (err) {
        refusedCapture(err);
        return false;
      }
    },
    bodyFlush(callId: number, kind: 'request' | 'response', frames: number[]): boolean {
      try {
        writing.get(callId)?.[kind]?.flush(frames);
        return true;
      } catch (err) {
        refusedCapture(err);
        return false;
      }
    },
    restartBody(callId: number, kind: 'request' | 'response'): void {
      const w = writing.get(callId);
      if (!w) return;
      w[kind]?.close();
      w[kind] = null;
    },
    requestRepeats(callId: number): { shared: number; notes: unknown } | null {
      const writer = writing.get(callId)?.request;
      return writer ? { shared: writer.shared, notes: writer.baseNotes } : null;
    },
    noteRequest(callId: number, notes: unknown): void {
      const writer = writing.get(callId)?.request;
      if (writer) writer.notes = notes;
    },
    callEnded(record: CallRecord): void {
      keepBases(record);
      if (submitCapture(record) === null) {
        // Its start may have been kept: the lost call must not hold its episode open.
        assembler.abandonCall(record.correlation.rolloutId, record.correlation.attemptId, record.seq);
      }
    },
    flush(): void {
      journal.flushNow();
    },
    afterWrite(then: () => void): void {
      journal.afterWrite(then);
    },
    writeSoon(): void {
      journal.writeSoon();
    },
    beforeWrite(then: () => void): void {
      journal.beforeWrite(then);
    },
    read(frames: readonly number[], scratch?: Buffer): Buffer {
      journal.flushNow();
      return journal.readBodies(frames, scratch);
    },
  };

  /** Proxied calls are never refused: a capture the journal cannot take is counted and dropped. */
  function submitCapture(record: CallStartRecord | CallRecord): number | null {
    try {
      const { offset, durable } = submitAt(record);
      durable.catch(() => m.captureDrops.inc({ reason: 'journal_unwritable' }));
      return offset;
    } catch (err) {
      refusedCapture(err);
      return null;
    }
  }

  function refusedCapture(err: unknown): void {
    const code = err instanceof RefusedError ? err.code : null;
    const reason = code === 'JOURNAL_FULL' ? 'journal_full' : code === 'EXPORT_BACKLOG' ? 'export_backlog' : 'journal_unwritable';
    m.captureDrops.inc({ reason });
    const why = reason === 'export_backlog' ? 'the exporter is behind' : 'journal cannot take captures';
    log.once(`capture_${reason}`, 'warn', `${why}; proxied calls are still served`, { err });
  }

  /**
   * A call whose response began but whose end record is missing (the process was killed while
   * it streamed) is recorded as aborted with what its body frames hold, so whatever the agent got
   * is not lost. Calls with no response bytes never answered anything and are forgotten.
   */
  function recoverUnended(
    unended: Map<number, { start: CallStartRecord; bodies: Record<'request' | 'response' | 'agent_request' | 'agent_response', number[]> }>,
  ): void {
    for (const [callId, { start, bodies }] of unended) {
      if (bodies.response.length === 0) continue;
      let streamed = true;
      try {
        const head = journal.readBodies([bodies.response[0]]);
        streamed = head.toString('latin1', 0, 64).trimStart()[0] !== '{';
      } catch {
        // Unreadable: extraction will say so.
      }
      const record: CallRecord = {
        type: 'call',
        correlation: start.correlation,
        seq: start.seq,
        api: start.api ?? 'chat.completions',
        traceId: start.traceId,
        spanId: null,
        callId,
        bodies: { request: bodies.request, response: bodies.response, encoding: null },
        streamed,
        status: 'aborted',
        httpStatus: null,
        error: 'the journal has no end for this call (the sidecar stopped before it ended, or the journal was full); recovered from the journal',
        injected: [],
        truncated: true,
        startedAt: start.at,
        endedAt: start.at,
        latencyMs: 0,
        ttftMs: null,
      };
      try {
        submit(record).catch(() => {});
        m.journalRecovered.inc({ kind: 'unended_call' });
      } catch (err) {
        log.once('recover_unended', 'warn', 'a call cut by a restart could not be recorded', { err });
      }
    }
  }

  return {
    capture,
    assembler,
    journal,
    /**
     * Intake for the rollout API and OTLP: resolves when durable; rejects with RefusedError (full,
     * retry later) or RejectedError (can never apply: late, or for no known rollout).
     */
    submit(record: JournalRecord): Promise<unknown> {
      try {
        const rejected = rejection(record);
        if (rejected) {
          const { error, kind, source } = rejected;
          if (kind === 'tool_span') m.lateRecords.inc({ kind, outcome: 'rejected' });
          else m.rewards.inc({ source, kind, outcome: error.code });
          warnLimited(`rejected_${kind}_${error.code}`, error.message, { code: error.code });
          return Promise.reject(error);
        }
        const durable = submit(record);
        if (record.type === 'reward' || record.type === 'end')
          m.rewards.inc({ source: record.type === 'reward' ? record.source : 'rollout_api', kind: record.type, outcome: 'applied' });
        else if (record.type === 'span' && record.what.kind === 'reward' && router.rolloutOf(record))
          m.rewards.inc({ source: 'span', kind: 'reward', outcome: 'applied' });
        return durable;
      } catch (err) {
        return Promise.reject(err instanceof Error ? err : new Error(String(err)));
      }
    },
    recovery: () => recovery,
    /** Why intake is refused for the export backlog (readiness), or null. */
    backlogFull(): string | null {
      return backlog >= maxBacklog ? backlogMessage() : null;
    },
    async start(): Promise<void> {
      assembler.replaying = true;
      // Calls started but not ended in the journal, with their body frames (a process killed mid-call).
      const unended = new Map<number, { start: CallStartRecord; bodies: Record<'request' | 'response' | 'agent_request' | 'agent_response', number[]> }>();
      recovery = await journal.open((offset, payload) => {
        if (isBodyPayload(payload)) {
          const { callId, kind } = readBodyHeader(payload);
          unended.get(callId)?.bodies[kind].push(offset);
          return;
        }
        let record: JournalRecord;
        try {
          record = JSON.parse(payload.toString('utf8')) as JournalRecord;
        } catch (err) {
          quarantine(offset, payload.toString('base64'), err);
          return;
        }
        try {
          if (record.type === 'call_start' || record.type === 'call') {
            if (record.correlation.source !== 'self') deps.sequences?.observe(record.correlation.rolloutId, record.correlation.attemptId, record.seq);
          }
          if (record.type === 'call_start')
            unended.set(offset, { start: record, bodies: { request: [], response: [], agent_request: [], agent_response: [] } });
          else if (record.type === 'call' && record.callId !== undefined) unended.delete(record.callId);
          // While replaying only close markers close episodes, so each closed episode here has its marker.
          enqueue(applyRecord(record, offset), offset);
        } catch (err) {
          quarantine(offset, record, err);
        }
      });
      assembler.replaying = false;
      assembler.forgetInFlight();
      recoverUnended(unended);
      applyDeferred();
      m.journalRecovered.inc({ kind: 'torn_tail' }, recovery.tornTails);
      m.journalRecovered.inc({ kind: 'corrupt_tail' }, recovery.corruptTails);
      m.journalRecovered.inc({ kind: 'corrupt_segment' }, recovery.corruptSegments);
      updateJournalMetrics();
      if (recovery.records > 0) log.info('journal replayed', { ...recovery, open_episodes: assembler.openCount, to_export: queue.length });
      timer = setInterval(tick, config.processors.episodes.tick_interval_ms);
      timer.unref();
      pump();
    },
    /** Closes what is still open (when configured), flushes to the exporter, closes the journal. */
    shutdown: once(async () => {
      if (timer) clearInterval(timer);
      applyDeferred();
      if (config.service.drain_on_shutdown) enqueue(assembler.drain(now()));
      stopping = true;
      if (pumping) await pumping.catch(() => {});
      if (queue.length > 0) {
        pumping = drainQueue().catch((err) =>
          log.error('episodes could not be exported before shutdown; they stay in the journal', { err, episodes: queue.length }),
        );
        await pumping;
      }
      await journal.close();
      spill.close();
    }),
  };
}

export type Pipeline = ReturnType<typeof createPipeline>;
