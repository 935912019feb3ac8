/**
 * An incremental parser for HTTP/1.x responses (RFC 9112), for the proxy's own upstream client:
 * the status line and header section, then the body by its framing (§6.3): none (HEAD, 1xx,
 * 204, 304), chunked (decoded; trailers read and dropped), content-length, or until the
 * connection closes. Interim 1xx responses are skipped. Body bytes are handed on as views of
 * the chunks received (no copy).
 */
export interface ResponseHead {
  /** 0 for HTTP/1.0, 1 for HTTP/1.1. */
  minor: number;
  status: number;
  statusMessage: string;
  /** Flat [name, value, name, value, …] as received (names keep their case). */
  rawHeaders: string[];
}

export interface ResponseSink {
  head(head: ResponseHead): void;
  body(chunk: Buffer): void;
  /** The response is complete (its body framing says so). */
  end(): void;
}

export class Http1ProtocolError extends Error {
  readonly code = 'HPE_UPSTREAM';
}

const enum State {
  Head,
  Length,
  ChunkSize,
  ChunkData,
  ChunkDataEnd,
  Trailers,
  UntilClose,
  Done,
}

/** A token (RFC 9110 §5.6.2) as a header name. */
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const STATUS_LINE = /^HTTP\/1\.([01]) (\d{3})(?: (.*))?$/;
const CRLF = Buffer.from('\r\n');
const HEAD_END = Buffer.from('\r\n\r\n');

export class Http1ResponseParser {
  private state = State.Head;
  /** Bytes of an unfinished head, size line or trailer section. */
  private pending: Buffer | null = null;
  private remaining = 0;
  private noBody = false;
  private head: ResponseHead | null = null;
  /** The connection may carry another exchange after this response. */
  keepAlive = false;

  constructor(
    private readonly sink: ResponseSink,
    private readonly maxHeadBytes = 64 * 1024,
  ) {}

  /** Starts a new response; `method` decides whether it can have a body (HEAD cannot). */
  reset(method: string): void {
    this.state = State.Head;
    this.pending = null;
    this.remaining = 0;
    this.noBody = method === 'HEAD';
    this.head = null;
    this.keepAlive = false;
  }

  get complete(): boolean {
    return this.state === State.Done;
  }

  /**
   * Feeds bytes. Returns how many were used: fewer than given only once the response is complete
   * (the rest belongs to no exchange). Throws Http1ProtocolError on bytes that are not a response.
   */
  execute(chunk: Buffer): number {
    let at = 0;
    while (at < chunk.length && this.state !== State.Done) {
      switch (this.state) {
        case State.Head:
          at = this.readHead(chunk, at);
          break;
        case State.Length: {
          const part = this.take(chunk, at);
          at += part.length;
          if (this.remaining === 0) this.state = State.Done;
          this.sink.body(part);
          if (this.state === State.Done) this.sink.end();
          break;
        }
        case State.UntilClose:
          this.sink.body(at === 0 ? chunk : chunk.subarray(at));
          at = chunk.length;
          break;
        case State.ChunkSize:
          at = this.readChunkSize(chunk, at);
          break;
        case State.ChunkData: {
          const part = this.take(chunk, at);
          at += part.length;
          if (this.remaining === 0) {
            this.state = State.ChunkDataEnd;
            this.remaining = 2;
          }
          this.sink.body(part);
          break;
        }
        case State.ChunkDataEnd:
          // The CRLF after a chunk's data (it may arrive one byte at a time).
          if (chunk[at] !== (this.remaining === 2 ? 0x0d : 0x0a)) throw new Http1ProtocolError('chunk data not followed by CRLF');
          at++;
          if (--this.remaining === 0) this.state = State.ChunkSize;
          break;
        case State.Trailers:
          at = this.readTrailers(chunk, at);
          break;
      }
    }
    return at;
  }

  /** Up to `remaining` body bytes from `at` (a view), counted off `remaining`. */
  private take(chunk: Buffer, at: number): Buffer {
    const n = Math.min(this.remaining, chunk.length - at);
    this.remaining -= n;
    return chunk.subarray(at, at + n);
  }

  /** The connection ended: a body read until close is complete; anything else is cut short. */
  finish(): void {
    if (this.state === State.UntilClose) {
      this.state = State.Done;
      this.sink.end();
      return;
    }
    if (this.state !== State.Done) throw new Http1ProtocolError(this.head ? 'response body cut short' : 'connection closed before a response');
  }

  /** Bytes up to a terminator, across chunks: [line bytes, index after the terminator] or null (wait for more). */
  private upTo(chunk: Buffer, at: number, terminator: Buffer, limit: number, what: string): [Buffer, number] | null {
    let found: [Buffer, number] | null = null;
    if (this.pending === null) {
      const end = chunk.indexOf(terminator, at);
      if (end >= 0) found = [chunk.subarray(at, end), end + terminator.length];
      else this.pending = Buffer.from(chunk.subarray(at));
    } else {
      const joined = Buffer.concat([this.pending, chunk.subarray(at)]);
      const end = joined.indexOf(terminator, Math.max(0, this.pending.length - terminator.length + 1));
      if (end >= 0) {
        found = [joined.subarray(0, end), at + end + terminator.length - this.pending.length];
        this.pending = null;
      } else this.pending = joined;
    }
    if ((found?.[0] ?? this.pending!).length > limit) throw new Http1ProtocolError(`${what} over ${limit} bytes`);
    return found;
  }

  private readHead(chunk: Buffer, at: number): number {
    const found = this.upTo(chunk, at, HEAD_END, this.maxHeadBytes, 'response head');
    if (found === null) return chunk.length;
    const [bytes, next] = found;
    const lines = bytes.toString('latin1').split('\r\n');
    const m = STATUS_LINE.exec(lines[0]);
    if (!m) throw new Http1ProtocolError(`not an HTTP/1 status line: ${JSON.stringify(lines[0].slice(0, 80))}`);
    const status = Number(m[2]);
    const rawHeaders: string[] = [];
    let length: number | null = null;
    let chunked = false;
    let transferEncoding = false;
    let close = false;
    let keepAliveToken = false;
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i];
      const colon = line.indexOf(':');
      const name = colon > 0 ? line.slice(0, colon) : '';
      if (!TOKEN.test(name)) throw new Http1ProtocolError(`malformed header line ${JSON.stringify(line.slice(0, 80))}`);
      const value = line.slice(colon + 1).trim();
      rawHeaders.push(name, value);
      switch (name.toLowerCase()) {
        case 'content-length': {
          // A list of identical values is one length (RFC 9110 §8.6); anything else is an error.
          for (const v of value.split(',')) {
            const t = v.trim();
            if (!/^\d{1,15}$/.test(t) || (length !== null && Number(t) !== length))
              throw new Http1ProtocolError(`invalid content-length ${JSON.stringify(value)}`);
            length = Number(t);
          }
          break;
        }
        case 'transfer-encoding': {
          transferEncoding = true;
          const codings = value.toLowerCase().split(',');
          chunked = codings[codings.length - 1].trim() === 'chunked';
          break;
        }
        case 'connection':
          for (const t of value.toLowerCase().split(',')) {
            const token = t.trim();
            if (token === 'close') close = true;
            else if (token === 'keep-alive') keepAliveToken = true;
          }
          break;
      }
    }
    if (status >= 100 && status < 200) {
      // Interim (100 Continue, 103 Early Hints): the final response follows; 101 would switch protocols.
      if (status === 101) throw new Http1ProtocolError('upstream switched protocols');
      return next;
    }
    const minor = Number(m[1]);
    this.head = { minor, status, statusMessage: m[3] ?? '', rawHeaders };
    // RFC 9112 §9.3: HTTP/1.1 persists unless closed; 1.0 only when asked to.
    this.keepAlive = !close && (minor === 1 || keepAliveToken);
    if (this.noBody || status === 204 || status === 304) this.state = State.Done;
    else if (transferEncoding) {
      this.state = chunked ? State.ChunkSize : State.UntilClose;
      // With both, transfer-encoding wins and the connection cannot be trusted after (§6.3).
      if (length !== null || !chunked) this.keepAlive = false;
    } else if (length !== null) {
      this.remaining = length;
      this.state = length === 0 ? State.Done : State.Length;
    } else {
      this.state = State.UntilClose;
      this.keepAlive = false;
    }
    this.sink.head(this.head);
    if (this.state === State.Done) this.sink.end();
    return next;
  }

  private readChunkSize(chunk: Buffer, at: number): number {
    const found = this.upTo(chunk, at, CRLF, 4096, 'chunk size line');
    if (found === null) return chunk.length;
    const [line, next] = found;
    let size = 0;
    let i = 0;
    for (; i < line.length; i++) {
      const c = line[i];
      const d = c >= 0x30 && c <= 0x39 ? c - 0x30 : c >= 0x61 && c <= 0x66 ? c - 0x57 : c >= 0x41 && c <= 0x46 ? c - 0x37 : -1;
      if (d < 0) break;
      size = size * 16 + d;
      if (size > Number.MAX_SAFE_INTEGER / 16) throw new Http1ProtocolError('chunk size too large');
    }
    // Chunk extensions (`;name=value`, with optional whitespace before) are allowed and ignored.
    if (i === 0 || (i < line.length && line[i] !== 0x3b && line[i] !== 0x20 && line[i] !== 0x09)) throw new Http1ProtocolError('malformed chunk size line');
    if (size === 0) this.state = State.Trailers;
    else {
      this.remaining = size;
      this.state = State.ChunkData;
    }
    return next;
  }

  /** The trailer section after the last chunk: field lines until an empty one (they are dropped). */
  private readTrailers(chunk: Buffer, at: number): number {
    const found = this.upTo(chunk, at, CRLF, this.maxHeadBytes, 'trailer section');
    if (found === null) return chunk.length;
    const [line, next] = found;
    if (line.length === 0) {
      this.state = State.Done;
      this.sink.end();
    }
    return next;
  }
}
