import type { BodyReader, CallFacts } from '../../formats/extract';
import { topLevelMembers } from '../../formats/json-scan';

/**
 * The numbers among the top-level members of the request the model server got (the sidecar's own
 * additions included), read from the journal: a member's value when it is a JSON number, else
 * null. Null when the request is not in the journal or not a JSON object.
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
  const members = topLevelMembers(body);
  if (members === null) return null;
  return (key) => {
    const at = members.get(key);
    if (!at) return null;
    const v = Number(body.toString('latin1', at[0], at[1]));
    return Number.isFinite(v) && body[at[0]] !== 0x22 && body[at[0]] !== 0x6e ? v : null;
  };
}
