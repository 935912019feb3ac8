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
 * complete (a blank line), then the event goes out with those members' values set to null.
 */
export class SseStripper {
  private held: Buffer[] = [];

  constructor(private readonly members: readonly string[]) {}

  push(chunk: Buffer): Buffer[] {
    this.held.push(chunk);
    const buf = this.held.length === 1 ? chunk : Buffer.concat(this.held);
    const end = lastEventEnd(buf);
    if (end < 0) {
      this.held = [buf];
      return [];
    }
    this.held = end < buf.length ? [buf.subarray(end)] : [];
    return [nullMembers(buf.subarray(0, end), this.members)];
  }

  end(): Buffer[] {
    const rest = Buffer.concat(this.held);
    this.held = [];
    return rest.length > 0 ? [nullMembers(rest, this.members)] : [];
  }
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
