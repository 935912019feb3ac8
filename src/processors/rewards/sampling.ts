import type { BodyReader, CallFacts } from '../../formats/extract';
import { topLevelMembers } from '../../formats/json-scan';
import type { SamplingParams } from '../../model/records';

const NUMBERS = ['temperature', 'top_p', 'top_k', 'min_p', 'seed', 'presence_penalty', 'frequency_penalty', 'repetition_penalty'] as const;

/**
 * The sampling parameters of the request the model server got (its top-level members; the
 * sidecar's own additions included), each null where the request left it to the server. All null
 * when the request is not in the journal or not a JSON object.
 */
export function samplingOf(call: CallFacts, read: BodyReader): SamplingParams {
  // Every key, in the contract's order, null until the request says otherwise.
  const out = Object.fromEntries([...NUMBERS, 'max_tokens'].map((k) => [k, null])) as unknown as SamplingParams;
  const offsets = call.bodies?.request ?? [];
  if (offsets.length === 0) return out;
  let body: Buffer;
  try {
    body = read(offsets);
  } catch {
    return out;
  }
  const members = topLevelMembers(body);
  if (members === null) return out;
  const num = (key: string): number | null => {
    const at = members.get(key);
    if (!at) return null;
    const v = Number(body.toString('latin1', at[0], at[1]));
    return Number.isFinite(v) && body[at[0]] !== 0x22 && body[at[0]] !== 0x6e ? v : null;
  };
  for (const key of NUMBERS) out[key] = num(key);
  out.max_tokens = num('max_tokens') ?? num('max_completion_tokens');
  return out;
}
