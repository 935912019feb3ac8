import type { BodyReader, CallFacts } from '../../formats/extract';
import { topLevelMembers } from '../../formats/json-scan';

/**
 * The numbers among the top-level members of the request the model server got (the sidecar's own
 * additions included), read from the journal: a member's value when it is a JSON number, else
 * null; a request that nests them in `sampling_params` (vLLM's `/inference/v1/generate`) is read
 * there. Null when the request is not in the journal or not a JSON object.
 */
export function requestNumbers(call: CallFacts, read: BodyReader): ((key: string) => number | null) | null {
  const offsets = call.bodies?.request ?? [];
  if (offsets.length === 0) return null;
  let body: Buffer;
  try {
    body = read(offsets);
  } catch {
    return null;
  }
  const top = topLevelMembers(body);
  if (top === null) return null;
  const at = top.get('sampling_params');
  const nested = at && body[at[0]] === 0x7b ? topLevelMembers(body.subarray(at[0], at[1])) : null;
  const numberAt = (range: [number, number] | undefined, base: number): number | null => {
    if (!range) return null;
    const [s, e] = [base + range[0], base + range[1]];
    const v = Number(body.toString('latin1', s, e));
    return Number.isFinite(v) && body[s] !== 0x22 && body[s] !== 0x6e ? v : null;
  };
  // A sampling parameter nested in `sampling_params`, else a top-level member (SGLang's routing start is one).
  return (key) => (nested !== null ? numberAt(nested.get(key), at![0]) : null) ?? numberAt(top.get(key), 0);
}
