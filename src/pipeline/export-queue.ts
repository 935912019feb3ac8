import path from 'node:path';
import { isEncoded, type EncodedEpisode, type ExportItem, type Exporter } from '../exporters/exporter';
import { RefusedError } from '../model/component';
import type { ClosedEpisode } from '../model/records';
import { Spill, type SpillRef, type SpillValue } from '../journal/spill';
import type { EpisodeClose } from '../processors/episodes/assembler';
import type { Context } from './context';
import type { DeliveredMarker, EpisodeClosedMarker } from './records';
import { SETTLED, SpilledEpisodes } from './spilled-episodes';

/** Closed episodes exported in one batch at most, and how long a first one waits for company. */
const EXPORT_BATCH = 64;
const EXPORT_LINGER_MS = 20;
/**
 * An export still waiting after this long means the exporter is away (a broker restarting, a
 * leader moving: kafkajs retries inside the send rather than failing it).
 */
const EXPORT_AWAY_MS = 200;

/** An episode encoded ahead by the exporter, waiting on disk: where, and what its header says. */
interface Encoded {
  ref: SpillRef;
  transitions: number;
  trajectories: number;
  endedAt: number[];
  /** Where each of the exporter's sections lies within the value. */
  sections: { at: number; length: number }[];
}

/** A closed episode at the head of the queue. */
interface Queued {
  /** What closed; null once encoded ahead, or when it could not be read back from disk (quarantined). */
  close: EpisodeClose | null;
  /** Its records as the exporter sends them, on disk (encoded while the exporter was away). */
  encoded: Encoded | null;
  /** Encoding it ahead failed: it is built when its batch is. */
  notAhead?: boolean;
  /** Its encoded records could not be read back while being sent: quarantined, not retried. */
  unreadable?: unknown;
  /** Lowest journal offset among its records (what must be kept until delivery). */
  firstOffset: number;
  /** Its transitions, built when its batch is first exported. */
  built: ClosedEpisode | null;
  /** It could not be built: left out of the export. */
  quarantined?: boolean;
  /** Offset of its close marker; set once the marker is appended. */
  marker: number;
  durable: Promise<unknown>;
  /** Records it holds (see `max_export_backlog`). */
  weight: number;
}

export interface ExportQueueDeps {
  exporter: Exporter;
  /** The lowest offset the rest of the pipeline still needs (open episodes, parked spans, calls in flight). */
  floor: () => number;
  /** An episode closed: what the pipeline keeps for its rollout attempt goes. */
  closed: (rolloutId: string, attemptId: string) => void;
  /** Episodes began (true) or stopped (false) waiting on disk. */
  onDisk?: (onDisk: boolean) => void;
  /** Calls are expected to carry token ids (false: `upstream_flavor: openai` was chosen, and episodes without them are no news). */
  idsExpected?: boolean;
}

/**
 * Closed episodes on their way to the exporter, in close order: their close markers journaled,
 * batched, retried with backoff, spilled to disk past a memory budget; once delivered, a delivered
 * marker is journaled and the journal's segments below the lowest offset still needed are deleted.
 */
export class ExportQueue {
  /**
   * The queue: its head in memory (`queue`), then what waits on disk (`spilled`). Once an
   * episode waits on disk, every later one does too until the disk part is empty: the order is
   * close order, which delivered markers rely on.
   */
  private readonly queue: Queued[] = [];
  private readonly spilled = new SpilledEpisodes();
  /** `spilled` was not empty when the backlog was last counted (what `onDisk` was last told). */
  private wasOnDisk = false;
  /**
   * Records (calls, spans, rewards) the queued episodes hold in memory. While the exporter is away
   * closed episodes wait here; above `max_export_backlog` intake is refused as when the journal is
   * full, so memory stays bounded even under a journal cap larger than memory.
   */
  private backlog = 0;
  private readonly maxBacklog: number;
  /**
   * Past this many records in memory, closed episodes wait for the exporter on disk (a copy of
   * their facts, which the journal holds too) and are read back when their batch is built: an
   * exporter outage costs disk, not memory. The first batches due stay in memory.
   */
  private inMemory = 0;
  private readonly maxInMemory: number;
  private readonly spill: Spill;
  private readonly spillDir: string;
  private pumping: Promise<void> | null = null;
  /** The exporter encodes ahead (`Exporter.encodeAhead`): while it is away, the backlog is encoded. */
  private readonly ahead: boolean;
  private encodingAhead: Promise<void> | null = null;
  /** Bytes of encoded episodes waiting on disk, and the most there may be (service.export_backlog_encoded_bytes). */
  private encodedBytes = 0;
  private readonly maxEncodedBytes: number;
  /** Episodes at the head of the queue in the export under way (not to be encoded meanwhile). */
  private exporting = 0;
  /** Writing encoded episodes failed (the disk): none is encoded until an export succeeds. */
  private aheadPaused = false;
  /** Spilled entries before this sequence number were looked at for facts to encode. */
  private factsFrom = 0;
  /** Above 0 after a failed export: the exporter is away. */
  private backoffMs = 0;
  /** The export under way has waited past EXPORT_AWAY_MS: the exporter is away. */
  private stalled = false;
  private stopping = false;
  /** Nothing is exported before the journal is replayed. */
  private opened = false;
  /** Delivered batches whose delivered marker is not written yet: the first offset of their episodes, kept. */
  private unmarked: { upTo: number; floor: number }[] = [];

  constructor(
    private readonly ctx: Context,
    private readonly deps: ExportQueueDeps,
  ) {
    // Started at 0 so an alert's increase() sees the first error.
    for (const kind of ['retryable', 'permanent']) ctx.m.exportErrors.inc({ exporter: deps.exporter.name, kind }, 0);
    this.maxBacklog = ctx.config.service.max_export_backlog;
    this.maxInMemory = ctx.config.service.export_backlog_memory_records;
    this.maxEncodedBytes = ctx.config.service.export_backlog_encoded_bytes;
    this.ahead = typeof deps.exporter.encodeAhead === 'function';
    this.spillDir = path.join(ctx.dataDir, 'spill');
    this.spill = new Spill(this.spillDir);
  }

  /** Closed episodes waiting for the exporter. */
  get length(): number {
    return this.queue.length + this.spilled.length;
  }

  /** The backlog is at `max_export_backlog`: intake other than rewards, ends and call ends is refused. */
  get full(): boolean {
    return this.backlog >= this.maxBacklog;
  }

  message(): string {
    return `export backlog: closed episodes holding ${this.backlog} records wait for the exporter (service.max_export_backlog ${this.maxBacklog})`;
  }

  refusal(): RefusedError {
    return new RefusedError('EXPORT_BACKLOG', this.message(), 1000);
  }

  /** The journal is replayed: exports may begin. */
  open(): void {
    this.opened = true;
  }

  /** Journals close markers for what the rules closed (live), queues them for export. */
  enqueue(closed: EpisodeClose[], replayMarker?: number): void {
    const { m, log, journal, assembler } = this.ctx;
    for (const c of closed) {
      const { rolloutId, attemptId } = c.facts;
      this.deps.closed(rolloutId, attemptId);
      // A replayed close was counted by the process that closed it.
      if (replayMarker === undefined) m.episodesClosed.inc({ status: c.status });
      if (replayMarker !== undefined || c.closedByRecord !== undefined) {
        // Replayed, or closed by its own record (which a replay closes again): no marker to journal.
        this.add(c, c.closedByRecord ?? replayMarker!, SETTLED);
        continue;
      }
      const marker: EpisodeClosedMarker = { type: 'episode_closed', rolloutId, attemptId, status: c.status, at: c.facts.endedAt };
      try {
        // Lazy: the marker goes with the journal's next write (a call's, within LAZY_MS at most),
        // not with a write of its own; the export waits for it (`durable`) and lingers as long.
        const { offset, durable } = journal.append(Buffer.from(JSON.stringify(marker)), true, true);
        this.add(c, offset, durable);
      } catch (err) {
        // The journal refuses (full/closed): export anyway; a replay may close this episode again.
        log.once('marker', 'warn', 'journal refused a close marker; exporting without it', { err });
        this.add(c, -1, SETTLED);
      }
    }
    m.openEpisodes.set(assembler.openCount);
    if (!this.stopping || closed.length > 0) this.pump();
  }

  /** A delivered marker: the episodes whose close markers it covers are delivered. */
  delivered(upTo: number): void {
    let n = 0;
    while (n < this.queue.length && this.queue[n].marker <= upTo) n++;
    const all = n === this.queue.length;
    this.dequeue(n);
    if (!all) return;
    while (this.spilled.firstMarker <= upTo) {
      const e = this.spilled.shift();
      this.backlog -= e.weight;
      if (!e.ref) this.inMemory -= e.weight;
      else this.releaseRef(e.ref, e.encoded);
    }
    this.backlogMetrics();
  }

  pump(): void {
    if (this.pumping || this.length === 0 || !this.opened) return;
    this.pumping = this.lingerThenDrain().finally(() => {
      this.pumping = null;
      if (this.length > 0 && !this.stopping) this.pump();
    });
  }

  /** Stops pumping, then exports what is queued (once, no retries). */
  async stop(): Promise<void> {
    this.stopping = true;
    if (this.pumping) await this.pumping.catch(() => {});
    if (this.length > 0) {
      this.pumping = this.drain().catch((err) =>
        this.ctx.log.error('episodes could not be exported before shutdown; they stay in the journal', { err, episodes: this.length }),
      );
      await this.pumping;
    }
  }

  close(): void {
    this.spill.close();
  }

  private add(close: EpisodeClose, marker: number, durable: Promise<unknown>): void {
    const f = close.facts;
    const weight = f.calls.length + f.toolSpans.length + f.rewards.length + (f.agentSpans?.length ?? 0);
    const firstOffset = close.firstOffset;
    this.backlog += weight;
    const away = this.ahead && this.away;
    if (this.spilled.length > 0 || (this.queue.length >= 2 * EXPORT_BATCH && (away || this.inMemory + weight > this.maxInMemory))) {
      if (this.ahead && this.inMemory + weight <= this.maxInMemory) {
        // Written to disk in the background, encoded as the exporter will send it (up to
        // export_backlog_encoded_bytes); past the memory budget, written now as facts.
        this.spilled.push({ ref: null, close, firstOffset, marker, weight }, durable);
        this.inMemory += weight;
        this.backlogMetrics();
        this.encodeAhead();
        return;
      }
      const ref = this.writeFacts(close);
      this.spilled.push({ ref, close: ref ? null : close, firstOffset, marker, weight }, durable);
      if (!ref) this.inMemory += weight;
    } else {
      this.queue.push({ close, encoded: null, firstOffset, built: null, marker, durable, weight });
      this.inMemory += weight;
      if (away) this.encodeAhead();
    }
    this.backlogMetrics();
  }

  /**
   * Up to `n` episodes in memory at the head: those waiting on disk next are read back (one
   * that cannot be is quarantined when its batch is built).
   */
  private promote(n: number): void {
    while (this.queue.length < n && this.spilled.length > 0) {
      const e = this.spilled.shift();
      if (e.ref && e.encoded) {
        let encoded: Encoded | null = null;
        try {
          encoded = this.readEncoded(e.ref);
        } catch (err) {
          this.ctx.quarantine(e.marker, { episode: { spilled: e.ref } }, err);
          this.releaseRef(e.ref, true);
        }
        this.queue.push({
          close: null,
          encoded,
          firstOffset: e.firstOffset,
          built: null,
          quarantined: !encoded,
          marker: e.marker,
          durable: e.durable,
          weight: e.weight,
        });
        continue;
      }
      let close = e.close;
      if (e.ref) {
        try {
          close = this.spill.read(e.ref) as EpisodeClose;
        } catch (err) {
          this.ctx.quarantine(e.marker, { episode: { spilled: e.ref } }, err);
        }
        this.releaseRef(e.ref, false);
        if (close) this.inMemory += e.weight;
      }
      this.queue.push({
        close,
        encoded: null,
        firstOffset: e.firstOffset,
        built: null,
        quarantined: close === null,
        marker: e.marker,
        durable: e.durable,
        weight: e.weight,
      });
    }
  }

  /** The first `n` queued episodes are delivered. */
  private dequeue(n: number): void {
    for (const q of this.queue.splice(0, n)) {
      this.backlog -= q.weight;
      if (q.close) this.inMemory -= q.weight;
      if (q.encoded) this.releaseRef(q.encoded.ref, true);
    }
    this.backlogMetrics();
  }

  private backlogMetrics(): void {
    const onDisk = this.spilled.length > 0;
    if (onDisk !== this.wasOnDisk) {
      this.wasOnDisk = onDisk;
      this.deps.onDisk?.(onDisk);
    }
    this.ctx.m.exportBacklog.set(this.backlog);
    this.ctx.m.exportBacklogSpilled.set(this.backlog - this.inMemory);
    this.ctx.m.exportBacklogEncodedBytes.set(this.encodedBytes);
  }

  /** The last export failed, or the one under way has waited too long. */
  private get away(): boolean {
    return this.backoffMs > 0 || this.stalled;
  }

  /** A closed episode's facts written to disk to wait there; null (logged) when they cannot be. */
  private writeFacts(close: EpisodeClose): SpillRef | null {
    try {
      return this.spill.write(close);
    } catch (err) {
      this.ctx.log.once('spill', 'warn', 'closed episodes cannot wait on disk; they wait in memory', { err, dir: this.spillDir });
      return null;
    }
  }

  private releaseRef(ref: SpillRef, encoded: boolean): void {
    if (encoded) this.encodedBytes -= ref.length;
    try {
      this.spill.release(ref);
    } catch (err) {
      // A file not deleted takes disk until the next start empties the directory; nothing is lost.
      this.ctx.log.once('spill_release', 'warn', 'a spill file could not be deleted', { err, dir: this.spillDir });
    }
  }

  /** Encodes the backlog in the background, an episode at a time, while there is some to encode. */
  private encodeAhead(): void {
    if (!this.ahead || this.encodingAhead || this.stopping) return;
    this.encodingAhead = (async () => {
      do await new Promise((r) => setImmediate(r));
      while (!this.stopping && this.encodeNext());
    })().finally(() => (this.encodingAhead = null));
  }

  /**
   * One episode of the backlog encoded and written to disk: while the exporter is away, the head
   * of the queue first (not the batch being exported); then what waits in memory to be written
   * (as facts past export_backlog_encoded_bytes); then, while the exporter is away, what waits on
   * disk as facts. False when there is nothing left to do.
   */
  private encodeNext(): boolean {
    const room = !this.aheadPaused && this.encodedBytes < this.maxEncodedBytes;
    if (this.away && room) {
      for (let i = this.exporting; i < this.queue.length; i++) {
        const q = this.queue[i];
        if (!q.close || q.encoded || q.quarantined || q.notAhead) continue;
        const encoded = this.encode(q.close, q.built);
        if (encoded) {
          q.encoded = encoded;
          q.close = null;
          q.built = null;
          this.inMemory -= q.weight;
          this.backlogMetrics();
        } else q.notAhead = true;
        return true;
      }
    }
    const held = this.spilled.firstHeld();
    if (held) {
      const encoded = room ? this.encode(held.close, null) : null;
      const ref = encoded?.ref ?? this.writeFacts(held.close);
      // Not written: tried again when the next episode closes; meanwhile it waits in memory.
      if (!ref) return false;
      this.spilled.store(held.seq, ref, encoded !== null);
      this.inMemory -= held.weight;
      this.backlogMetrics();
      return true;
    }
    // Last, while the exporter is away, those that went to disk as facts (past the memory budget
    // in a burst of closes): read back and encoded, as their batch would do.
    const facts = this.away && room ? this.spilled.nextFacts(this.factsFrom) : null;
    if (!facts) return false;
    this.factsFrom = facts.seq + 1;
    let close: EpisodeClose;
    try {
      close = this.spill.read(facts.ref) as EpisodeClose;
    } catch {
      return true; // its batch reads it again, and quarantines it if it still cannot
    }
    const encoded = this.encode(close, null);
    if (encoded) {
      this.spilled.store(facts.seq, encoded.ref, true);
      this.releaseRef(facts.ref, false);
      this.backlogMetrics();
    }
    return true;
  }

  /**
   * The episode's records encoded by the exporter and written to disk as they come, each behind
   * its u32 length, section after section, then a trailer: JSON (counts, each transition's end,
   * the sections' lengths) and its u32 length. Null when it cannot be done now: its batch builds
   * it, as it would have (and quarantines it if it still cannot be built).
   */
  private encode(close: EpisodeClose, built: ClosedEpisode | null): Encoded | null {
    let c: ClosedEpisode;
    try {
      c = built ?? this.build(close);
    } catch {
      return null;
    }
    // What fails on disk pauses encoding ahead; what fails in encoding leaves this one episode out.
    let diskFailed = false;
    const disk = <T>(f: () => T): T => {
      try {
        return f();
      } catch (err) {
        diskFailed = true;
        throw err;
      }
    };
    let v: SpillValue | null = null;
    try {
      v = disk(() => this.spill.begin());
      const value = v;
      const lengths = [0];
      this.deps.exporter.encodeAhead!(c, this.ctx.read, (section, parts) => {
        if (section < lengths.length - 1) throw new RangeError(`encodeAhead wrote section ${section} after ${lengths.length - 1}`);
        while (lengths.length <= section) lengths.push(0);
        let n = 0;
        for (const p of parts) n += p.length;
        disk(() => {
          value.append(u32(n));
          for (const p of parts) value.append(p);
        });
        lengths[section] += 4 + n;
      });
      const head: EncodedHead = { t: c.transitions.length, j: c.trajectories.length, e: c.transitions.map((t) => Date.parse(t.ended_at)), s: lengths };
      const json = Buffer.from(JSON.stringify(head));
      const ref = disk(() => {
        value.append(json);
        value.append(u32(json.length));
        return value.end();
      });
      this.encodedBytes += ref.length;
      if (!built) this.countBuilt(c);
      return encodedOf(ref, head);
    } catch (err) {
      v?.abort();
      if (diskFailed) {
        // The disk: nothing more is encoded ahead until an export succeeds.
        this.aheadPaused = true;
        this.ctx.log.once('spill', 'warn', 'closed episodes cannot wait on disk encoded; they are encoded when exported', { err, dir: this.spillDir });
      } else this.ctx.log.once('encode_ahead', 'warn', 'a closed episode could not be encoded ahead; it is built when exported', { err });
      return null;
    }
  }

  private readEncoded(ref: SpillRef): Encoded {
    if (ref.length < 4) throw new RangeError(`encoded episode of ${ref.length} bytes`);
    const n = this.spill.readBytes(ref, ref.length - 4, 4).readUInt32LE(0);
    if (n > ref.length - 4) throw new RangeError(`encoded episode: a trailer of ${n} bytes in ${ref.length}`);
    return encodedOf(ref, JSON.parse(this.spill.readBytes(ref, ref.length - 4 - n, n).toString('utf8')) as EncodedHead);
  }

  /**
   * What the exporter is given for an episode encoded ahead: its records, read back a window at a
   * time as they are sent. One that cannot be read marks the episode, whose batch then goes
   * without it (see `drain`).
   */
  private item(q: Queued, e: Encoded): EncodedEpisode {
    const spill = this.spill;
    function* records(i: number): Generator<Buffer> {
      const { at, length } = e.sections[i] ?? { at: 0, length: 0 };
      try {
        yield* readRecords(spill, e.ref, at, length);
      } catch (err) {
        q.unreadable = err;
        throw err;
      }
    }
    return { encoded: true, transitions: e.transitions, trajectories: e.trajectories, endedAt: e.endedAt, records };
  }

  /**
   * A queued episode's transitions, built once (their calls' facts extracted from the journal).
   * An episode that cannot be built is quarantined and left out of its batch, as a record that
   * cannot be processed is: it must not hold every later export back.
   */
  private built(q: Queued): ClosedEpisode | null {
    if (q.built !== null || q.quarantined || !q.close) return q.built;
    const close = q.close;
    let c: ClosedEpisode;
    try {
      c = q.built = this.build(close);
    } catch (err) {
      q.quarantined = true;
      const episode = {
        rolloutId: close.facts.rolloutId,
        attemptId: close.facts.attemptId,
        status: close.status,
        calls: close.facts.calls.map((call) => call.callId),
      };
      this.ctx.quarantine(q.marker, { episode }, err);
      return null;
    }
    this.countBuilt(c);
    return c;
  }

  /** An episode's records, built, its trajectories' images stored first. */
  private build(close: EpisodeClose): ClosedEpisode {
    const c = this.ctx.assembler.build(close);
    this.ctx.images.storeEpisode(c);
    return c;
  }

  private countBuilt(c: ClosedEpisode): void {
    const m = this.ctx.m;
    m.trajectorySegments.observe(c.trajectories.length);
    for (const t of c.trajectories) {
      m.trajectoryTokens.observe(t.length);
      if (t.routing !== null) this.countRouting(t);
      if (t.samplingMask !== null) this.countSamplingMask(t);
      m.trajectoryCalls.inc({ outcome: 'new_segment', reason: t.start_reason });
      if (t.turns.length > 1) m.trajectoryCalls.inc({ outcome: 'merged', reason: 'continued' }, t.turns.length - 1);
    }
    for (const u of c.episode.unmerged_calls) m.trajectoryCalls.inc({ outcome: 'left_out', reason: u.reason });
    this.warnWithoutIds(c);
    for (const t of c.transitions) {
      if (t.choice_index === 0) this.countTokens(t);
      for (const tc of t.tool_calls) {
        m.toolSpans.inc({ outcome: tc.status ?? 'unobserved' });
        if (tc.reward !== null) m.airRewards.observe(tc.reward);
      }
    }
  }

  /** A trajectory with routed experts: counted, and said when they are not complete (the trainer must not replay them as they are). */
  private countRouting(t: ClosedEpisode['trajectories'][number]): void {
    const r = t.routing!;
    this.ctx.m.trajectoryRouting.inc({ complete: String(r.complete) });
    if (r.complete) return;
    this.ctx.warnLimited(
      'routing_incomplete',
      "a trajectory's routed experts are incomplete: it is exported with routing_complete false, and a trainer must not replay its routing as it is",
      { trajectory_id: t.trajectory_id, problems: r.problems, coverage: r.coverage },
    );
  }

  /** A trajectory with sampling masks (or asked to have them): counted, and said when they are not complete. */
  private countSamplingMask(t: ClosedEpisode['trajectories'][number]): void {
    const m = t.samplingMask!;
    this.ctx.m.trajectorySamplingMask.inc({ complete: String(m.complete) });
    if (m.violations > 0) this.ctx.m.samplingMaskViolations.inc(m.violations);
    if (m.complete) return;
    this.ctx.warnLimited(
      'sampling_mask_incomplete',
      "a trajectory's sampling masks are incomplete: it is exported with sampling_mask_complete false, and a trainer must not apply its masks as they are",
      { trajectory_id: t.trajectory_id, problems: m.problems, coverage: m.coverage, violations: m.violations },
    );
  }

  /**
   * An episode whose answered calls all came without token ids gives the trainer nothing to train
   * on: the sidecar serves and records, and captures nothing a trainer can use. Said in the log
   * (at most once each 10 s), with why the ids are missing and the settings that change it.
   */
  private warnWithoutIds(c: ClosedEpisode): void {
    if (this.deps.idsExpected === false) return;
    const answered = c.transitions.filter((t) => t.status === 'ok');
    if (answered.length === 0 || answered.some((t) => t.response_token_ids !== null)) return;
    this.ctx.warnLimited(
      'no_token_ids',
      'episodes close without trajectories: the model server answered every call of this episode without token ids, so a trainer gets nothing from it. ' +
        'If the server is vLLM or SGLang, set receivers.llm_proxy.upstream_flavor (LIGHTNING_UPSTREAM_FLAVOR) to vllm or sglang, ' +
        'or check that receivers.llm_proxy.upstream_url (LIGHTNING_UPSTREAM_URL) names it; see the start-up line and /readyz for what the sidecar found',
      { reason: answered[0].token_ids_missing, rollout_id: c.episode.rollout_id, attempt_id: c.episode.attempt_id, calls: answered.length },
    );
  }

  /** Token counts and calls without ids, counted when their transitions are built. */
  private countTokens(t: ClosedEpisode['transitions'][number]): void {
    const m = this.ctx.m;
    if (t.status === 'ok' && t.response_token_ids === null) m.missingTokenIds.inc({ api: t.api });
    const usage = t.usage as { prompt_tokens?: unknown; completion_tokens?: unknown; input_tokens?: unknown; output_tokens?: unknown } | null;
    const prompt = usage?.prompt_tokens ?? usage?.input_tokens;
    const completion = usage?.completion_tokens ?? usage?.output_tokens;
    if (typeof prompt === 'number') m.tokens.inc({ kind: 'prompt' }, prompt);
    if (typeof completion === 'number') m.tokens.inc({ kind: 'response' }, completion);
  }

  /** The batch's episodes, built or encoded ahead (those that cannot be built are left out). */
  private ready(batch: Queued[]): ExportItem[] {
    const out: ExportItem[] = [];
    for (const q of batch) {
      const c = q.encoded ? this.item(q, q.encoded) : this.built(q);
      if (c) out.push(c);
    }
    return out;
  }

  /**
   * Episodes that close within 20 ms of each other are exported together (up to 64): one write
   * or produce request, one delivery marker and one release for many (as a Kafka producer's linger).
   */
  private async lingerThenDrain(): Promise<void> {
    if (!this.stopping && this.length < EXPORT_BATCH) await new Promise((r) => setTimeout(r, EXPORT_LINGER_MS).unref());
    await this.drain();
  }

  private async drain(): Promise<void> {
    const { m, log } = this.ctx;
    const exporter = this.deps.exporter;
    while (this.length > 0) {
      this.promote(2 * EXPORT_BATCH);
      const batch = this.queue.slice(0, EXPORT_BATCH);
      // Close markers are lazy: what is still queued is written at the end of this turn, not when
      // the lazy timer (unref'd: at shutdown nothing else may keep the process up) comes.
      this.ctx.journal.writeSoon();
      await Promise.all(batch.map((q) => q.durable.catch(() => {})));
      this.exporting = batch.length;
      const stall = this.ahead
        ? setTimeout(() => {
            this.stalled = true;
            this.encodeAhead();
          }, EXPORT_AWAY_MS).unref()
        : null;
      try {
        const exporting = exporter.export(this.ready(batch), this.ctx.read);
        // While the exporter waits on the broker, the next batch is built (extraction is CPU work).
        void this.buildAhead(this.queue.slice(batch.length, 2 * EXPORT_BATCH));
        await exporting;
      } catch (err) {
        if (stall) clearTimeout(stall);
        this.exporting = 0;
        if (this.setAsideUnreadable(batch)) continue;
        m.exportErrors.inc({ exporter: exporter.name, kind: 'retryable' });
        this.backoffMs = Math.min(Math.max(this.backoffMs * 2, 100), 10_000);
        log.once('export_failed', 'error', 'export failed; retrying with backoff', { err, exporter: exporter.name });
        if (this.stopping) throw err;
        // The exporter is away: what waits is encoded meanwhile, so the drain only sends bytes.
        this.encodeAhead();
        await new Promise((r) => setTimeout(r, this.backoffMs).unref());
        continue;
      }
      if (stall) clearTimeout(stall);
      this.exporting = 0;
      this.stalled = false;
      this.aheadPaused = false;
      this.factsFrom = 0;
      this.backoffMs = 0;
      const delivered = this.ready(batch);
      this.dequeue(batch.length);
      this.countDelivered(delivered);
      this.markDelivered(batch);
      await this.release();
    }
  }

  /**
   * Episodes of the batch whose encoded records could not be read back are quarantined, as
   * anything that cannot be processed is, and left out: the batch is tried again at once without
   * them (what of it went already goes again: at least once). True when there were any.
   */
  private setAsideUnreadable(batch: Queued[]): boolean {
    let any = false;
    for (const q of batch) {
      if (q.unreadable === undefined || !q.encoded) continue;
      this.ctx.quarantine(q.marker, { episode: { spilled: q.encoded.ref } }, q.unreadable);
      this.releaseRef(q.encoded.ref, true);
      q.encoded = null;
      q.quarantined = true;
      q.unreadable = undefined;
      any = true;
    }
    if (any) this.backlogMetrics();
    return any;
  }

  /**
   * Builds `next` an episode at a time, giving the event loop back in between: the broker's
   * acknowledgements and the exporter's next request go out while the batch after is built,
   * instead of waiting behind all of it. What is not built yet when its batch is due is built then.
   */
  private async buildAhead(next: Queued[]): Promise<void> {
    for (const q of next) {
      if (this.stopping) return;
      this.built(q);
      await new Promise((r) => setImmediate(r));
    }
  }

  private countDelivered(delivered: ExportItem[]): void {
    const m = this.ctx.m;
    const name = this.deps.exporter.name;
    const records = this.ctx.config.exporters.records;
    const count = (c: ExportItem, what: 'transitions' | 'trajectories'): number => (isEncoded(c) ? c[what] : c[what].length);
    if (records !== 'trajectories')
      m.transitionsExported.inc(
        { exporter: name },
        delivered.reduce((n, c) => n + count(c, 'transitions'), 0),
      );
    if (records !== 'transitions')
      m.trajectoriesExported.inc(
        { exporter: name },
        delivered.reduce((n, c) => n + count(c, 'trajectories'), 0),
      );
    const deliveredAt = Date.now();
    for (const c of delivered) {
      if (isEncoded(c)) for (const at of c.endedAt) m.exportLag.observe(Math.max(0, deliveredAt - at) / 1000);
      else for (const t of c.transitions) m.exportLag.observe(Math.max(0, deliveredAt - Date.parse(t.ended_at)) / 1000);
    }
  }

  /** Journals a delivered marker for the batch; the journal is released once it is written. */
  private markDelivered(batch: Queued[]): void {
    const upTo = Math.max(...batch.map((q) => q.marker));
    if (upTo < 0) return;
    // Until the marker is written a replay exports these episodes again, reading their bodies:
    // what they need stays in the journal until then (a later marker, covering these, does too).
    this.unmarked.push({ upTo, floor: Math.min(...batch.map((q) => q.firstOffset)) });
    try {
      // Lazy: it goes with the next write (within a few ms); the release waits for it.
      const { durable } = this.ctx.journal.append(Buffer.from(JSON.stringify({ type: 'delivered', upTo } satisfies DeliveredMarker)), true, true);
      durable.then(
        () => {
          this.unmarked = this.unmarked.filter((u) => u.upTo > upTo);
          return this.release();
        },
        () => {
          // Not written: a replay exports these again (at-least-once, same transition ids), so they stay.
        },
      );
    } catch {
      // Not appended: as above.
    }
  }

  private async release(): Promise<void> {
    const { journal, log } = this.ctx;
    // A loop, not a spread: the queue can hold hundreds of thousands of episodes after a long
    // outage, more arguments than a call can take.
    let low = Math.min(this.deps.floor(), journal.next);
    for (const q of this.queue) if (q.firstOffset < low) low = q.firstOffset;
    low = Math.min(low, this.spilled.lowestFirstOffset());
    for (const u of this.unmarked) if (u.floor < low) low = u.floor;
    const removed = await journal.release(low).catch((err) => {
      log.once('release', 'error', 'journal: could not delete delivered segments', { err });
      return 0;
    });
    if (removed > 0) this.ctx.journalMetrics();
  }
}

/** The header of an encoded episode on disk (short names: one per episode of a long outage). */
interface EncodedHead {
  t: number;
  j: number;
  e: number[];
  s: number[];
}

function encodedOf(ref: SpillRef, head: EncodedHead): Encoded {
  const sections: Encoded['sections'] = [];
  let at = 0;
  for (const length of head.s) {
    sections.push({ at, length });
    at += length;
  }
  if (at > ref.length) throw new RangeError(`encoded episode: sections end at ${at}, the value at ${ref.length}`);
  return { ref, transitions: head.t, trajectories: head.j, endedAt: head.e, sections };
}

function u32(n: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32LE(n, 0);
  return b;
}

/** Bytes read at once when encoded records are read back (a record bigger than this is read alone). */
const READ_WINDOW = 1 << 20;

/** The records (each behind its u32 length) in `length` bytes from `at` of a spilled value. */
function* readRecords(spill: Spill, ref: SpillRef, at: number, length: number): Generator<Buffer> {
  const end = at + length;
  let win: Buffer = Buffer.alloc(0);
  let winAt = at;
  for (let pos = at; pos < end;) {
    if (pos + 4 > winAt + win.length) {
      win = spill.readBytes(ref, pos, Math.min(READ_WINDOW, end - pos));
      winAt = pos;
    }
    if (pos + 4 > winAt + win.length) throw new RangeError('encoded records are cut short');
    const n = win.readUInt32LE(pos - winAt);
    if (pos + 4 + n > end) throw new RangeError('encoded records are cut short');
    if (pos + 4 + n > winAt + win.length) {
      win = spill.readBytes(ref, pos, Math.min(Math.max(READ_WINDOW, 4 + n), end - pos));
      winAt = pos;
    }
    yield win.subarray(pos - winAt + 4, pos - winAt + 4 + n);
    pos += 4 + n;
  }
}
