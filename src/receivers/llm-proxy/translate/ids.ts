import { createHash } from 'node:crypto';

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
