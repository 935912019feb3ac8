import type { Api } from '../../pipeline/records';

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
 * Returns null when nothing applies or the body is not a JSON object (forwarded untouched).
 */
export function injectFields(flavor: 'openai' | 'vllm' | 'sglang', api: Api, body: Buffer): Injection | null {
  if (flavor === 'openai') return null;
  const fields = FIELDS[flavor][api];
  if (!fields) return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return null;
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return null;
  const present = parsed as Record<string, unknown>;
  const missing = Object.keys(fields).filter((k) => present[k] === undefined);
  if (missing.length === 0) return null;
  let open = 0;
  while (open < body.length && body[open] !== 0x7b /* { */) open++;
  const insertion = missing.map((k) => `"${k}":${fields[k]}`).join(',') + (Object.keys(present).length > 0 ? ',' : '');
  return {
    body: Buffer.concat([body.subarray(0, open + 1), Buffer.from(insertion), body.subarray(open + 1)]),
    injected: missing,
  };
}
