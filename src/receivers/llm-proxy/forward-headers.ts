/**
 * Hop-by-hop header handling for a reverse proxy (RFC 9110 §7.6.1): `Connection` and every field
 * it names, plus the fields historically defined hop-by-hop (RFC 2616 §13.5.1), are not forwarded.
 * Everything else passes as received: same names, same order, same duplicates.
 */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/**
 * Filters a flat `rawHeaders` list ([name, value, name, value, …]) into a flat list to forward.
 * `replace` substitutes values by lower-case name (e.g. host); `drop` removes more names.
 */
export function forwardHeaders(raw: readonly string[], replace: Readonly<Record<string, string>> = {}, drop: ReadonlySet<string> = EMPTY): string[] {
  let named: Set<string> | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].length === 10 && raw[i].toLowerCase() === 'connection') {
      named ??= new Set();
      for (const token of raw[i + 1].split(',')) named.add(token.trim().toLowerCase());
    }
  }
  const out: string[] = [];
  const replaced = new Set<string>();
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i];
    const lower = name.toLowerCase();
    if (HOP_BY_HOP.has(lower) || drop.has(lower) || (named !== null && named.has(lower))) continue;
    const sub = replace[lower];
    if (sub !== undefined) {
      if (replaced.has(lower)) continue;
      replaced.add(lower);
      out.push(name, sub);
    } else {
      out.push(name, raw[i + 1]);
    }
  }
  for (const [lower, value] of Object.entries(replace)) if (!replaced.has(lower)) out.push(lower, value);
  return out;
}

const EMPTY: ReadonlySet<string> = new Set();

/** The value of a header in a flat raw list, case-insensitive; first occurrence. */
export function rawHeader(raw: readonly string[], lowerName: string): string | undefined {
  for (let i = 0; i < raw.length; i += 2) if (raw[i].toLowerCase() === lowerName) return raw[i + 1];
  return undefined;
}
