import type { RawBody, TokenIds, Transition, TransitionRecord } from '../model/records';
import { decode, isIdentity, type BodyReader } from '../formats/extract';
import { isJson, readIntArray } from '../formats/json-scan';

/**
 * Writes transitions as JSON with their big parts copied from the journal as they are: the
 * request body, the response body less the members lifted out of it, and token-id arrays. Each
 * byte is read once from the page cache and written once; nothing is parsed and serialized
 * again. Small fields go through JSON.stringify.
 */
export class TransitionWriter {
  private cachedSource: unknown = null;
  private cachedResponse: Buffer | null = null;
  private used = 0;

  /**
   * `arena`: a buffer bodies are read into, one after another, instead of fresh allocations; the
   * parts returned point into it until `reuseArena` (call it once they are written). Bodies that
   * do not fit are read into buffers of their own.
   */
  constructor(
    private readonly reader: BodyReader,
    private readonly arena: Buffer | null = null,
  ) {}

  /** Bytes of the arena holding parts not yet released. */
  get arenaUsed(): number {
    return this.used;
  }

  /** The parts returned so far are written: the arena's bytes may be overwritten. */
  reuseArena(): void {
    this.used = 0;
    this.cachedSource = null;
    this.cachedResponse = null;
  }

  private read(offsets: readonly number[]): Buffer {
    const bytes = this.reader(offsets, this.room());
    this.claim(bytes);
    return bytes;
  }

  /** The arena's free part, if any. */
  private room(): Buffer | undefined {
    return this.arena && this.used < this.arena.length ? this.arena.subarray(this.used) : undefined;
  }

  /** Bytes just read: the arena's, when they were read into its free part. */
  private claim(bytes: Buffer): void {
    if (this.arena && bytes.buffer === this.arena.buffer && bytes.byteOffset === this.arena.byteOffset + this.used) this.used += bytes.length;
  }

  /**
   * The transition's JSON bytes in one buffer; `extra` members are appended (e.g.
   * `bodies_dropped`), then `tail` (members already in JSON, `,"name":value…`). The small fields'
   * text and the journal's bytes are written into it directly: one allocation, no intermediate
   * buffer per piece.
   */
  json(t: TransitionRecord, extra?: Record<string, unknown>, tail?: readonly Buffer[]): Buffer {
    return joinPieces(this.pieces(t, extra, tail));
  }

  /** The same bytes as pieces, for writers that take a list of buffers (no copy into one). */
  jsonParts(t: TransitionRecord, extra?: Record<string, unknown>, tail?: readonly Buffer[]): Buffer[] {
    return this.pieces(t, extra, tail).map((p) => (typeof p === 'string' ? Buffer.from(p) : p));
  }

  /** The JSON as text (the small fields) between the bytes copied as they are. */
  private pieces(t: TransitionRecord, extra?: Record<string, unknown>, tail?: readonly Buffer[]): (string | Buffer)[] {
    const parts: (string | Buffer)[] = [];
    let text = '{';
    const flush = () => {
      if (text.length > 0) parts.push(text);
      text = '';
    };
    let first = true;
    for (const key of Object.keys(t) as (keyof TransitionRecord)[]) {
      if (key === 'source') continue;
      const v = t[key];
      if (v === undefined) continue;
      if (!first) text += ',';
      text += keyText(key);
      first = false;
      const raw = this.rawValue(t, key, v);
      if (raw === undefined) text += JSON.stringify(v);
      else {
        flush();
        for (const r of raw) parts.push(r);
      }
    }
    if (extra) for (const [k, v] of Object.entries(extra)) text += `,${JSON.stringify(k)}:${JSON.stringify(v)}`;
    if (tail) {
      flush();
      for (const b of tail) parts.push(b);
    }
    text += '}';
    flush();
    return parts;
  }

  /** The transition with every journal reference resolved: the wire shape, as a plain object. */
  materialize(t: TransitionRecord): Transition {
    const out = { ...t } as Record<string, unknown>;
    delete out.source;
    out.request = this.parsedBody(t.request);
    out.response = this.parsedBody(t.response);
    out.prompt_token_ids = this.ids(t, t.prompt_token_ids);
    out.response_token_ids = this.ids(t, t.response_token_ids);
    return out as unknown as Transition;
  }

  /** The call's response body, parsed (the model server's answer; small next to its request). */
  parsedResponse(t: TransitionRecord): unknown {
    return this.parsedBody(t.response);
  }

  /** Token ids as numbers (ranges read from the call's response). */
  ids(t: TransitionRecord, ids: TokenIds | null): number[] | null {
    if (ids === null) return null;
    if (Array.isArray(ids)) return ids;
    const bytes = this.idsBytes(t, ids);
    const a = bytes ? readIntArray(bytes, 0, bytes.length) : null;
    return a ? Array.from(a) : null;
  }

  /** Token ids as the JSON text of their array: the model server's bytes for a range, else formatted. */
  idsBytes(t: TransitionRecord, ids: TokenIds | null): Buffer | null {
    if (ids === null) return null;
    if (Array.isArray(ids)) return Buffer.from(JSON.stringify(ids));
    // Only the array's bytes, when the response is not read already and needs no decoding: a
    // trajectory needs the ids, not the rest (an answer with MoE routing is mostly routing).
    const range = this.reader.range;
    if (range && t.source && this.cachedSource !== t.source && isIdentity(t.source.encoding)) {
      try {
        const bytes = range(t.source.response, ids.start, ids.end, this.room());
        this.claim(bytes);
        return bytes.length === ids.end - ids.start ? bytes : null;
      } catch {
        return null;
      }
    }
    const r = this.response(t);
    return r ? r.subarray(ids.start, ids.end) : null;
  }

  private rawValue(t: TransitionRecord, key: keyof TransitionRecord, v: unknown): Buffer[] | undefined {
    if ((key === 'request' || key === 'response') && isRawBody(v)) return this.bodyParts(v, t);
    if ((key === 'prompt_token_ids' || key === 'response_token_ids') && v !== null && !Array.isArray(v)) {
      return [this.idsBytes(t, v as TokenIds) ?? Buffer.from('null')];
    }
    return undefined;
  }

  private bodyParts(body: RawBody, t?: TransitionRecord): Buffer[] {
    // The call's response is read once for its ids and its body alike.
    const bytes = t?.source && body.offsets === t.source.response && body.encoding === t.source.encoding ? this.response(t) : this.bodyBytes(body);
    if (bytes === null) return [Buffer.from('null')];
    if (body.cuts.length === 0) return isJson(bytes) ? [bytes] : [Buffer.from('null')];
    const out: Buffer[] = [];
    let at = 0;
    for (const [s, e] of body.cuts) {
      out.push(bytes.subarray(at, s));
      at = e;
    }
    out.push(bytes.subarray(at));
    return out;
  }

  private bodyBytes(body: RawBody): Buffer | null {
    try {
      return decode(this.read(body.offsets), body.encoding);
    } catch {
      return null;
    }
  }

  private parsedBody(v: unknown): unknown {
    if (!isRawBody(v)) return v ?? null;
    try {
      return JSON.parse(Buffer.concat(this.bodyParts(v)).toString('utf8'));
    } catch {
      return null;
    }
  }

  /** The call's decoded response, read once for all the transitions (choices) of one call. */
  private response(t: TransitionRecord): Buffer | null {
    if (!t.source) return null;
    if (this.cachedSource !== t.source) {
      this.cachedSource = t.source;
      this.cachedResponse = null;
      try {
        this.cachedResponse = decode(this.read(t.source.response), t.source.encoding);
      } catch {
        this.cachedResponse = null;
      }
    }
    return this.cachedResponse;
  }
}

/** Bytes a piece of JSON is copied from: a Buffer, or what writes its bytes as it is copied. */
export interface JsonPiece {
  readonly length: number;
  /** Writes the piece's `length` bytes into `out` at `at`; returns how many it wrote. */
  copy(out: Buffer, at: number): number;
}

/** JSON pieces (text, or bytes as they are) in one buffer: sized first, then written into it. */
export function joinPieces(pieces: readonly (string | JsonPiece)[]): Buffer {
  let size = 0;
  for (const p of pieces) size += typeof p === 'string' ? Buffer.byteLength(p) : p.length;
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  for (const p of pieces) at += typeof p === 'string' ? out.write(p, at) : p.copy(out, at);
  if (at !== size) throw new Error(`JSON of ${at} bytes where ${size} were counted`);
  return out;
}

/** `"key":` for the transition's keys, made once each. */
const keyTexts = new Map<string, string>();
function keyText(key: string): string {
  let k = keyTexts.get(key);
  if (k === undefined) {
    k = `${JSON.stringify(key)}:`;
    if (keyTexts.size < 256) keyTexts.set(key, k);
  }
  return k;
}

export function isRawBody(v: unknown): v is RawBody {
  return typeof v === 'object' && v !== null && (v as { raw?: unknown }).raw === 'journal';
}
