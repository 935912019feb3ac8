import { createHash } from 'node:crypto';

/** A parsed JSON object. Translation reads untrusted bodies, so every access is checked. */
export type Json = Record<string, unknown>;

export function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** JSON `null` and a missing key mean the same to every API translated here. */
export function isSet(v: unknown): boolean {
  return v !== undefined && v !== null;
}

export function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

export function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

export function objects(v: unknown): Json[] {
  return Array.isArray(v) ? v.filter(isObject) : [];
}

/**
 * The part of an upstream id that is safe inside ours (`chatcmpl-3f2a…` → `3f2a…`), or a digest
 * of `seed` when the upstream gave none, so ids are the same each time the same answer is
 * translated.
 */
export function idBase(upstreamId: unknown, seed: string): string {
  const raw = typeof upstreamId === 'string' ? upstreamId.replace(/^chatcmpl-/, '').replace(/[^A-Za-z0-9_-]/g, '') : '';
  return raw.length > 0 ? raw.slice(0, 64) : createHash('sha256').update(seed).digest('hex').slice(0, 32);
}

/** A digest of a request body, the fallback id seed when an upstream answer carries no id. */
export function seedOf(body: unknown): string {
  return createHash('sha256')
    .update(JSON.stringify(body) ?? '')
    .digest('hex');
}

/** One Server-Sent Event, with the `event:` line the Responses and Anthropic streams carry. */
export function sseEvent(event: string, data: unknown): string {
  return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}
