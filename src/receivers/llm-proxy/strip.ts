import { findMembers } from '../../formats/json-scan';

/** Members of a model server's answer that each added field brings, to give back as null. */
const BROUGHT: Record<string, string[]> = {
  return_token_ids: ['prompt_token_ids', 'token_ids'],
  return_prompt_token_ids: ['prompt_token_ids'],
  logprobs: ['logprobs'],
};

/** The answer's members the agent did not ask for, given the fields the sidecar added for it. */
export function broughtMembers(injected: readonly string[]): string[] {
  return [...new Set(injected.flatMap((f) => BROUGHT[f] ?? []))];
}

/**
 * The bytes with each named member's value replaced by `null` (what the server answers when the
 * field was not asked for); every other byte stays. Works on JSON and on SSE event text alike.
 */
export function nullMembers(buf: Buffer, members: readonly string[]): Buffer {
  const parts = nullMemberParts(buf, members);
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}

/** The same bytes as pieces of `buf` and `null`s, for writing without a copy into one buffer. */
export function nullMemberParts(buf: Buffer, members: readonly string[]): Buffer[] {
  const cuts: [number, number][] = [];
  for (const m of members)
    for (const f of findMembers(buf, m)) if (!(buf[f.valueStart] === 0x6e && f.valueEnd - f.valueStart === 4)) cuts.push([f.valueStart, f.valueEnd]);
  if (cuts.length === 0) return [buf];
  cuts.sort((a, b) => a[0] - b[0]);
  const parts: Buffer[] = [];
  let at = 0;
  for (const [s, e] of cuts) {
    if (s < at) continue;
    parts.push(buf.subarray(at, s), NULL);
    at = e;
  }
  parts.push(buf.subarray(at));
  return parts;
}

const NULL = Buffer.from('null');

/**
 * Strips members from an event stream as it passes: bytes are held only until their event is
 * complete (a blank line), then the event goes out with those members' values set to null. An
 * event that arrives in many reads (vLLM's first one carries the whole prompt's ids) is joined
 * once, when it completes; each read is searched for an event's end once, so the work grows with
 * the event's size, not with its size times the number of reads.
 */
export class SseStripper {
  private held: Buffer[] = [];

  constructor(private readonly members: readonly string[]) {}

  push(chunk: Buffer): Buffer[] {
    if (chunk.length === 0) return [];
    const end = lastEventEndAfter(this.held, chunk);
    if (end < 0) {
      this.held.push(chunk);
      return [];
    }
    const event = this.held.length === 0 ? chunk.subarray(0, end) : Buffer.concat([...this.held, chunk.subarray(0, end)]);
    this.held = end < chunk.length ? [chunk.subarray(end)] : [];
    return [nullMembers(event, this.members)];
  }

  end(): Buffer[] {
    const rest = this.held.length === 1 ? this.held[0] : Buffer.concat(this.held);
    this.held = [];
    return rest.length > 0 ? [nullMembers(rest, this.members)] : [];
  }
}

/**
 * Index in `chunk` just past the last event end that closes in it, or -1. `held` are the bytes
 * that came before the chunk (no event end in them): an end may begin in their last three.
 */
function lastEventEndAfter(held: readonly Buffer[], chunk: Buffer): number {
  const inChunk = lastEventEnd(chunk);
  if (inChunk >= 4 || held.length === 0) return inChunk;
  // An end whose last byte is one of the chunk's first three and which begins in what is held.
  const before = lastBytes(held, 3);
  const at = lastEventEnd(Buffer.concat([before, chunk.subarray(0, 3)]));
  return Math.max(inChunk, at > before.length ? at - before.length : -1);
}

/** The last `n` bytes (or fewer) of the chunks, in order. */
function lastBytes(chunks: readonly Buffer[], n: number): Buffer {
  const parts: Buffer[] = [];
  for (let i = chunks.length - 1; i >= 0 && n > 0; i--) {
    const c = chunks[i];
    parts.unshift(c.subarray(Math.max(0, c.length - n)));
    n -= Math.min(n, c.length);
  }
  return Buffer.concat(parts);
}

/**
 * Index just past the last blank line (event end) in `buf`, or -1. Line breaks are found with
 * `lastIndexOf` (memrchr): a read in the middle of a big event has none, and walking its bytes one
 * by one in JavaScript cost ~1 µs a KiB.
 */
function lastEventEnd(buf: Buffer): number {
  // Most reads end with an event (a server writes whole events).
  const n = buf.length;
  if (n >= 2 && buf[n - 1] === 0x0a && buf[n - 2] === 0x0a) return n;
  let lf = buf.lastIndexOf(0x0a);
  let cr = buf.lastIndexOf(0x0d);
  for (;;) {
    const i = Math.max(lf, cr);
    if (i <= 0) return -1;
    if (lf === i) lf = buf.lastIndexOf(0x0a, i - 1);
    else cr = buf.lastIndexOf(0x0d, i - 1);
    const prev = buf[i - 1];
    if (prev === 0x0a || (prev === 0x0d && buf[i] === 0x0d)) return i + 1;
    if (buf[i] === 0x0a && prev === 0x0d && i >= 3 && buf[i - 2] === 0x0a && buf[i - 3] === 0x0d) return i + 1;
  }
}
