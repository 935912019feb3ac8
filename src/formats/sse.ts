/** One dispatched Server-Sent Event (WHATWG HTML §9.2.6). */
export interface SseEvent {
  event: string;
  data: string;
}

/**
 * Parses a complete (or truncated) event stream. Lines end in CRLF, LF or CR; `:` starts a
 * comment; a field's single leading space is dropped; `data` lines join with `\n`; a blank line
 * dispatches. A final event without its blank line is still returned (streams cut short matter
 * for capture), flagged by `complete: false`.
 */
export function parseSse(text: string): { events: SseEvent[]; complete: boolean } {
  const events: SseEvent[] = [];
  let event = '';
  let data: string[] = [];
  let pending = false;
  let start = 0;
  const n = text.length;
  const dispatch = (): void => {
    if (pending) events.push({ event: event || 'message', data: data.join('\n') });
    event = '';
    data = [];
    pending = false;
  };
  while (start <= n) {
    let end = start;
    while (end < n && text.charCodeAt(end) !== 10 && text.charCodeAt(end) !== 13) end++;
    if (end === n) {
      // Last line without terminator: a partial line of a cut stream.
      if (end > start) processLine(text.slice(start, end));
      break;
    }
    processLine(text.slice(start, end));
    start = text.charCodeAt(end) === 13 && text.charCodeAt(end + 1) === 10 ? end + 2 : end + 1;
  }
  const complete = !pending;
  dispatch();
  return { events, complete };

  function processLine(line: string): void {
    if (line.length === 0) {
      dispatch();
      return;
    }
    if (line.charCodeAt(0) === 58 /* : */) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    if (field === 'data') {
      data.push(value);
      pending = true;
    } else if (field === 'event') {
      event = value;
      pending = true;
    }
  }
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
