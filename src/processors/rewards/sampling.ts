import type { BodyReader, CallFacts } from '../../formats/extract';
import type { SamplingParams } from '../../model/records';
import { requestNumbers } from './request-numbers';

const NUMBERS = ['temperature', 'top_p', 'top_k', 'min_p', 'seed', 'presence_penalty', 'frequency_penalty', 'repetition_penalty'] as const;

/**
 * The sampling parameters of the request the model server got (its top-level members; the
 * sidecar's own additions included), each null where the request left it to the server. All null
 * when the request is not in the journal or not a JSON object.
 */
export function samplingOf(call: CallFacts, read: BodyReader): SamplingParams {
  // Every key, in the contract's order, null until the request says otherwise.
  const out = Object.fromEntries([...NUMBERS, 'max_tokens'].map((k) => [k, null])) as unknown as SamplingParams;
  const num = requestNumbers(call, read);
  if (num === null) return out;
  for (const key of NUMBERS) out[key] = num(key);
  out.max_tokens = num('max_tokens') ?? num('max_completion_tokens');
  return out;
}
