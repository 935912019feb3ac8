import { BROUGHT } from '../../formats/engines';
import { findMembers } from '../../formats/json-scan';
import { SseEventFramer } from '../../formats/sse';

/** The answer's members the agent did not ask for, given the fields the sidecar added for it (what each brings: src/formats/engines). */
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
 * complete (a blank line, found by the format's one framing rule, `SseEventFramer`), then the
 * events a read completes go out with those members' values set to null. An event that arrives in
 * many reads (vLLM's first one carries the whole prompt's ids) is joined once, when it completes;
 * each read is searched for event ends once, so the work grows with the event's size, not with its
 * size times the number of reads.
 */
export class SseStripper {
  private held: Buffer[] = [];
  private readonly framer = new SseEventFramer();

  constructor(private readonly members: readonly string[]) {}

  push(chunk: Buffer): Buffer[] {
    if (chunk.length === 0) return [];
    const ends = this.framer.push(chunk);
    if (ends.length === 0) {
      this.held.push(chunk);
      return [];
    }
    const end = ends[ends.length - 1];
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
