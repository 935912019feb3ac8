import type { BodyReader, CallFacts } from '../../formats/extract';
import type { SamplingParams } from '../../model/records';
import { requestNumbers } from './request-numbers';
import { extend } from '../../model/extend';

const NUMBERS = ['temperature', 'top_p', 'top_k', 'min_p', 'seed', 'presence_penalty', 'frequency_penalty', 'repetition_penalty'] as const;

/**
 * The sampling parameters of the request the model server got (its top-level members; the
 * sidecar's own additions included), each null where the request left it to the server. All null
 * when the request is not in the journal or not a JSON object.
 */
export function samplingOf(call: CallFacts, read: BodyReader, defaults: ServerDefaults | null = null): SamplingParams {
  // Every key, in the contract's order, null until the request says otherwise.
  const out = Object.fromEntries([...NUMBERS, 'max_tokens'].map((k) => [k, null])) as unknown as SamplingParams;
  const num = requestNumbers(call, read);
  if (num === null) return out;
  for (const key of NUMBERS) out[key] = num(key);
  // SGLang's `/generate` names two of them its own way.
  out.seed ??= num('sampling_seed');
  out.max_tokens = num('max_tokens') ?? num('max_completion_tokens') ?? num('max_new_tokens');
  if (defaults === null) return out;
  // What the server used where the request said nothing, when the sidecar is told its defaults.
  const applied: string[] = [];
  for (const key of [...NUMBERS, 'max_tokens'] as const) {
    const d = defaults[key];
    if (out[key] !== null || d === undefined) continue;
    out[key] = d;
    applied.push(key);
  }
  return applied.length > 0 ? extend(out, { server_defaults: applied }) : out;
}

/** The model server's defaults (`processors.sampling.server_defaults`), by parameter. */
export type ServerDefaults = Partial<Record<(typeof NUMBERS)[number] | 'max_tokens', number>>;
