import type { Api } from '../../pipeline/records';
import { findMembers, skipWs, topLevelKeys } from '../../processors/capture/json-scan';

/** Flavor-specific fields that make a model server return token ids and logprobs (DESIGN §2.5). */
const FIELDS: Record<'vllm' | 'sglang', Partial<Record<Api, Record<string, string>>>> = {
  vllm: {
    'chat.completions': { return_token_ids: 'true', logprobs: 'true' },
    completions: { return_token_ids: 'true', logprobs: '0' },
  },
  sglang: {
    'chat.completions': { return_token_ids: 'true', return_prompt_token_ids: 'true', logprobs: 'true' },
    completions: { return_token_ids: 'true', return_prompt_token_ids: 'true', logprobs: '0' },
  },
};

export interface Injection {
  body: Buffer;
  injected: string[];
}

/**
 * Adds the flavor's fields that the request lacks, by inserting them textually after the body's
 * opening `{` so every other byte (number spellings, key order, unknown fields) stays as sent.
 * Whether a field is present is found by scanning for its member name, not by parsing the body
 * (prompts are big); only when the name occurs somewhere are the top-level members walked to see
 * whether it is one of them. Returns null when nothing applies or the body is not a JSON object
 * (forwarded untouched).
 */
export function injectFields(flavor: 'openai' | 'vllm' | 'sglang', api: Api, body: Buffer): Injection | null {
  if (flavor === 'openai') return null;
  const fields = FIELDS[flavor][api];
  if (!fields) return null;
  const open = skipWs(body, 0);
  if (body[open] !== 0x7b /* { */) return null;
  let present: Set<string> | null = null;
  const missing: string[] = [];
  for (const k of Object.keys(fields)) {
    if (findMembers(body, k).length === 0) {
      missing.push(k);
      continue;
    }
    present ??= topLevelKeys(body);
    if (present === null) return null;
    if (!present.has(k)) missing.push(k);
  }
  if (missing.length === 0) return null;
  const empty = body[skipWs(body, open + 1)] === 0x7d; /* } */
  const insertion = missing.map((k) => `"${k}":${fields[k]}`).join(',') + (empty ? '' : ',');
  return {
    body: Buffer.concat([body.subarray(0, open + 1), Buffer.from(insertion), body.subarray(open + 1)]),
    injected: missing,
  };
}
