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
  const nested = top.get('sampling_params');
  const members = nested && body[nested[0]] === 0x7b ? (topLevelMembers(body.subarray(nested[0], nested[1])) ?? top) : top;
  const base = members === top ? 0 : nested![0];
  return (key) => {
    const at = members.get(key);
    if (!at) return null;
    const [s, e] = [base + at[0], base + at[1]];
    const v = Number(body.toString('latin1', s, e));
    return Number.isFinite(v) && body[s] !== 0x22 && body[s] !== 0x6e ? v : null;
  };
}
