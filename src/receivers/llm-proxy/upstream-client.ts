import { EventEmitter } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';
import { Http1ProtocolError, Http1ResponseParser, type ResponseHead } from '../../formats/http1-response';

/**
 * The proxy's HTTP/1.1 client to the model server: keep-alive connections of its own, requests
 * written as they stream (one write for the head and the first bytes), responses parsed
 * incrementally. It replaces node:http's client on the hot path, whose per-request machinery
 * (agent bookkeeping, a Readable per response, header objects) costs more than the rest of a
 * proxied call. The interface is the part of `http.ClientRequest` / `IncomingMessage` the proxy
 * uses: `write` / `end` / `destroy` / `setTimeout`, `response` and `error` events; the response
 * emits `data`, `end` and `close`, with `statusCode`, `headers` and `rawHeaders`.
 *
 * Connections: idle ones are reused, newest first, and closed after `idleTimeoutMs` (shorter
 * when the server announces `Keep-Alive: timeout=N`), before servers that close idle
 * connections (uvicorn, under vLLM and SGLang, after 5 s) do. A request sent on a reused
 * connection that the server had closed (the connection ends with no byte of a response) is
 * sent once more on a new connection when its body was small enough to keep (`retryBytes`).
 */
export interface UpstreamOrigin {
  /** Where to connect: a host name or an address. */
  hostname: string;
  port: number;
  secure: boolean;
  /** The Host header every request carries (a replica reached by address keeps its URL's host); else the caller's. */
  hostHeader?: string;
  /** TLS server name, when `hostname` is an address resolved from it. */
  servername?: string;
}

export interface UpstreamClientOptions {
  /** Idle connections kept at most. */
  maxIdle?: number;
  /** An idle connection is closed after this long. */
  idleTimeoutMs?: number;
  /** Request bodies up to this size are kept until the answer begins, to be sent again on a new connection. */
  retryBytes?: number;
  /** A connection not established within this long fails with ETIMEDOUT (a silent address is taken as refusing). */
  connectTimeoutMs?: number;
}

export interface UpstreamRequestOptions {
  method: string;
  /** The request target (path and query). */
  path: string;
  /** Flat [name, value, …]: with `content-length` the body is sent as it is, else chunked. */
  headers: readonly string[];
}

const NO_BODY_METHODS = new Set(['GET', 'HEAD', 'DELETE', 'OPTIONS', 'TRACE', 'CONNECT']);
const CHUNK_END = Buffer.from('\r\n');
const LAST_CHUNK = Buffer.from('0\r\n\r\n');

interface Connection {
  socket: net.Socket;
  /** The exchange using it; null while idle. */
  owner: UpstreamRequest | null;
  /** Served an exchange before (a failure with no answer may be the server having closed it). */
  reused: boolean;
  idleTimer: NodeJS.Timeout | null;
  /** The server's `Keep-Alive: timeout` hint, in ms. */
  hintMs: number | null;
  /** The connection was established (a failure before that is a refusal: nothing reached the server). */
  established: boolean;
}

export class UpstreamClient {
  private readonly idle: Connection[] = [];
  private closed = false;
  private readonly maxIdle: number;
  private readonly idleTimeoutMs: number;
  private readonly connectTimeoutMs: number;
  /** Settable: a pool of several replicas keeps more, so a failed replica's call can go to another. */
  retryBytes: number;

  constructor(
    readonly origin: UpstreamOrigin,
    options: UpstreamClientOptions = {},
  ) {
    this.maxIdle = options.maxIdle ?? 256;
    this.idleTimeoutMs = options.idleTimeoutMs ?? 4000;
    this.retryBytes = options.retryBytes ?? 256 * 1024;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
  }

  request(options: UpstreamRequestOptions): UpstreamRequest {
    return new UpstreamRequest(this, options);
  }

  /** Closes idle connections; exchanges in flight finish on theirs, which then close. */
  close(): void {
    this.closed = true;
    for (const c of this.idle.splice(0)) this.drop(c);
  }

  /** An idle connection, or a new one (with `fresh`, always new). */
  connection(fresh = false): Connection {
    while (!fresh && this.idle.length > 0) {
      const c = this.idle.pop()!;
      if (c.idleTimer) clearTimeout(c.idleTimer);
      c.idleTimer = null;
      if (c.socket.destroyed || !c.socket.writable) continue;
      return c;
    }
    const { hostname, port, secure, servername } = this.origin;
    const socket = secure
      ? tls.connect({ host: hostname, port, servername: servername ?? (net.isIP(hostname) ? undefined : hostname), ALPNProtocols: ['http/1.1'] })
      : net.connect({ host: hostname, port });
    socket.setNoDelay(true);
    const c: Connection = { socket, owner: null, reused: false, idleTimer: null, hintMs: null, established: false };
    const connectTimer = setTimeout(
      () => socket.destroy(Object.assign(new Error(`connect to ${hostname}:${port} timed out`), { code: 'ETIMEDOUT' })),
      this.connectTimeoutMs,
    );
    connectTimer.unref();
    socket.once(secure ? 'secureConnect' : 'connect', () => {
      c.established = true;
      clearTimeout(connectTimer);
    });
    socket.once('close', () => clearTimeout(connectTimer));
    socket.on('data', (chunk: Buffer) => {
      if (c.owner) c.owner.onData(chunk);
      // Bytes on an idle connection belong to no exchange: it cannot be used again.
      else this.drop(c);
    });
    socket.on('end', () => (c.owner ? c.owner.onEnd() : this.drop(c)));
    socket.on('error', (err: Error) => (c.owner ? c.owner.onSocketError(err) : this.drop(c)));
    socket.on('close', () => {
      c.owner?.onSocketError(Object.assign(new Error('upstream connection closed'), { code: 'ECONNRESET' }));
      this.forget(c);
    });
    socket.on('timeout', () => c.owner?.onIdle());
    return c;
  }

  /** An exchange is done with its connection: kept for the next one, or closed. */
  release(c: Connection, reusable: boolean): void {
    c.owner = null;
    c.socket.setTimeout(0);
    // The exchange may have paused it (its agent was slow) just as its answer ended.
    c.socket.resume();
    if (!reusable || this.closed || this.idle.length >= this.maxIdle || c.socket.destroyed) {
      this.drop(c);
      return;
    }
    c.reused = true;
    c.idleTimer = setTimeout(() => this.drop(c), Math.min(this.idleTimeoutMs, c.hintMs ?? Infinity));
    c.idleTimer.unref();
    this.idle.push(c);
  }

  drop(c: Connection): void {
    c.owner = null;
    this.forget(c);
    c.socket.destroy();
  }

  private forget(c: Connection): void {
    if (c.idleTimer) clearTimeout(c.idleTimer);
    c.idleTimer = null;
    const i = this.idle.indexOf(c);
    if (i >= 0) this.idle.splice(i, 1);
  }
}

/** The response of an upstream request (the subset of `IncomingMessage` the proxy reads). */
export class UpstreamResponse extends EventEmitter {
  readonly statusCode: number;
  readonly statusMessage: string;
  readonly rawHeaders: string[];
  /** Lower-case names; repeated fields joined with ", " (set-cookie: the first). No prototype: names are the server's. */
  readonly headers: Record<string, string | undefined> = Object.create(null) as Record<string, string | undefined>;
  complete = false;

  destroyed = false;

  constructor(
    head: ResponseHead,
    private readonly socket: () => net.Socket | null,
    private readonly abort: () => void,
  ) {
    super();
    this.statusCode = head.status;
    this.statusMessage = head.statusMessage;
    this.rawHeaders = head.rawHeaders;
    for (let i = 0; i < head.rawHeaders.length; i += 2) {
      const name = head.rawHeaders[i].toLowerCase();
      const prior = this.headers[name];
      this.headers[name] = prior === undefined ? head.rawHeaders[i + 1] : name === 'set-cookie' ? prior : `${prior}, ${head.rawHeaders[i + 1]}`;
    }
  }

  pause(): this {
    this.socket()?.pause();
    return this;
  }

  resume(): this {
    this.socket()?.resume();
    return this;
  }

  /** Stops reading the answer: the exchange is aborted (`close` follows unless it was complete). */
  destroy(): this {
    this.destroyed = true;
    this.abort();
    return this;
  }
}

/** What routing asks of an exchange (call.ts): told when it is answered and when it is over, asked where to go when its server fails. */
export interface ExchangeRoute {
  /** Another server for an exchange whose server failed before answering a byte (its bytes were
   * kept); null, none. `reached`: the connection had been established, so the server may have
   * read the request (and may fail on it again elsewhere). */
  reroute(err: Error, reached: boolean): UpstreamClient | null;
  /** The response head arrived. */
  answered(): void;
  /** The exchange is over (answered and written, or destroyed); called once. */
  finished(): void;
}

/**
 * One exchange. Events: `response` (UpstreamResponse), `error` (before the response is complete:
 * connect failure, reset, protocol error, or the error given to `destroy`), `drain`.
 */
export class UpstreamRequest extends EventEmitter {
  /** Set by routing (call.ts). */
  route: ExchangeRoute | null = null;
  private conn: Connection | null = null;
  /** A byte of an answer arrived: the exchange can no longer go elsewhere. */
  private heard = false;
  private readonly parser: Http1ResponseParser;
  private res: UpstreamResponse | null = null;
  private head: string | null;
  /** The head's framing line(s), added when the first bytes go out. */
  private framing = '';
  private chunked = false;
  private ended = false;
  private finished = false;
  private answered = false;
  /** What was written, kept for one resend while small and unanswered; null once given up. */
  private sent: Buffer[] | null = [];
  private sentBytes = 0;
  private timeoutMs = 0;
  private onTimeout: (() => void) | null = null;

  constructor(
    private client: UpstreamClient,
    private readonly options: UpstreamRequestOptions,
  ) {
    super();
    this.parser = new Http1ResponseParser({
      head: (h) => {
        this.answered = true;
        this.sent = null;
        this.res = new UpstreamResponse(
          h,
          () => this.conn?.socket ?? null,
          () => this.destroy(),
        );
        if (this.conn) this.conn.hintMs = keepAliveHint(h.rawHeaders);
        this.route?.answered();
        this.emit('response', this.res);
      },
      body: (chunk) => this.res?.emit('data', chunk),
      end: () => this.complete(),
    });
    this.parser.reset(options.method);
    let framed = false;
    for (let i = 0; i < options.headers.length; i += 2) {
      if (options.headers[i].length === 14 && options.headers[i].toLowerCase() === 'content-length') framed = true;
    }
    this.head = this.headFor(client);
    this.chunked = !framed;
    this.attach(this.client.connection());
  }

  /** The request line and headers, with `client`'s Host when it has one. */
  private headFor(client: UpstreamClient): string {
    const { options } = this;
    const host = client.origin.hostHeader;
    let head = `${options.method} ${options.path} HTTP/1.1\r\n`;
    if (host !== undefined) head += `host: ${host}\r\n`;
    for (let i = 0; i < options.headers.length; i += 2) {
      if (host !== undefined && options.headers[i].length === 4 && options.headers[i].toLowerCase() === 'host') continue;
      head += `${options.headers[i]}: ${options.headers[i + 1]}\r\n`;
    }
    return head;
  }

  private attach(c: Connection): void {
    this.conn = c;
    c.owner = this;
    if (this.timeoutMs > 0) c.socket.setTimeout(this.timeoutMs);
  }

  /** Idle timeout while the exchange waits on the server (connect, answer, body). */
  setTimeout(ms: number, onTimeout: () => void): this {
    this.timeoutMs = ms;
    this.onTimeout = onTimeout;
    this.conn?.socket.setTimeout(ms);
    return this;
  }

  /** Body bytes; several buffers go out in one write. False when the connection's buffer is full (`drain` follows). */
  write(chunks: Buffer | readonly Buffer[]): boolean {
    if (this.finished) return true;
    const list = Buffer.isBuffer(chunks) ? [chunks] : chunks;
    return list.some((c) => c.length > 0) ? this.put(list, false) : true;
  }

  end(chunk?: Buffer): void {
    if (this.finished || this.ended) return;
    this.ended = true;
    this.put(chunk && chunk.length > 0 ? [chunk] : [], true);
    if (this.parser.complete) this.done();
  }

  /**
   * Aborts the exchange; with an error, `error` is emitted with it. As with node's streams, the
   * events come on the next tick: the caller finishes what it was doing first.
   */
  destroy(err?: Error): void {
    if (this.finished) return;
    this.finished = true;
    const c = this.conn;
    this.conn = null;
    if (c) this.client.drop(c);
    this.over();
    const res = this.res;
    process.nextTick(() => {
      if (res && !res.complete) res.emit('close');
      if (err) this.emit('error', err);
    });
  }

  private put(chunks: readonly Buffer[], last: boolean): boolean {
    const parts: Buffer[] = [];
    if (this.head !== null) {
      if (this.chunked && last && chunks.length === 0) {
        // No body at all: none announced for methods that take none, an empty one for the others.
        this.chunked = false;
        if (!NO_BODY_METHODS.has(this.options.method)) this.framing = 'content-length: 0\r\n';
      } else if (this.chunked) this.framing = 'transfer-encoding: chunked\r\n';
      parts.push(Buffer.from(`${this.head}${this.framing}\r\n`, 'latin1'));
      this.head = null;
    }
    for (const chunk of chunks) {
      if (chunk.length === 0) continue;
      if (this.chunked) parts.push(Buffer.from(`${chunk.length.toString(16)}\r\n`, 'latin1'), chunk, CHUNK_END);
      else parts.push(chunk);
    }
    if (last && this.chunked) parts.push(LAST_CHUNK);
    if (this.sent !== null) {
      for (const p of parts) this.sentBytes += p.length;
      if (this.sentBytes <= this.client.retryBytes) this.sent.push(...parts);
      else this.sent = null;
    }
    return this.send(parts);
  }

  private send(parts: readonly Buffer[]): boolean {
    const socket = this.conn?.socket;
    if (!socket || parts.length === 0) return true;
    let ok = true;
    if (parts.length > 1) socket.cork();
    for (const p of parts) ok = socket.write(p) && ok;
    if (parts.length > 1) socket.uncork();
    if (!ok) socket.once('drain', this.drained);
    return ok;
  }

  private readonly drained = (): void => {
    if (!this.finished) this.emit('drain');
  };

  /** Bytes from the server. */
  onData(chunk: Buffer): void {
    if (this.finished) return;
    this.heard = true;
    const c = this.conn;
    try {
      // Bytes after the response belong to no exchange (the server broke the protocol): not reused.
      if (this.parser.execute(chunk) < chunk.length && c) this.client.drop(c);
    } catch (err) {
      this.fail(err as Error);
    }
  }

  /** The server ended the connection. */
  onEnd(): void {
    if (this.finished) return;
    try {
      this.parser.finish();
    } catch (err) {
      // As node says it: the connection went away under the exchange.
      this.fail(Object.assign(new Error(`upstream ${(err as Error).message}`), { code: 'ECONNRESET' }));
    }
  }

  onSocketError(err: Error): void {
    if (!this.finished) this.fail(err);
  }

  onIdle(): void {
    if (!this.finished) this.onTimeout?.();
  }

  private fail(err: Error): void {
    const unanswered = !this.answered && this.sent !== null && !(err instanceof Http1ProtocolError);
    // A reused connection the server had closed: the request never reached anyone; send it again.
    if (unanswered && this.conn?.reused) return this.resend(this.client);
    // The server refused or dropped a new connection before a byte of an answer: another one, if any.
    const next = unanswered && !this.heard && this.route ? this.route.reroute(err, this.conn?.established ?? false) : null;
    if (next === null) return this.destroy(err);
    if (this.head === null && this.sent!.length > 0) this.sent![0] = Buffer.from(`${this.headFor(next)}${this.framing}\r\n`, 'latin1');
    else if (this.head !== null) this.head = this.headFor(next);
    this.resend(next);
  }

  /** Sends what was written so far again, on a new connection of `client`. */
  private resend(client: UpstreamClient): void {
    const old = this.conn;
    this.conn = null;
    if (old) this.client.drop(old);
    this.client = client;
    this.attach(client.connection(true));
    this.send(this.sent!);
  }

  private over(): void {
    const route = this.route;
    this.route = null;
    route?.finished();
  }

  private complete(): void {
    this.res!.complete = true;
    this.res!.emit('end');
    if (this.ended) this.done();
  }

  /** Response complete and request written: the connection goes back to the pool (or is closed). */
  private done(): void {
    if (this.finished) return;
    this.finished = true;
    const c = this.conn;
    this.conn = null;
    if (c) this.client.release(c, this.parser.keepAlive);
    this.over();
    this.res?.emit('close');
  }
}

/** A server's `Keep-Alive: timeout=N` (seconds), less a second of margin, in ms. */
function keepAliveHint(raw: readonly string[]): number | null {
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].length !== 10 || raw[i].toLowerCase() !== 'keep-alive') continue;
    const m = /(?:^|[,;\s])timeout\s*=\s*(\d+)/i.exec(raw[i + 1]);
    if (m) return Math.max(0, Number(m[1]) * 1000 - 1000);
  }
  return null;
}
