import type { ServerResponse } from 'node:http';
import type { Api } from '../../model/records';

/**
 * The sidecar's own errors (never an upstream's, which pass through unchanged), in the error
 * shape of the API the agent called: OpenAI's `{error: {message, type, param, code}}`, or
 * Anthropic's `{type: "error", error: {type, message}}` on `/v1/messages`.
 */
export function sendProxyError(
  res: ServerResponse,
  status: number,
  code: string,
  message: string,
  api: Api | null,
  extraHeaders: Record<string, string> = {},
  /** The request field at fault (OpenAI's `param`). */
  param: string | null = null,
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body =
    api === 'anthropic.messages'
      ? { type: 'error', error: { type: anthropicType(status), message: `lightning-sidecar: ${message}` } }
      : { error: { message: `lightning-sidecar: ${message}`, type: openAiType(status), param, code } };
  const bytes = Buffer.from(JSON.stringify(body));
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': String(bytes.length),
    'x-lightning-sidecar-error': code,
    ...extraHeaders,
  });
  res.end(bytes);
}

function openAiType(status: number): string {
  if (status === 413 || status === 400) return 'invalid_request_error';
  if (status === 429) return 'rate_limit_error';
  return 'api_error';
}

function anthropicType(status: number): string {
  if (status === 413) return 'request_too_large';
  if (status === 400) return 'invalid_request_error';
  if (status === 429) return 'rate_limit_error';
  return 'api_error';
}
