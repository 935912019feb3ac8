import { BROUGHT } from '../../formats/engines';
import { findMembersOfEach } from '../../formats/json-scan';
import { SseEventFramer } from '../../formats/sse';

/** The answer's members the agent did not ask for, given the fields the sidecar added for it (what each brings: src/formats/engines). */
export function broughtMembers(injected: readonly string[]): readonly string[] {
  // The same few sets of added fields come again call after call: each answer is kept.
  const key = injected.join('\n');
  let members = brought.get(key);
  if (members === undefined) {
    members = [...new Set(injected.flatMap((f) => BROUGHT[f] ?? []))];
    if (brought.size < BROUGHT_KEPT) brought.set(key, members);
  }
  return members;
}

/** `broughtMembers`' answers by the fields added (field names come from the engines' tables, so few sets). */
const brought = new Map<string, readonly string[]>();
const BROUGHT_KEPT = 64;

/**
 * The bytes with each named member's value replaced by `null` (what the server answers when the
 * field was not asked for); every other byte stays. Works on JSON and on SSE event text alike.
 * Written into one new buffer (or `buf` itself when there is nothing to replace).
 */
export function nullMembers(buf: Buffer, members: readonly string[]): Buffer {
  const cuts = nullCuts(buf, members);
  if (cuts.length === 0) return buf;
  let size = buf.length;
  for (let k = 0; k < cuts.length; k += 2) size -= cuts[k + 1] - cuts[k] - 4;
  const out = Buffer.allocUnsafe(size);
  let w = 0;
  let at = 0;
  for (let k = 0; k < cuts.length; k += 2) {
    w += buf.copy(out, w, at, cuts[k]);
    out[w++] = 0x6e;
    out[w++] = 0x75;
    out[w++] = 0x6c;
    out[w++] = 0x6c;
    at = cuts[k + 1];
  }
  buf.copy(out, w, at);
  return out;
}

/** The same bytes as pieces of `buf` and `null`s, for writing without a copy into one buffer. */
export function nullMemberParts(buf: Buffer, members: readonly string[]): Buffer[] {
  const cuts = nullCuts(buf, members);
  if (cuts.length === 0) return [buf];
  const parts: Buffer[] = [];
  let at = 0;
  for (let k = 0; k < cuts.length; k += 2) {
    parts.push(buf.subarray(at, cuts[k]), NULL);
    at = cuts[k + 1];
  }
  parts.push(buf.subarray(at));
  return parts;
}

/**
 * The value ranges to replace, as `[start, end, start, end, ..]` in order: every member's value
 * that is not already `null`, but those inside one already replaced.
 */
function nullCuts(buf: Buffer, members: readonly string[]): number[] {
  const found = findMembersOfEach(buf, members);
  let cuts: number[] = [];
  let sorted = true;
  for (const f of found) {
    if (buf[f.valueStart] === 0x6e && f.valueEnd - f.valueStart === 4) continue;
    if (cuts.length > 0 && f.valueStart < cuts[cuts.length - 2]) sorted = false;
    cuts.push(f.valueStart, f.valueEnd);
  }
  if (!sorted) {
    const pairs: [number, number][] = [];
    for (let k = 0; k < cuts.length; k += 2) pairs.push([cuts[k], cuts[k + 1]]);
    cuts = pairs.sort((x, y) => x[0] - y[0]).flat();
  }
  const out: number[] = [];
  let at = 0;
  for (let k = 0; k < cuts.length; k += 2) {
    if (cuts[k] < at) continue;
    out.push(cuts[k], cuts[k + 1]);
    at = cuts[k + 1];
  }
  return out;
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
    // One read that is one or more whole events (the usual case) is used as it is: no view of it.
    const whole = end === chunk.length ? chunk : chunk.subarray(0, end);
    const event = this.held.length === 0 ? whole : Buffer.concat([...this.held, whole]);
    if (end < chunk.length) this.held = [chunk.subarray(end)];
    else if (this.held.length > 0) this.held = [];
    return [nullMembers(event, this.members)];
  }

  end(): Buffer[] {
    const rest = this.held.length === 1 ? this.held[0] : Buffer.concat(this.held);
    this.held = [];
    return rest.length > 0 ? [nullMembers(rest, this.members)] : [];
  }
}
