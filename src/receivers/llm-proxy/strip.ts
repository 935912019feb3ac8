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
  /** The last (up to three) bytes held: an event's end may begin in them. */
  private heldTail: Buffer = EMPTY;

  constructor(private readonly members: readonly string[]) {}

  push(chunk: Buffer): Buffer[] {
    if (chunk.length === 0) return [];
    const end = this.held.length === 0 ? lastEventEnd(chunk) : lastEventEndAfter(this.heldTail, chunk);
    if (end < 0) {
      this.held.push(chunk);
      this.heldTail = lastBytes(this.heldTail, chunk);
      return [];
    }
    const event = this.held.length === 0 ? chunk.subarray(0, end) : Buffer.concat([...this.held, chunk.subarray(0, end)]);
    this.held = end < chunk.length ? [chunk.subarray(end)] : [];
    this.heldTail = end < chunk.length ? lastBytes(EMPTY, chunk.subarray(end)) : EMPTY;
    return [nullMembers(event, this.members)];
  }

  end(): Buffer[] {
    const rest = this.held.length === 1 ? this.held[0] : Buffer.concat(this.held);
    this.held = [];
    this.heldTail = EMPTY;
    return rest.length > 0 ? [nullMembers(rest, this.members)] : [];
  }
}

const EMPTY = Buffer.alloc(0);

/** The last three bytes of `before` followed by `chunk` (a copy: at most three bytes). */
function lastBytes(before: Buffer, chunk: Buffer): Buffer {
  if (chunk.length >= 3) return Buffer.from(chunk.subarray(chunk.length - 3));
  const joined = Buffer.concat([before, chunk]);
  return Buffer.from(joined.subarray(Math.max(0, joined.length - 3)));
}

/**
 * Index in `chunk` just past the last event end that closes in it, or -1; `before` holds the
 * (up to three) bytes that came right before the chunk, where the end may begin.
 */
function lastEventEndAfter(before: Buffer, chunk: Buffer): number {
  const inChunk = lastEventEnd(chunk);
  if (inChunk >= 4 || before.length === 0) return inChunk;
  // An end whose last byte is one of the chunk's first three and which begins in `before`.
  const seam = Buffer.concat([before, chunk.subarray(0, 3)]);
  const at = lastEventEnd(seam);
  return Math.max(inChunk, at > before.length ? at - before.length : -1);
}

/** Index just past the last blank line (event end) in `buf`, or -1. */
function lastEventEnd(buf: Buffer): number {
  for (let i = buf.length - 1; i > 0; i--) {
    if (buf[i] !== 0x0a && buf[i] !== 0x0d) continue;
    const prev = buf[i - 1];
    if (prev === 0x0a || (prev === 0x0d && buf[i] === 0x0d)) return i + 1;
    if (buf[i] === 0x0a && prev === 0x0d && i >= 3 && buf[i - 2] === 0x0a && buf[i - 3] === 0x0d) return i + 1;
  }
  return -1;
}
