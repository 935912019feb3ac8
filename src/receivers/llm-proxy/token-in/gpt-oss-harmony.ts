import { holdPartial, type ReasoningStream, type ToolCallOut, type ToolStream } from './parser-kit';

/**
 * gpt-oss answers in OpenAI's harmony format: a run of messages
 * `<|start|>{header}<|message|>{text}` each closed by `<|end|>`, `<|call|>` (the model calls a
 * tool and stops) or `<|return|>` (the model has answered and stops). The header holds the role,
 * the channel (`<|channel|>analysis`, `commentary` or `final`), a recipient (`to=functions.NAME`,
 * before or after the channel) and a content type (`json` or `<|constrain|>json`). The prompt ends
 * with `<|start|>assistant`, so the output's first message starts with its header. The parsers
 * below read that text as vLLM's harmony parser reads the ids (openai-harmony's
 * `StreamableParser`): the text must carry the special tokens (a completions request with
 * `skip_special_tokens: false`), else there is nothing to find.
 */

const START = '<|start|>';
const MESSAGE = '<|message|>';
const CHANNEL = '<|channel|>';
const CONSTRAIN = '<|constrain|>';
const CALL = '<|call|>';
/** What closes a message's text (openai-harmony's stop tokens for parsing). */
const ENDS = ['<|end|>', '<|return|>', CALL];
const FUNCTIONS = 'functions.';

interface Header {
  channel: string | null;
  recipient: string | null;
  contentType: string | null;
}

/**
 * A message header as openai-harmony reads it: the channel is the word after `<|channel|>`; of the
 * words left, the first is the role (only when it is `assistant` for the output's first message,
 * whose role the prompt gave); then a last word `to=X` is the recipient, a lone word is the
 * recipient, else the last word is the content type and the one before it the recipient.
 */
function readHeader(text: string, first: boolean): Header {
  let channel: string | null = null;
  let rest = text;
  const at = rest.indexOf(CHANNEL);
  if (at >= 0) {
    const after = rest.slice(at + CHANNEL.length);
    const word = /^[^\s<]*/.exec(after)![0];
    channel = word === '' ? null : word;
    rest = rest.slice(0, at) + after.slice(word.length);
  }
  rest = rest.trim();
  if (rest.includes(CONSTRAIN)) rest = rest.split(CONSTRAIN).join(` ${CONSTRAIN}`).trim();
  const parts = rest.split(/[ \t\n\r\f]+/).filter((p) => p !== '');
  if (!first || parts[0] === 'assistant') parts.shift();
  let recipient: string | null = null;
  let contentType: string | null = null;
  const n = parts.length;
  const last = parts.pop();
  if (last !== undefined) {
    if (last.startsWith('to=')) recipient = last.slice(3);
    else if (n === 1) recipient = last;
    else {
      contentType = last;
      const r = parts.pop();
      if (r !== undefined) recipient = r.startsWith('to=') ? r.slice(3) : r;
    }
  }
  return { channel, recipient, contentType };
}

/** A header written as openai-harmony renders one: role, ` to=recipient`, the channel, ` content type`. */
function renderHeader(h: Header): string {
  let out = 'assistant';
  if (h.recipient !== null) out += ` to=${h.recipient}`;
  if (h.channel !== null) out += `${CHANNEL}${h.channel}`;
  if (h.contentType !== null) out += ` ${h.contentType}`;
  return out;
}

/** The first of `tags` in `buf` from `from` on. */
function firstTag(buf: string, tags: readonly string[], from = 0): { at: number; tag: string } | null {
  let best: { at: number; tag: string } | null = null;
  for (const tag of tags) {
    const at = buf.indexOf(tag, from);
    if (at >= 0 && (best === null || at < best.at)) best = { at, tag };
  }
  return best;
}

/** Holds back the end of `buf` that could be the start of any of `tags`; returns [safe, held]. */
function holdAny(buf: string, tags: readonly string[]): [string, string] {
  let n = 0;
  for (const tag of tags) n = Math.max(n, holdPartial(buf, tag)[1].length);
  return [buf.slice(0, buf.length - n), buf.slice(buf.length - n)];
}

/** What a message is to the answer: reasoning, content, a function call, or nothing. */
type Kind = 'reasoning' | 'content' | 'call' | 'drop';

function kindOf(h: Header): Kind {
  if (h.recipient?.startsWith(FUNCTIONS)) return 'call';
  if (h.channel === 'analysis') return 'reasoning';
  if (h.channel === 'final' || (h.channel === 'commentary' && h.recipient === null)) return 'content';
  return 'drop';
}

/**
 * vLLM's `openai_gptoss` reasoning parser (with its harmony output parsing, `parse_chat_output`):
 * the text of the `analysis` messages is the reasoning, the text of the `final` messages and of
 * the `commentary` messages without a recipient (preambles the model shows the user) is the
 * content; several messages of one kind are joined by a newline, as vLLM joins them. A message
 * left open at the end of the output (cut, or the completions text left out the stop token) counts
 * once it has text. A message addressed to a function (`to=functions.NAME`) is passed on in the
 * content, rendered as harmony renders it (`<|start|>assistant to=functions.NAME<|channel|>…
 * <|message|>{arguments}<|call|>`), for the `openai` tool parser to take out; without tool
 * parsing it stays in the content as that text (vLLM drops it). Other messages (to built-in tools,
 * unknown channels) are dropped, as are a header the output ends in and text between messages
 * that does not start one (vLLM fails the request on that).
 */
export class GptOssReasoningParser implements ReasoningStream {
  private state: 'header' | 'body' | 'between' = 'header';
  /** The output's first message has the role the prompt gave it (`<|start|>assistant`). */
  private first = true;
  private header = '';
  private held = '';
  private kind: Kind = 'drop';
  /** The open message has been counted (it had text, or was closed). */
  private counted = false;
  private reasoningMessages = 0;
  private contentMessages = 0;
  private reasoningText = 0;

  get reasoned(): boolean {
    return this.reasoningText > 0;
  }

  push(text: string): { reasoning: string; content: string } {
    const out = { reasoning: '', content: '' };
    let buf = this.held + text;
    this.held = '';
    for (;;) {
      if (this.state === 'header') {
        this.header += buf;
        const at = this.header.indexOf(MESSAGE);
        if (at < 0) break;
        buf = this.header.slice(at + MESSAGE.length);
        const h = readHeader(this.header.slice(0, at), this.first);
        this.header = '';
        this.first = false;
        this.kind = kindOf(h);
        this.counted = false;
        this.state = 'body';
        if (this.kind === 'call') out.content += `${START}${renderHeader(h)}${MESSAGE}`;
        continue;
      }
      if (this.state === 'body') {
        const end = firstTag(buf, ENDS);
        if (end === null) {
          const [safe, held] = holdAny(buf, ENDS);
          this.held = held;
          this.text(safe, false, out);
          break;
        }
        this.text(buf.slice(0, end.at), true, out);
        if (this.kind === 'call') out.content += end.tag;
        buf = buf.slice(end.at + end.tag.length);
        this.state = 'between';
        continue;
      }
      const at = buf.indexOf(START);
      if (at < 0) {
        this.held = holdPartial(buf, START)[1];
        break;
      }
      buf = buf.slice(at + START.length);
      this.state = 'header';
    }
    this.reasoningText += out.reasoning.length;
    return out;
  }

  end(): { reasoning: string; content: string } {
    const out = { reasoning: '', content: '' };
    if (this.state === 'body') this.text(this.held, false, out);
    this.held = '';
    this.header = '';
    this.reasoningText += out.reasoning.length;
    return out;
  }

  /** Adds a piece of the open message's text; `closed` when the message ends with it. */
  private text(t: string, closed: boolean, out: { reasoning: string; content: string }): void {
    if (this.kind === 'drop') return;
    if (this.kind === 'call') {
      out.content += t;
      return;
    }
    if (!this.counted && (t !== '' || closed)) {
      this.counted = true;
      // Messages of one kind are joined by a newline: it goes before the second one's text.
      const seen = this.kind === 'reasoning' ? this.reasoningMessages++ : this.contentMessages++;
      if (seen > 0) out[this.kind] += '\n';
    }
    out[this.kind] += t;
  }
}

/**
 * vLLM's `openai` tool-call parser, after the `openai_gptoss` reasoning parser: each function
 * message that parser passed on in the content (`<|start|>assistant to=functions.NAME…<|message|>
 * {arguments}<|call|>`) is a call named after `functions.`, taken out of the content. JSON
 * arguments (no content type, or one naming json) are written back as Python's `json.dumps`
 * writes them by default, as vLLM's parser does (`", "` and `": "`, non-ASCII as `\uXXXX`, its
 * number forms); arguments that do not parse are kept as written, still a call, with a note. A call
 * still open at the end of the output (the completions text leaves out the `<|call|>` the model
 * stopped on, unless it was asked to keep it) is read when its JSON parses; when it does not, the
 * output was cut inside it, and it is dropped with a note (vLLM reads only closed calls). The
 * content is what the reasoning parser gave: all final and preamble messages joined by newlines,
 * where vLLM's non-streamed answer keeps only the last final message (the same text when the
 * model wrote one, as it does).
 */
export class GptOssToolParser implements ToolStream {
  private state: 'text' | 'header' | 'body' = 'text';
  private held = '';
  private header = '';
  private body = '';
  private readonly noteList: string[] = [];

  get notes(): readonly string[] {
    return this.noteList;
  }

  push(text: string): { content: string; calls: ToolCallOut[] } {
    let buf = this.held + text;
    this.held = '';
    let content = '';
    const calls: ToolCallOut[] = [];
    for (;;) {
      if (this.state === 'text') {
        const at = buf.indexOf(START);
        if (at < 0) {
          const [safe, held] = holdPartial(buf, START);
          this.held = held;
          content += safe;
          break;
        }
        content += buf.slice(0, at);
        buf = buf.slice(at + START.length);
        this.state = 'header';
        continue;
      }
      if (this.state === 'header') {
        this.header += buf;
        const at = this.header.indexOf(MESSAGE);
        if (at < 0) break;
        this.body = '';
        buf = this.header.slice(at + MESSAGE.length);
        this.header = this.header.slice(0, at);
        this.state = 'body';
        continue;
      }
      // Tags are looked for only where one could have begun since the last look.
      const from = Math.max(0, this.body.length - 16);
      this.body += buf;
      const end = firstTag(this.body, ENDS, from);
      if (end === null) break;
      buf = this.body.slice(end.at + end.tag.length);
      content += this.message(this.body.slice(0, end.at), end.tag, calls);
      this.state = 'text';
    }
    return { content, calls };
  }

  end(): { content: string; calls: ToolCallOut[] } {
    const calls: ToolCallOut[] = [];
    let content = '';
    if (this.state === 'text') content = this.held;
    // A header never closed is not one the reasoning parser wrote: content text, given back.
    else if (this.state === 'header') content = START + this.header;
    else content = this.message(this.body, null, calls);
    this.state = 'text';
    this.held = this.header = this.body = '';
    return { content, calls };
  }

  /** Reads one message into `calls`; what to show as content (a message that is not a function call, as it came). */
  private message(body: string, end: string | null, calls: ToolCallOut[]): string {
    const h = readHeader(this.header, false);
    const raw = `${START}${this.header}${MESSAGE}${body}${end ?? ''}`;
    this.header = '';
    this.body = '';
    if (!h.recipient?.startsWith(FUNCTIONS)) return raw;
    const name = h.recipient.split(FUNCTIONS)[1];
    const json = h.contentType === null || h.contentType.includes('json');
    const args = json ? pythonJsonDumps(body) : body;
    if (end === null && args === null) {
      this.noteList.push('tool_call_cut');
      return '';
    }
    if (args === null) this.noteList.push('tool_call_unparsed');
    calls.push({ name, arguments: args ?? body });
    return '';
  }
}

/**
 * `json.dumps(json.loads(text))` in Python, or null when `text` is not JSON: `", "` and `": "`
 * between members, non-ASCII and control characters as `\uXXXX`, integers as written, other
 * numbers as Python's float repr (`1.0`, `1e+16`), a repeated key keeping its first place and last
 * value, keys in their order.
 */
export function pythonJsonDumps(text: string): string | null {
  try {
    JSON.parse(text);
  } catch {
    return null;
  }
  const p = { text, at: 0 };
  return dumpValue(p);
}

/** Reads and writes back one value of JSON already known to be valid. */
function dumpValue(p: { text: string; at: number }): string {
  skipSpace(p);
  const c = p.text[p.at];
  if (c === '{') {
    p.at++;
    const members = new Map<string, string>();
    skipSpace(p);
    if (p.text[p.at] === '}') {
      p.at++;
      return '{}';
    }
    for (;;) {
      skipSpace(p);
      const key = readString(p);
      skipSpace(p);
      p.at++; // ':'
      const value = dumpValue(p);
      members.set(key, value);
      skipSpace(p);
      if (p.text[p.at++] === '}') break;
    }
    return `{${[...members].map(([k, v]) => `${pyString(k)}: ${v}`).join(', ')}}`;
  }
  if (c === '[') {
    p.at++;
    const items: string[] = [];
    skipSpace(p);
    if (p.text[p.at] === ']') {
      p.at++;
      return '[]';
    }
    for (;;) {
      items.push(dumpValue(p));
      skipSpace(p);
      if (p.text[p.at++] === ']') break;
    }
    return `[${items.join(', ')}]`;
  }
  if (c === '"') return pyString(readString(p));
  const word = sticky(WORD, p);
  if (word === 'true' || word === 'false' || word === 'null') return word;
  if (/^-?\d+$/.test(word)) return word === '-0' ? '0' : word;
  return pyFloat(Number(word));
}

function skipSpace(p: { text: string; at: number }): void {
  while (p.at < p.text.length && ' \t\n\r'.includes(p.text[p.at])) p.at++;
}

const WORD = /true|false|null|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?/y;
const STRING = /"(?:[^"\\]|\\.)*"/y;

/** The match of a sticky pattern at the reading place, read past. */
function sticky(re: RegExp, p: { text: string; at: number }): string {
  re.lastIndex = p.at;
  const m = re.exec(p.text)![0];
  p.at += m.length;
  return m;
}

function readString(p: { text: string; at: number }): string {
  return JSON.parse(sticky(STRING, p)) as string;
}

/** A string as Python's json writes it with `ensure_ascii`: everything outside printable ASCII escaped. */
function pyString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const ch = s[i];
    const code = s.charCodeAt(i);
    if (ch === '"' || ch === '\\') out += `\\${ch}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (ch === '\b') out += '\\b';
    else if (ch === '\f') out += '\\f';
    else if (code < 0x20 || code > 0x7e) out += `\\u${code.toString(16).padStart(4, '0')}`;
    else out += ch;
  }
  return `${out}"`;
}

/** A float as Python's `repr` writes it: the shortest digits, positional from 1e-4 to below 1e16, `.0` on whole numbers. */
function pyFloat(x: number): string {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? 'NaN' : x > 0 ? 'Infinity' : '-Infinity';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const [mantissa, exponent] = x.toExponential().split('e');
  const sign = mantissa.startsWith('-') ? '-' : '';
  const digits = mantissa.replace('-', '').replace('.', '');
  // Where the decimal point falls after the first `point` digits.
  const point = Number(exponent) + 1;
  if (point > -4 && point <= 16) {
    if (point <= 0) return `${sign}0.${'0'.repeat(-point)}${digits}`;
    if (point >= digits.length) return `${sign}${digits}${'0'.repeat(point - digits.length)}.0`;
    return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
  }
  const e = point - 1;
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
}
