import type { Api } from '../../model/records';
import { sseJsonPayloads } from '../sse';
import { assembleAnthropicStream, extractAnthropic } from './anthropic-messages';
import { assembleChatStream, extractChat } from './chat-completions';
import { assembleCompletionsStream, extractCompletions } from './completions';
import { assembleResponsesStream, extractResponses } from './responses';
import { assembleSglangGenerateStream, extractSglangGenerate } from './sglang-generate';
import type { Extracted, ReadLogprobs } from './shape';
import { extend } from '../../model/extend';

export type { Extracted } from './shape';

/** The recorded routes: POST on these paths (after any correlation prefix). */
const ROUTES: Record<string, Api> = {
  '/v1/chat/completions': 'chat.completions',
  '/v1/completions': 'completions',
  '/v1/responses': 'responses',
  '/v1/messages': 'anthropic.messages',
};

export function recordedApi(method: string | undefined, path: string): Api | null {
  if (method !== 'POST') return null;
  const q = path.indexOf('?');
  const bare = q < 0 ? path : path.slice(0, q);
  return ROUTES[bare.length > 1 && bare.endsWith('/') ? bare.slice(0, -1) : bare] ?? null;
}

/** `read`: chat logprobs objects already read from the bytes, by the marker that replaced them. */
export function extractBody(api: Api, body: unknown, read?: ReadLogprobs): Extracted {
  switch (api) {
    case 'chat.completions':
      return extractChat(body, read);
    case 'completions':
    case 'generate':
      return extractCompletions(body);
    case 'sglang.generate':
      return extractSglangGenerate(body);
    case 'responses':
      return extractResponses(body);
    case 'anthropic.messages':
      return extractAnthropic(body);
  }
}

export function extractStream(api: Api, text: string): Extracted & { invalidEvents: number } {
  const { payloads, done, invalid } = sseJsonPayloads(text);
  const values = payloads.map((p) => p.value);
  let extracted: Extracted;
  switch (api) {
    case 'chat.completions':
      extracted = assembleChatStream(values, done);
      break;
    case 'completions':
    case 'generate':
      extracted = assembleCompletionsStream(values, done);
      break;
    case 'sglang.generate':
      extracted = assembleSglangGenerateStream(values, done);
      break;
    case 'responses':
      extracted = assembleResponsesStream(payloads);
      break;
    case 'anthropic.messages':
      extracted = assembleAnthropicStream(payloads);
      break;
  }
  return extend(extracted, { invalidEvents: invalid });
}
