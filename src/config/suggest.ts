import type { z } from 'zod';

/**
 * What an `unknown key` error offers instead: the keys the schema takes at that level, and the
 * one nearest a mistyped key (`upstream_urll` → `upstream_url`).
 */

/** Wrappers whose keys are their inner schema's (defaults, optional values, transforms). */
const WRAPPERS = new Set(['default', 'prefault', 'optional', 'nullable', 'nonoptional', 'readonly', 'catch']);

interface Def {
  type: string;
  innerType?: z.core.$ZodType;
  in?: z.core.$ZodType;
  element?: z.core.$ZodType;
  shape?: Record<string, z.core.$ZodType>;
}

const defOf = (s: z.core.$ZodType): Def => s._zod.def;

function unwrap(s: z.core.$ZodType): z.core.$ZodType {
  for (;;) {
    const d = defOf(s);
    if (WRAPPERS.has(d.type) && d.innerType) s = d.innerType;
    else if (d.type === 'pipe' && d.in) s = d.in;
    else return s;
  }
}

/** The keys of the object the schema expects at `path` (array indices step into elements); null when it is not an object. */
export function keysAt(schema: z.core.$ZodType, path: readonly PropertyKey[]): string[] | null {
  let node: z.core.$ZodType | undefined = schema;
  for (const k of path) {
    const d = defOf(unwrap(node));
    if (typeof k === 'number' && d.type === 'array') node = d.element;
    else if (d.type === 'object' && d.shape && Object.hasOwn(d.shape, String(k))) node = d.shape[String(k)];
    else return null;
    if (!node) return null;
  }
  const d = defOf(unwrap(node));
  return d.type === 'object' && d.shape ? Object.keys(d.shape) : null;
}

/** The valid key nearest `key` by edit distance (case and `-`/`_` ignored), when near enough to be a typo; else null. */
export function nearestKey(key: string, valid: readonly string[]): string | null {
  const norm = (s: string) => s.toLowerCase().replace(/-/g, '_');
  const k = norm(key);
  let best: string | null = null;
  let bestDistance = Infinity;
  for (const v of valid) {
    const d = editDistance(k, norm(v));
    if (d < bestDistance) {
      best = v;
      bestDistance = d;
    }
  }
  // One edit for short keys, about a third of the key for longer ones.
  const allowed = Math.max(1, Math.floor(Math.min(k.length, best?.length ?? 0) / 3));
  return bestDistance <= allowed ? best : null;
}

/** Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours. */
export function editDistance(a: string, b: string): number {
  const rows = a.length + 1;
  const cols = b.length + 1;
  const d: number[] = new Array<number>(rows * cols).fill(0);
  for (let i = 0; i < rows; i++) d[i * cols] = i;
  for (let j = 0; j < cols; j++) d[j] = j;
  for (let i = 1; i < rows; i++) {
    for (let j = 1; j < cols; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[(i - 1) * cols + j] + 1, d[i * cols + j - 1] + 1, d[(i - 1) * cols + j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[(i - 2) * cols + j - 2] + 1);
      d[i * cols + j] = v;
    }
  }
  return d[rows * cols - 1];
}
