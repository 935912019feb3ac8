import { ENGINE } from '../../formats/engines';
import type { Api } from '../../model/records';
import { findMembers, skipWs, topLevelKeys } from '../../formats/json-scan';
import { extend } from '../../model/extend';
import { IMAGE_NAME, IMAGE_NAME_SPAN, imageNameAt } from '../../formats/images';

export interface Injection {
  body: Buffer;
  injected: string[];
}

/**
 * Adds the flavor's fields that the request lacks, by inserting them textually after the body's
 * opening `{` so every other byte (number spellings, key order, unknown fields) stays as sent.
 * Whether a field is present is found by scanning for its member name, not by parsing the body
 * (prompts are big); only when the name occurs somewhere are the top-level members walked to see
 * whether it is one of them. Returns null when nothing applies or the body is not a JSON object
 * (forwarded untouched).
 */
export function injectFields(flavor: 'openai' | 'vllm' | 'sglang', api: Api, body: Buffer, extra: Record<string, string> | null = null): Injection | null {
  const fields = fieldsFor(flavor, api, extra);
  if (!fields) return null;
  const open = skipWs(body, 0);
  if (body[open] !== 0x7b /* { */) return null;
  let present: Set<string> | null = null;
  const missing: string[] = [];
  for (const k of Object.keys(fields)) {
    if (findMembers(body, k).length === 0) {
      missing.push(k);
      continue;
    }
    present ??= topLevelKeys(body);
    if (present === null) return null;
    if (!present.has(k)) missing.push(k);
  }
  if (missing.length === 0) return null;
  const empty = body[skipWs(body, open + 1)] === 0x7d; /* } */
  const insertion = missing.map((k) => `"${k}":${fields[k]}`).join(',') + (empty ? '' : ',');
  return {
    body: Buffer.concat([body.subarray(0, open + 1), Buffer.from(insertion), body.subarray(open + 1)]),
    injected: missing,
  };
}

/** The fields the sidecar adds for this flavor and API (its engine's, src/formats/engines; with `extra`, e.g. SGLang's routing), or null when it adds none. */
export function fieldsFor(flavor: 'openai' | 'vllm' | 'sglang', api: Api, extra: Record<string, string> | null = null): Record<string, string> | null {
  // Sent only to a server known to be vLLM or SGLang (configured or detected), never to others.
  const base = flavor === 'openai' ? undefined : ENGINE[flavor].idsFields[api];
  if (!base) return null;
  return extra ? extend(base, extra) : base;
}

/**
 * What the injector noted about a request for the next request of its rollout: where it wrote the
 * fields, where each member name it looks for first occurs in the agent's bytes (-1: nowhere), and
 * where the first image name does (`"image_url"` or `"image"`, see `formats/images.ts`; -1: none).
 */
export interface RequestNotes {
  insertedAt: number;
  insertion: string;
  first: Record<string, number>;
  image: number;
}

/**
 * Adds fields to a streamed JSON request body without holding it: the fields are written right
 * after the opening `{`, and every later byte passes as it comes. A member the agent sets itself
 * comes later in the body and wins (JSON parsers of the servers this is used with keep the last
 * of duplicate names). Only the first bytes are held, until the first one after `{` shows whether
 * the object is empty (no comma then).
 *
 * So that `injected` lists only what the agent did not ask for itself, the member names it sends
 * are looked for once the body is complete (also across chunk boundaries). An agent resends its
 * history, so a rollout's request begins with the bytes of the one before: given how many of the
 * bytes sent equal the previous request's (the journal compares them anyway) and what was found in
 * that one, only the bytes after the shared part are searched, and the cost does not grow with
 * the context.
 */
export class StreamInjector {
  private head: Buffer[] = [];
  private headBytes = 0;
  /** Null while undecided; then whether the fields were written. */
  private inserting: boolean | null = null;
  private insertion = Buffer.alloc(0);
  /** The agent's bytes (references), until the member names are looked for. */
  private agent: Buffer[] = [];
  private readonly needles: [string, Buffer][];
  /** What was found in the body (once looked for). */
  private noted: RequestNotes | null = null;

  constructor(private readonly fields: Record<string, string>) {
    this.needles = Object.keys(fields).map((k) => [k, Buffer.from(`"${k}"`)]);
  }

  get decided(): boolean {
    return this.inserting !== null;
  }

  /** Bytes added to the body (for content-length); valid once decided. */
  get extraBytes(): number {
    return this.insertion.length;
  }

  /** The body as the agent sent it, from the body as it was sent upstream. */
  original(sent: Buffer): Buffer {
    if (!this.inserting) return sent;
    return Buffer.concat([sent.subarray(0, this.insertedAt), sent.subarray(this.insertedAt + this.insertion.length)]);
  }

  private insertedAt = 0;

  /**
   * Fields written that the agent did not set itself; call once the body is complete. `repeats`:
   * how many of the first bytes sent equal the rollout's previous request, and its notes.
   */
  injected(repeats: { shared: number; notes: unknown } | null = null): string[] {
    if (!this.inserting) return [];
    const { first } = (this.noted ??= this.look(repeats));
    return Object.keys(this.fields).filter((k) => first[k] < 0);
  }

  /** What was found in this body, for the next request of the rollout (after `injected`). */
  notes(): RequestNotes | null {
    return this.noted;
  }

  /**
   * Whether the agent's body names an image (after `injected`): found in the same look as the
   * member names, so the export need not read a large request back to learn that it has none.
   * Null when the body was not looked at (not a JSON object: nothing was added).
   */
  namesImage(): boolean | null {
    return this.noted === null ? null : this.noted.image >= 0;
  }

  /** Takes a chunk of the agent's body; returns what to send upstream now (empty while undecided). */
  push(chunk: Buffer): Buffer[] {
    if (chunk.length > 0) this.agent.push(chunk);
    if (this.inserting !== null) return [chunk];
    this.head.push(chunk);
    this.headBytes += chunk.length;
    const head = this.head.length === 1 ? this.head[0] : Buffer.concat(this.head);
    const open = skipWs(head, 0);
    if (open === head.length) return [];
    if (head[open] !== 0x7b /* { */) return this.decide(false, head, 0);
    const next = skipWs(head, open + 1);
    if (next === head.length && this.headBytes < 64 * 1024) return [];
    return this.decide(true, head, open + 1, head[next] === 0x7d /* } */);
  }

  /** The body ended: whatever is still held. */
  end(): Buffer[] {
    if (this.inserting !== null) return [];
    const head = Buffer.concat(this.head);
    const open = skipWs(head, 0);
    // A body that is only `{` and white space is not JSON: sent as it came.
    return this.decide(false, head, open);
  }

  private decide(insert: boolean, head: Buffer, at: number, empty = false): Buffer[] {
    this.inserting = insert;
    this.head = [];
    if (!insert) {
      this.agent = [];
      return head.length > 0 ? [head] : [];
    }
    const text =
      Object.entries(this.fields)
        .map(([k, v]) => `"${k}":${v}`)
        .join(',') + (empty ? '' : ',');
    this.insertion = Buffer.from(text);
    this.insertedAt = at;
    // Pieces, not one copy of the head: the caller writes them together.
    return at < head.length ? [head.subarray(0, at), this.insertion, head.subarray(at)] : [head.subarray(0, at), this.insertion];
  }

  /** Finds the member names and the first image name in the agent's bytes, skipping what is shared with the previous request. */
  private look(repeats: { shared: number; notes: unknown } | null): RequestNotes {
    const insertion = this.insertion.toString();
    const prior =
      repeats !== null && isNotes(repeats.notes) && repeats.notes.insertedAt === this.insertedAt && repeats.notes.insertion === insertion
        ? repeats.notes
        : null;
    // The shared bytes, counted in what was sent (the fields included), as bytes of the agent's body.
    const sent = prior === null ? 0 : repeats!.shared;
    const a = this.insertedAt;
    const shared = sent <= a ? sent : Math.max(a, sent - this.insertion.length);
    const first: Record<string, number> = {};
    for (const [k, needle] of this.needles) first[k] = firstPast(prior?.first[k], needle.length, shared, (from) => indexIn(this.agent, needle, from));
    // Image names (`"image_url"` is the longer) are found past the shared bytes the same way.
    const image = firstPast(prior?.image, IMAGE_NAME_SPAN, shared, (from) => firstImageName(this.agent, from));
    this.agent = [];
    return { insertedAt: a, insertion, first, image };
  }
}

/**
 * Where a name of up to `span` bytes first occurs in a request whose first `shared` bytes equal the
 * previous request's, in which it first occurred at `before` (-1: nowhere; undefined: not known,
 * then `shared` is 0). One that lies within the shared bytes is where it was; otherwise it begins
 * past them, or so close to their end that it reaches past them: only from there is it searched.
 */
function firstPast(before: number | undefined, span: number, shared: number, search: (from: number) => number): number {
  return typeof before === 'number' && before >= 0 && before + span <= shared ? before : search(Math.max(0, shared - span + 1));
}

function isNotes(v: unknown): v is RequestNotes {
  return (
    typeof v === 'object' &&
    v !== null &&
    typeof (v as RequestNotes).insertedAt === 'number' &&
    typeof (v as RequestNotes).insertion === 'string' &&
    typeof (v as RequestNotes).first === 'object' &&
    (v as RequestNotes).first !== null &&
    typeof (v as RequestNotes).image === 'number'
  );
}

/** Where the first image name (`"image_url"` or `"image"`) begins at or after `from` in the concatenation of `chunks`, or -1. */
export function firstImageName(chunks: readonly Buffer[], from: number): number {
  let k = 0;
  let base = 0;
  // The byte at `i` of the concatenation (undefined past its end); positions asked mostly grow.
  const byteAt = (i: number): number | undefined => {
    if (i < base) k = base = 0;
    while (k < chunks.length && i >= base + chunks[k].length) base += chunks[k++].length;
    return k < chunks.length ? chunks[k][i - base] : undefined;
  };
  for (let i = indexIn(chunks, IMAGE_NAME, from); i >= 0; i = indexIn(chunks, IMAGE_NAME, i + 1)) {
    if (imageNameAt(byteAt, i)) return i;
  }
  return -1;
}

/** The first position at or after `from` where `needle` occurs in the concatenation of `chunks`, or -1. */
export function indexIn(chunks: readonly Buffer[], needle: Buffer, from: number): number {
  const n = needle.length;
  let base = 0;
  /** The last bytes before `base` (at most n - 1): an occurrence may begin there and end in the next chunk. */
  let tail: Buffer = EMPTY;
  for (const c of chunks) {
    const end = base + c.length;
    if (end > from) {
      if (tail.length > 0) {
        const seam = Buffer.concat([tail, c.subarray(0, n - 1)]);
        for (let i = seam.indexOf(needle); i >= 0 && i < tail.length; i = seam.indexOf(needle, i + 1))
          if (base - tail.length + i >= from) return base - tail.length + i;
      }
      const i = c.indexOf(needle, Math.max(0, from - base));
      if (i >= 0) return base + i;
    }
    if (n > 1) tail = c.length >= n - 1 ? c.subarray(c.length - (n - 1)) : Buffer.concat([tail, c]).subarray(-(n - 1));
    base = end;
  }
  return -1;
}

const EMPTY = Buffer.alloc(0);
