/**
 * Checked reads of parsed JSON. Bodies come from agents and servers, untrusted, so every access
 * is checked; the API adapters (formats/adapters) and the translators (receivers/llm-proxy/
 * translate) read them with these.
 */

/** A parsed JSON object. */
export type Json = Record<string, unknown>;

export function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** JSON `null` and a missing key mean the same to every API read here. */
export function isSet(v: unknown): boolean {
  return v !== undefined && v !== null;
}

export function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

/** A finite number, or null. */
export function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** The objects of an array (others skipped); [] when not an array. */
export function objects(v: unknown): Json[] {
  return Array.isArray(v) ? v.filter(isObject) : [];
}

/** An array of integers, or null when absent or not all integers. */
export function intList(v: unknown): number[] | null {
  if (!Array.isArray(v)) return null;
  for (const x of v) if (!Number.isInteger(x)) return null;
  return v as number[];
}

/** Appends `more` to `list` in place (no spread: a long array would overflow the call stack). */
export function appendTo<T>(list: T[], more: readonly T[]): void {
  for (let i = 0; i < more.length; i++) list.push(more[i]);
}
