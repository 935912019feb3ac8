import { brotliDecompressSync, gunzipSync, inflateSync } from 'node:zlib';
import type { Api, CallRecord, Correlation } from '../../pipeline/records';
import { extractBody, extractStream, type Extracted } from './adapters';

/**
 * What the hot path collects for one recorded call: references to the chunks as they passed
 * (no copies, no parsing), bounded by the capture cap. `finish` parses it all, off the hot path.
 */
export class CallCapture {
  readonly requestChunks: Buffer[] = [];
  readonly responseChunks: Buffer[] = [];
  private captured = 0;
  truncated = false;
  requestBody: Buffer | null = null;
  responseStatus: number | null = null;
  responseEncoding: string | undefined;
  streamed = false;
  firstByteAt: number | null = null;
  chunks = 0;
  injected: string[] = [];
  policyVersion: string | null = null;

  constructor(
    readonly api: Api,
    readonly correlation: Correlation,
    readonly seq: number,
    readonly traceId: string | null,
    readonly spanId: string | null,
    readonly startedAt: number,
    private readonly maxCaptureBytes: number,
  ) {}

  /** Keeps a reference to a request chunk while under the cap. */
  request(chunk: Buffer): void {
    if (this.keep(chunk.length)) this.requestChunks.push(chunk);
  }

  response(chunk: Buffer): void {
    this.chunks++;
    if (this.keep(chunk.length)) this.responseChunks.push(chunk);
  }

  private keep(n: number): boolean {
    if (this.truncated) return false;
    if (this.captured + n > this.maxCaptureBytes) {
      this.truncated = true;
      return false;
    }
    this.captured += n;
    return true;
  }

  /** Builds the record. Never throws: whatever cannot be parsed is recorded as null with a reason. */
  finish(outcome: { status: 'ok' | 'error' | 'aborted'; error: string | null; endedAt: number; endedMono: number }, startedMono: number): CallRecord {
    const request = parseJson(this.requestBody ?? Buffer.concat(this.requestChunks), undefined);
    const responseBytes = Buffer.concat(this.responseChunks);
    let extracted: Extracted | null = null;
    let parseError: string | null = null;
    if (responseBytes.length > 0) {
      const decoded = decode(responseBytes, this.responseEncoding, this.maxCaptureBytes);
      if (decoded === null) parseError = `cannot decode content-encoding ${this.responseEncoding}`;
      else if (this.streamed) extracted = extractStream(this.api, decoded.toString('utf8'));
      else {
        const body = parseJson(decoded, undefined);
        if (body.ok) extracted = extractBody(this.api, body.value);
        else parseError = 'response body is not JSON';
      }
    }
    const httpStatus = this.responseStatus;
    let status = outcome.status;
    let error = outcome.error;
    if (status === 'ok' && httpStatus !== null && httpStatus >= 400) {
      status = 'error';
      error = `upstream answered ${httpStatus}`;
    }
    if (status === 'ok' && extracted?.incomplete) {
      status = 'error';
      error = 'stream ended without its terminal event';
    }
    if (status === 'ok' && parseError && !this.truncated) {
      status = 'error';
      error = parseError;
    }
    const req = request.ok ? request.value : null;
    return {
      type: 'call',
      correlation: this.correlation,
      seq: this.seq,
      api: this.api,
      model: extracted?.model ?? (isRecord(req) && typeof req.model === 'string' ? req.model : null),
      traceId: this.traceId,
      spanId: this.spanId,
      request: req,
      response: extracted?.response ?? null,
      streamed: this.streamed,
      status,
      httpStatus,
      error,
      usage: extracted?.usage ?? null,
      promptTokenIds: extracted?.promptTokenIds ?? null,
      choices: extracted?.choices ?? [],
      injected: this.injected,
      truncated: this.truncated,
      startedAt: this.startedAt,
      endedAt: outcome.endedAt,
      latencyMs: round3(outcome.endedMono - startedMono),
      ttftMs: this.firstByteAt === null ? null : round3(this.firstByteAt - startedMono),
      policyVersion: this.policyVersion,
    };
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function round3(n: number): number {
  return Math.round(n * 1000) / 1000;
}

function parseJson(bytes: Buffer, encoding: string | undefined): { ok: true; value: unknown } | { ok: false } {
  const decoded = decode(bytes, encoding);
  if (decoded === null || decoded.length === 0) return { ok: false };
  try {
    return { ok: true, value: JSON.parse(decoded.toString('utf8')) };
  } catch {
    return { ok: false };
  }
}

/** Undoes a response `content-encoding` for capture (the agent got the encoded bytes). */
function decode(bytes: Buffer, encoding: string | undefined, maxOutputLength = 64 * 1024 * 1024): Buffer | null {
  const enc = (encoding ?? 'identity').trim().toLowerCase();
  try {
    if (enc === 'identity' || enc === '') return bytes;
    if (enc === 'gzip' || enc === 'x-gzip') return gunzipSync(bytes, { maxOutputLength });
    if (enc === 'deflate') return inflateSync(bytes, { maxOutputLength });
    if (enc === 'br') return brotliDecompressSync(bytes, { maxOutputLength });
  } catch {
    return null;
  }
  return null;
}
