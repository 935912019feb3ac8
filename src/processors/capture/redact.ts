export const REDACTED = '[REDACTED]';

type Segment = string;

/**
 * Compiles `processors.capture.redact_request_fields` into a function that returns a copy of a
 * request body with those fields replaced by "[REDACTED]" (the input is not modified). Paths are
 * dotted from the body root; `*` matches any one key or array index; a leading `**.` matches at
 * any depth. A path that does not exist in a body is ignored.
 */
export function compileRedaction(paths: readonly string[]): ((body: unknown) => unknown) | null {
  if (paths.length === 0) return null;
  const anchored: Segment[][] = [];
  const anywhere: Segment[][] = [];
  for (const p of paths) {
    if (p.startsWith('**.')) anywhere.push(p.slice(3).split('.'));
    else anchored.push(p.split('.'));
  }
  return (body) => {
    if (body === null || typeof body !== 'object') return body;
    let out = structuredClone(body) as Record<string, unknown>;
    for (const segs of anchored) out = redactAt(out, segs) as Record<string, unknown>;
    if (anywhere.length > 0) out = redactEverywhere(out, anywhere, 0) as Record<string, unknown>;
    return out;
  };
}

function redactAt(node: unknown, segs: Segment[]): unknown {
  if (node === null || typeof node !== 'object') return node;
  const [head, ...rest] = segs;
  const container = node as Record<string, unknown>;
  const keys = head === '*' ? Object.keys(container) : Object.hasOwn(container, head) ? [head] : [];
  for (const k of keys) container[k] = rest.length === 0 ? REDACTED : redactAt(container[k], rest);
  return node;
}

/** Applies every `**.` path at this node and below. Depth-bounded: request bodies are JSON the agent sent. */
function redactEverywhere(node: unknown, paths: Segment[][], depth: number): unknown {
  if (node === null || typeof node !== 'object' || depth > 64) return node;
  for (const segs of paths) redactAt(node, segs);
  for (const v of Object.values(node as Record<string, unknown>)) redactEverywhere(v, paths, depth + 1);
  return node;
}
