import { StringDecoder } from 'node:string_decoder';

/**
 * The event-stream format (WHATWG HTML §9.2.6), in one place: the line-ending rule, the
 * incremental framing of raw bytes into events (for pass-through that rewrites events without
 * copying the rest), the parsing of fields into events (whole text or as bytes arrive), and the
 * writing of one event.
 */

/** One dispatched Server-Sent Event (WHATWG HTML §9.2.6). */
export interface SseEvent {
  event: string;
  data: string;
}

const LF = 10;
const CR = 13;

/** A piece of a stream: bytes, or text. CR and LF are the same code units in both. */
type Piece = Buffer | string;

/**
 * The one line-ending rule of the format: a line ends at CRLF, LF or CR, and an empty line ends
 * an event. Fed a stream piece by piece (bytes or decoded text: CR and LF are never part of a
 * multi-byte UTF-8 character), it finds every line end whatever the boundaries, including a CR
 * that ends one piece and the LF that opens the next (one line end, not two).
 *
 * Line breaks are found with `indexOf` (memchr on bytes), each position searched for once: a piece
 * in the middle of a big event has none, and walking its bytes one by one in JavaScript cost
 * ~1 µs a KiB.
 */
export class SseLineEnds {
  /** The previous piece ended in CR: an LF opening the next one belongs to that line end. */
  private afterCr = false;
  /** The current line has content from earlier pieces. */
  private lineOpen = false;

  /**
   * Calls `line(start, end, next, blank)` for each line that ends in `piece`, in order: the
   * line's content in this piece is [start, end) (earlier pieces may hold the rest of it), its
   * terminator is [end, next), and `blank` says the whole line is empty (an event ends at `next`).
   * Returns where the unterminated rest of the piece begins (`piece.length` when there is none).
   */
  scan(piece: Piece, line: (start: number, end: number, next: number, blank: boolean) => void): number {
    const n = piece.length;
    let start = 0;
    if (n === 0) return 0;
    if (this.afterCr) {
      this.afterCr = false;
      if (code(piece, 0) === LF) start = 1;
    }
    let lf = find(piece, '\n', LF, start);
    let cr = find(piece, '\r', CR, start);
    while (lf >= 0 || cr >= 0) {
      const end = lf < 0 ? cr : cr < 0 ? lf : Math.min(lf, cr);
      let next = end + 1;
      if (end === cr) {
        if (next === n) this.afterCr = true;
        else if (lf === next) next++;
      }
      line(start, end, next, !this.lineOpen && start === end);
      this.lineOpen = false;
      start = next;
      if (lf >= 0 && lf < start) lf = find(piece, '\n', LF, start);
      if (cr >= 0 && cr < start) cr = find(piece, '\r', CR, start);
    }
    if (start < n) this.lineOpen = true;
    return start;
  }
}

function code(piece: Piece, i: number): number {
  return typeof piece === 'string' ? piece.charCodeAt(i) : piece[i];
}

function find(piece: Piece, ch: string, byte: number, from: number): number {
  return typeof piece === 'string' ? piece.indexOf(ch, from) : piece.indexOf(byte, from);
}

/**
 * Frames an event stream's raw bytes into events as they arrive, without decoding or copying
 * them: `push` gives the offsets in the chunk just past each event that ends in it (after the
 * terminator of its blank line). An event is the bytes from the previous end (possibly in earlier
 * chunks) to its end. An LF that completes a CRLF blank line in the next chunk counts as the next
 * event's first byte: the CR already ended the event.
 */
export class SseEventFramer {
  private readonly lines = new SseLineEnds();

  push(chunk: Buffer): number[] {
    const ends: number[] = [];
    this.lines.scan(chunk, (_start, _end, next, blank) => {
      if (blank) ends.push(next);
    });
    return ends;
  }
}

/** An event grew past the parser's bound without its blank line. */
export class SseEventTooLargeError extends Error {
  readonly code = 'SSE_EVENT_TOO_LARGE';
  constructor(readonly maxEventChars: number) {
    super(`sse: an event exceeds ${maxEventChars} characters`);
  }
}

/**
 * Parses event-stream text into events, fed in any pieces: `:` starts a comment; a field's single
 * leading space is dropped; `data` lines join with `\n`; a blank line dispatches. `end()` also
 * returns a last event that lacks its blank line (streams cut short matter for capture), and says
 * whether there was one. Memory is bounded: an event (its fields and its open line) longer than
 * `maxEventChars` throws `SseEventTooLargeError`.
 */
export class SseTextParser {
  private readonly lines = new SseLineEnds();
  /** Pieces of the line not yet terminated (joined once it is, not on every piece). */
  private line: string[] = [];
  /** Characters held for the current event's fields, and for its open line. */
  private eventChars = 0;
  private lineChars = 0;
  private event = '';
  private data: string[] = [];
  private pending = false;

  constructor(private readonly maxEventChars = Infinity) {}

  /** Events completed by this text, in order. */
  push(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    if (text.length === 0) return out;
    const rest = this.lines.scan(text, (start, end) => {
      // A line within this text (the usual case) is one slice: no pieces to join.
      let line = text.slice(start, end);
      if (this.line.length > 0) {
        this.line.push(line);
        line = this.line.join('');
        this.line = [];
      }
      this.lineChars = 0;
      this.processLine(line, out);
    });
    if (rest < text.length) {
      const piece = text.slice(rest);
      this.lineChars += piece.length;
      this.line.push(piece);
      this.bound();
    }
    return out;
  }

  /** The stream ended: the event still held, including one without its blank line. */
  end(): { events: SseEvent[]; complete: boolean } {
    const events: SseEvent[] = [];
    if (this.line.length > 0) {
      const line = this.line.join('');
      this.line = [];
      this.lineChars = 0;
      this.processLine(line, events);
    }
    const complete = !this.pending;
    this.dispatch(events);
    return { events, complete };
  }

  private processLine(line: string, out: SseEvent[]): void {
    if (line.length === 0) {
      this.dispatch(out);
      return;
    }
    if (line.charCodeAt(0) === 58 /* : */) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    if (field === 'data') {
      this.data.push(value);
      this.eventChars += value.length + 1;
      this.pending = true;
    } else if (field === 'event') {
      this.event = value;
      this.eventChars += value.length;
      this.pending = true;
    }
    this.bound();
  }

  private bound(): void {
    if (this.eventChars + this.lineChars > this.maxEventChars) throw new SseEventTooLargeError(this.maxEventChars);
  }

  private dispatch(out: SseEvent[]): void {
    if (this.pending) out.push({ event: this.event || 'message', data: this.data.join('\n') });
    this.event = '';
    this.data = [];
    this.pending = false;
    this.eventChars = 0;
  }
}

/**
 * Splits an event stream into events as its bytes arrive, whatever the chunk boundaries: inside a
 * line, between the CR and LF of a line end, or inside a multi-byte character (`SseTextParser`
 * over UTF-8 decoded as it comes). `end()` also returns a last event that lacks its blank line, so
 * a stream cut short loses nothing it carried. An event longer than `maxEventChars` throws
 * `SseEventTooLargeError`.
 */
export class SseSplitter {
  private readonly decoder = new StringDecoder('utf8');
  private readonly parser: SseTextParser;

  constructor(maxEventChars = 32 * 1024 * 1024) {
    this.parser = new SseTextParser(maxEventChars);
  }

  /** Events completed by this chunk, in order. */
  push(chunk: Buffer): SseEvent[] {
    return this.parser.push(this.decoder.write(chunk));
  }

  /** The stream ended: events still held, including one without its blank line. */
  end(): SseEvent[] {
    const out = this.parser.push(this.decoder.end());
    out.push(...this.parser.end().events);
    return out;
  }
}

/**
 * Parses a complete (or truncated) event stream. A final event without its blank line is still
 * returned (streams cut short matter for capture), flagged by `complete: false`.
 */
export function parseSse(text: string): { events: SseEvent[]; complete: boolean } {
  const parser = new SseTextParser();
  const events = parser.push(text);
  const last = parser.end();
  events.push(...last.events);
  return { events, complete: last.complete };
}

/** The JSON payloads of a stream's events; `[DONE]` and unparsable payloads are counted, not thrown. */
export function sseJsonPayloads(text: string): { payloads: { event: string; value: unknown }[]; done: boolean; invalid: number; complete: boolean } {
  const { events, complete } = parseSse(text);
  const payloads: { event: string; value: unknown }[] = [];
  let done = false;
  let invalid = 0;
  for (const e of events) {
    if (e.data === '[DONE]') {
      done = true;
      continue;
    }
    if (e.data === '') continue;
    try {
      payloads.push({ event: e.event, value: JSON.parse(e.data) });
    } catch {
      invalid++;
    }
  }
  return { payloads, done, invalid, complete };
}

/** One Server-Sent Event with its `event:` line (as the Responses and Anthropic streams carry). */
export function sseEvent(event: string, data: unknown): string {
  return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}
