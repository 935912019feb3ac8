import type { Api, BodyKind, CallRecord, Correlation, Translation } from '../../model/records';
import type { CaptureSink } from '../../model/component';

/**
 * What the hot path keeps for one recorded call: metadata and the journal offsets of its body
 * frames. The bytes themselves go to the journal as they pass (by reference, no copy), bounded by
 * the capture cap; nothing is parsed here. Facts are extracted when the call's episode closes.
 */
export class CallCapture {
  /**
   * The call's id in the journal (the offset of its start record): undefined until the call is
   * registered (`begin`, on its first captured bytes or its end), null when it could not be.
   */
  callId: number | null | undefined = undefined;
  /** Why the sink could not register the call (it never throws by contract). */
  startError: unknown = null;
  readonly requestFrames: number[] = [];
  readonly responseFrames: number[] = [];
  readonly agentRequestFrames: number[] = [];
  readonly agentResponseFrames: number[] = [];
  /** Set by a translated call. */
  translation: Translation | null = null;
  /** Why this call will have no token ids (set when the sidecar knows it). */
  tokenIdsMissing: string | null = null;
  /** How token-in served it (`spliced`, `rendered:<reason>`, `fallback:<reason>`); null when token-in is off. */
  tokenIn: string | null = null;
  /** The model-server replica that served the call (`address:port`). */
  upstreamReplica: string | null = null;
  private captured = 0;
  /** A streamed answer's chunks not yet handed to the sink (see `response`). */
  private streaming: Buffer[] = [];
  private streamingBytes = 0;
  /** The request's held bytes were written (its answer began); a request sent again is held anew. */
  private requestWritten = false;
  truncated = false;
  /** The capture cap cut the record (`truncated` is set too; it is also set when the sink refused bytes). */
  capped = false;
  responseStatus: number | null = null;
  responseEncoding: string | undefined;
  streamed = false;
  firstByteAt: number | null = null;
  chunks = 0;
  injected: string[] = [];
  /** Whether the request names an image, when the proxy looked (see `CallRecord.namesImage`). */
  namesImage: boolean | null = null;
  policyVersion: string | null = null;

  constructor(
    readonly api: Api,
    readonly correlation: Correlation,
    readonly seq: number,
    readonly traceId: string | null,
    readonly spanId: string | null,
    readonly startedAt: number,
    private readonly maxCaptureBytes: number,
    private readonly sink: CaptureSink,
  ) {}

  /**
   * Registers the call with the sink (its start record) unless that is done; its id. Lazily, so
   * that the proxy sends the agent's first bytes to the model server before any capture work:
   * the start record is written with the call's bytes, before the agent can see an answer.
   */
  begin(): number | null {
    if (this.callId === undefined) {
      try {
        this.callId = this.sink.callStarted({
          type: 'call_start',
          correlation: this.correlation,
          seq: this.seq,
          api: this.api,
          traceId: this.traceId,
          at: this.startedAt,
        });
      } catch (err) {
        this.callId = null;
        this.startError = err;
      }
    }
    return this.callId;
  }

  /** Bytes sent to the model server. */
  request(chunk: Buffer): void {
    this.keep(chunk, 'request', this.requestFrames);
  }

  /**
   * Pieces of the request sent in one write (the agent's bytes with fields added between them):
   * one body frame for all, not one a piece. Empty pieces are left out.
   */
  requestParts(parts: readonly Buffer[]): void {
    let n = 0;
    for (const p of parts) if (p.length > 0) n++;
    if (n === 0) return;
    if (n === 1) return this.request(parts.find((p) => p.length > 0)!);
    this.keepParts('request', n === parts.length ? parts : parts.filter((p) => p.length > 0), this.requestFrames);
  }

  /** Bytes the model server answered. */
  response(chunk: Buffer): void {
    this.chunks++;
    if (!this.requestWritten) {
      // The request is complete once its answer begins.
      this.requestWritten = true;
      this.flush('request');
    }
    if (!this.streamed) {
      this.keep(chunk, 'response', this.responseFrames);
      return;
    }
    // A streamed answer's bytes reach the agent as they come. Its chunks are handed to the sink
    // together right before the journal's next write (one frame for many, not one a chunk); once
    // the answer has begun the call is written at the end of this turn (the rest of the stream
    // goes with later writes; its end is written before the agent sees it).
    if (this.begin() === null || this.truncated) return;
    this.streaming.push(chunk);
    this.streamingBytes += chunk.length;
    try {
      if (this.streaming.length === 1) this.sink.beforeWrite(this.handOver);
      else if (this.streamingBytes >= HAND_OVER_BYTES) this.flush('response');
      if (this.chunks === 1) this.sink.writeSoon();
    } catch {
      // The sink never throws by contract; what it was not given goes with the call's end.
    }
  }

  /** Run by the sink before its write; nothing to do when the chunks went already (cap reached, or the call ended). */
  private readonly handOver = (): void => {
    if (this.streaming.length > 0) this.flush('response');
  };

  /** Everything kept of the request (or response) so far is in the journal's queue (the sink may hold bytes back). */
  flush(kind: 'request' | 'response'): void {
    if (kind === 'response' && this.streaming.length > 0) {
      const parts = this.streaming;
      this.streaming = [];
      this.streamingBytes = 0;
      this.keepParts('response', parts, this.responseFrames);
    }
    if (this.begin() === null || this.truncated) return;
    let kept = false;
    try {
      kept = this.sink.bodyFlush(this.callId!, kind, kind === 'request' ? this.requestFrames : this.responseFrames);
    } catch {
      // As for bodies: the sink never throws by contract.
    }
    if (!kept) this.truncated = true;
  }

  /** Translated calls: bytes the agent sent (before translation). */
  agentRequest(chunk: Buffer): void {
    this.keep(chunk, 'agent_request', this.agentRequestFrames);
  }

  /** Translated calls: bytes the agent received (after translation). */
  agentResponse(chunk: Buffer): void {
    this.keep(chunk, 'agent_response', this.agentResponseFrames);
  }

  private keep(chunk: Buffer, kind: BodyKind, frames: number[]): void {
    if (this.begin() === null || this.truncated) return;
    if (this.captured + chunk.length > this.maxCaptureBytes) {
      // What was kept is the record's prefix: bytes the sink holds go in before it is cut.
      if (kind === 'request' || kind === 'response') this.flush(kind);
      this.truncated = true;
      this.capped = true;
      return;
    }
    this.give(kind, chunk, chunk.length, frames);
  }

  /** Pieces handed to the sink together (streamed response chunks, a request's pieces); cut short at the capture cap like `keep`. */
  private keepParts(kind: 'request' | 'response', parts: readonly Buffer[], frames: number[]): void {
    if (this.begin() === null || this.truncated) return;
    let n = 0;
    let bytes = 0;
    while (n < parts.length && this.captured + bytes + parts[n].length <= this.maxCaptureBytes) bytes += parts[n++].length;
    if (n > 0 && !this.give(kind, n === parts.length ? parts : parts.slice(0, n), bytes, frames)) return;
    if (n < parts.length) {
      this.flush(kind);
      this.truncated = true;
      this.capped = true;
    }
  }

  /** Hands bytes within the cap to the sink; false (the record truncated) when it does not take them. */
  private give(kind: BodyKind, bytes: Buffer | readonly Buffer[], length: number, frames: number[]): boolean {
    this.captured += length;
    let kept = false;
    try {
      kept = this.sink.body(this.callId!, kind, bytes, frames);
    } catch {
      // The sink never throws by contract; if it does, the record is incomplete, the call is served.
    }
    if (!kept) this.truncated = true;
    return kept;
  }

  /**
   * How many of the request's first bytes (those given so far) equal its rollout's previous
   * request's, and what was noted about that one; null when nothing is known.
   */
  requestRepeats(): { shared: number; notes: unknown } | null {
    if (this.callId == null || this.truncated) return null;
    try {
      return this.sink.requestRepeats?.(this.callId) ?? null;
    } catch {
      return null;
    }
  }

  /** Notes about the request for the next call of its rollout (see `requestRepeats`). */
  noteRequest(notes: unknown): void {
    if (this.callId == null || this.truncated) return;
    try {
      this.sink.noteRequest?.(this.callId, notes);
    } catch {
      // The sink never throws by contract; the note only saves the next call work.
    }
  }

  /** The call's request (or response) is sent again, changed: what was kept of it is dropped. */
  restart(kind: 'request' | 'response'): void {
    if (kind === 'response') {
      this.streaming = [];
      this.streamingBytes = 0;
    }
    (kind === 'request' ? this.requestFrames : this.responseFrames).length = 0;
    if (kind === 'request') this.requestWritten = false;
    try {
      if (this.callId != null) this.sink.restartBody(this.callId, kind);
    } catch {
      // As for bodies: the sink never throws by contract; the call is served regardless.
    }
  }

  /** The call's end record: metadata and where its bodies are. */
  finish(outcome: { status: 'ok' | 'error' | 'aborted'; error: string | null; endedAt: number; endedMono: number }, startedMono: number): CallRecord {
    this.flush('request');
    this.flush('response');
    return {
      type: 'call',
      correlation: this.correlation,
      seq: this.seq,
      api: this.api,
      traceId: this.traceId,
      spanId: this.spanId,
      callId: this.callId ?? undefined,
      // The record stays in memory while its episode is open: its arrays are copied to their
      // length (the growing ones have room for 17 numbers; 20,000 open calls kept ~9 MB of it).
      bodies: {
        request: this.requestFrames.slice(),
        response: this.responseFrames.slice(),
        encoding: this.responseEncoding ?? null,
        ...(this.translation ? { agentRequest: this.agentRequestFrames.slice(), agentResponse: this.agentResponseFrames.slice() } : {}),
      },
      ...(this.translation ? { translation: this.translation } : {}),
      ...(this.tokenIdsMissing ? { tokenIdsMissing: this.tokenIdsMissing } : {}),
      ...(this.tokenIn ? { tokenIn: this.tokenIn } : {}),
      ...(this.upstreamReplica ? { upstreamReplica: this.upstreamReplica } : {}),
      streamed: this.streamed,
      status: outcome.status,
      httpStatus: this.responseStatus,
      error: outcome.error,
      injected: this.injected.slice(),
      ...(this.namesImage !== null ? { namesImage: this.namesImage } : {}),
      truncated: this.truncated,
      startedAt: this.startedAt,
      endedAt: outcome.endedAt,
      latencyMs: round3(outcome.endedMono - startedMono),
      ttftMs: this.firstByteAt === null ? null : round3(this.firstByteAt - startedMono),
      policyVersion: this.policyVersion,
    };
  }
}

/** Streamed chunks are handed over at once when this many bytes wait (the journal writes at the end of the turn then). */
const HAND_OVER_BYTES = 64 * 1024;

function round3(n: number): number {
  return Math.round(n * 1000) / 1000;
}
