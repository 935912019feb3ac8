import { StringDecoder } from 'node:string_decoder';
import type { SseEvent } from '../../formats/sse';

/** An event grew past the splitter's bound without its blank line. */
export class SseEventTooLargeError extends Error {
  readonly code = 'SSE_EVENT_TOO_LARGE';
  constructor(readonly maxEventChars: number) {
    super(`sse: an event exceeds ${maxEventChars} characters`);
  }
}

const LINE_END = /[\r\n]/g;

/**
 * Splits an event stream into events as its bytes arrive, whatever the chunk boundaries: inside a
 * line, between the CR and LF of a line end, or inside a multi-byte character. The rules are
 * WHATWG HTML's event-stream parsing (as `parseSse`): lines end in CRLF, LF or CR; `:` starts a
 * comment; a field's single leading space is dropped; `data` lines join with `\n`; a blank line
 * dispatches. `end()` also returns a last event that lacks its blank line, so a stream cut short
 * loses nothing it carried. Memory is bounded: an event longer than `maxEventChars` throws
 * `SseEventTooLargeError`.
 */
export class SseSplitter {
  private readonly decoder = new StringDecoder('utf8');
  /** Pieces of the line not yet terminated (joined once it is, not on every chunk). */
  private line: string[] = [];
  /** Characters held for the current event's fields, and for its open line. */
  private eventChars = 0;
  private lineChars = 0;
  /** The previous text ended in CR: an LF opening the next one belongs to that line end. */
  private afterCr = false;
  private event = '';
  private data: string[] = [];
  private pending = false;

  constructor(private readonly maxEventChars = 32 * 1024 * 1024) {}

  /** Events completed by this chunk, in order. */
  push(chunk: Buffer): SseEvent[] {
    return this.feed(this.decoder.write(chunk));
  }

  /** The stream ended: events still held, including one without its blank line. */
  end(): SseEvent[] {
    const out = this.feed(this.decoder.end());
    if (this.line.length > 0) {
      const line = this.line.join('');
      this.line = [];
      this.lineChars = 0;
      this.processLine(line, out);
    }
    this.dispatch(out);
    return out;
  }

  private feed(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    if (text.length === 0) return out;
    let start = 0;
    if (this.afterCr) {
      this.afterCr = false;
      if (text.charCodeAt(0) === 10) start = 1;
    }
    LINE_END.lastIndex = start;
    let m: RegExpExecArray | null;
    while ((m = LINE_END.exec(text)) !== null) {
      const at = m.index;
      this.line.push(text.slice(start, at));
      const line = this.line.length === 1 ? this.line[0] : this.line.join('');
      this.line = [];
      this.lineChars = 0;
      this.processLine(line, out);
      start = at + 1;
      if (text.charCodeAt(at) === 13) {
        if (at + 1 === text.length) this.afterCr = true;
        else if (text.charCodeAt(at + 1) === 10) start = at + 2;
      }
      LINE_END.lastIndex = start;
    }
    if (start < text.length) {
      const rest = text.slice(start);
      this.lineChars += rest.length;
      this.line.push(rest);
      this.bound();
    }
    return out;
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
