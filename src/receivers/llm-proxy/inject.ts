import type { Api } from '../../model/records';
import { findMembers, skipWs, topLevelKeys } from '../../formats/json-scan';

/**
 * Flavor-specific fields that make a model server return token ids and logprobs. Sent only to a
 * server known to be vLLM or SGLang (configured or detected), never to others.
 */
const FIELDS: Record<'vllm' | 'sglang', Partial<Record<Api, Record<string, string>>>> = {
  vllm: {
    'chat.completions': { return_token_ids: 'true', logprobs: 'true' },
    completions: { return_token_ids: 'true', logprobs: '0' },
  },
  sglang: {
    'chat.completions': { return_token_ids: 'true', return_prompt_token_ids: 'true', logprobs: 'true' },
    completions: { return_token_ids: 'true', return_prompt_token_ids: 'true', logprobs: '0' },
  },
};

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
export function injectFields(flavor: 'openai' | 'vllm' | 'sglang', api: Api, body: Buffer): Injection | null {
  if (flavor === 'openai') return null;
  const fields = FIELDS[flavor][api];
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

/** The fields the sidecar adds for this flavor and API, or null when it adds none. */
export function fieldsFor(flavor: 'openai' | 'vllm' | 'sglang', api: Api): Record<string, string> | null {
  return flavor === 'openai' ? null : (FIELDS[flavor][api] ?? null);
}

/**
 * Adds fields to a streamed JSON request body without holding it: the fields are written right
 * after the opening `{`, and every later byte passes as it comes. A member the agent sets itself
 * comes later in the body and wins (JSON parsers of the servers this is used with keep the last
 * of duplicate names). Only the first bytes are held, until the first one after `{` shows whether
 * the object is empty (no comma then). Member names the agent sends are spotted on the way (also
 * across chunk boundaries) so `injected` lists only what the agent did not ask for itself.
 */
export class StreamInjector {
  private head: Buffer[] = [];
  private headBytes = 0;
  /** Null while undecided; then whether the fields were written. */
  private inserting: boolean | null = null;
  private insertion = Buffer.alloc(0);
  private tail = Buffer.alloc(0);
  private readonly needles: [string, Buffer][];
  private readonly seen = new Set<string>();

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

  /** Fields written that the agent did not set itself (so far). */
  injected(): string[] {
    return this.inserting ? Object.keys(this.fields).filter((k) => !this.seen.has(k)) : [];
  }

  /** Takes a chunk of the agent's body; returns what to send upstream now (empty while undecided). */
  push(chunk: Buffer): Buffer[] {
    this.spot(chunk);
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
    if (!insert) return head.length > 0 ? [head] : [];
    const text =
      Object.entries(this.fields)
        .map(([k, v]) => `"${k}":${v}`)
        .join(',') + (empty ? '' : ',');
    this.insertion = Buffer.from(text);
    this.insertedAt = at;
    // Pieces, not one copy of the head: the caller writes them together.
    return at < head.length ? [head.subarray(0, at), this.insertion, head.subarray(at)] : [head.subarray(0, at), this.insertion];
  }

  /** Notes member names of the added fields in the agent's bytes, across chunk boundaries. */
  private spot(chunk: Buffer): void {
    if (this.seen.size === this.needles.length) return;
    const keep = 32;
    // The chunk itself, and the seam with the previous one (a name split across two chunks).
    const seam = this.tail.length > 0 ? Buffer.concat([this.tail, chunk.subarray(0, keep)]) : null;
    for (const [k, needle] of this.needles)
      if (!this.seen.has(k) && (chunk.indexOf(needle) >= 0 || (seam !== null && seam.indexOf(needle) >= 0))) this.seen.add(k);
    const joined = Buffer.concat([this.tail, chunk.subarray(Math.max(0, chunk.length - keep))]);
    this.tail = joined.subarray(Math.max(0, joined.length - keep));
  }
}
