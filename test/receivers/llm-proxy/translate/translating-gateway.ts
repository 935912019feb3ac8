import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import {
  anthropicToChatRequest,
  ChatStreamToAnthropicEvents,
  ChatStreamToResponsesEvents,
  chatErrorToAnthropicError,
  chatErrorToResponsesError,
  chatToAnthropicResponse,
  chatToResponsesResponse,
  responsesToChatRequest,
} from '../../../../src/receivers/llm-proxy/translate';
import { SseSplitter } from '../../../../src/formats/sse';

/**
 * A minimal stand-in for the proxy's translated path, so the translation modules meet the real
 * SDKs end to end: the agent's Responses or Messages request is translated, sent as a chat
 * completion (with vLLM's token-id fields added, as the injector does) to the upstream, and the
 * answer translated back, JSON or SSE. Requests that do not map pass through untouched.
 */
export interface GatewayCall {
  api: 'responses' | 'anthropic';
  /** The agent's request as sent. */
  agentRequest: unknown;
  translated: boolean;
  reason: string | null;
  chatRequest: Record<string, unknown> | null;
  upstreamStatus: number;
  notes: string[];
  /** What the agent received: JSON body or the SSE text. */
  sent: string;
}

export interface TranslatingGateway {
  url: string;
  calls: GatewayCall[];
  close(): Promise<void>;
}

export async function startTranslatingGateway(upstreamOrigin: string): Promise<TranslatingGateway> {
  const calls: GatewayCall[] = [];
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => void handle(req, res, Buffer.concat(parts)).catch(() => res.destroy()));
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });

  async function handle(req: IncomingMessage, res: ServerResponse, raw: Buffer): Promise<void> {
    const path = (req.url ?? '').split('?')[0];
    const api = path === '/v1/responses' ? 'responses' : path === '/v1/messages' ? 'anthropic' : null;
    if (!api) return respond(res, 404, 'application/json', JSON.stringify({ error: { message: 'no route' } }));
    let body: unknown = null;
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      body = null;
    }
    const t = api === 'responses' ? responsesToChatRequest(body) : anthropicToChatRequest(body);
    const call: GatewayCall = {
      api,
      agentRequest: body,
      translated: t.ok,
      reason: t.ok ? null : t.reason,
      chatRequest: t.ok ? t.chat : null,
      upstreamStatus: 0,
      notes: [],
      sent: '',
    };
    calls.push(call);
    if (!t.ok) {
      const up = await post(upstreamOrigin + path, raw, req.headers['content-type'] ?? 'application/json');
      call.upstreamStatus = up.res.statusCode ?? 0;
      const text = await readAll(up.res);
      call.sent = text;
      return respond(res, call.upstreamStatus, up.res.headers['content-type'] ?? 'application/json', text);
    }
    const chat = { return_token_ids: true, logprobs: true, ...t.chat };
    const up = await post(`${upstreamOrigin}/v1/chat/completions`, Buffer.from(JSON.stringify(chat)), 'application/json');
    const status = up.res.statusCode ?? 0;
    call.upstreamStatus = status;
    if (status < 200 || status >= 300) {
      const text = await readAll(up.res);
      const e = api === 'responses' ? chatErrorToResponsesError(status, text) : chatErrorToAnthropicError(status, text);
      call.sent = JSON.stringify(e.body);
      return respond(res, e.status, 'application/json', call.sent);
    }
    const streamed = /text\/event-stream/.test(String(up.res.headers['content-type'] ?? ''));
    if (t.context.stream && streamed) {
      const translator = api === 'responses' ? new ChatStreamToResponsesEvents(t.context as never) : new ChatStreamToAnthropicEvents(t.context as never);
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      const write = (s: string) => {
        if (s === '') return;
        call.sent += s;
        res.write(s);
      };
      // Framed as the proxy frames it (formats/sse.ts); an event cut short at the end is dropped,
      // as the event-stream format says, and end() below fails the stream without a finish reason.
      const splitter = new SseSplitter();
      up.res.on('data', (chunk: Buffer) => {
        for (const e of splitter.push(chunk)) {
          if (e.data === '') continue;
          if (e.data === '[DONE]') {
            write(translator.end());
            continue;
          }
          try {
            write(translator.push(JSON.parse(e.data) as Record<string, unknown>));
          } catch {
            write(translator.fail('upstream sent an event that is not JSON'));
          }
        }
      });
      await new Promise<void>((resolve) => {
        up.res.on('end', () => resolve());
        up.res.on('aborted', () => resolve());
        up.res.on('error', () => resolve());
        up.req.on('error', () => resolve());
      });
      // A stream cut before [DONE]: end() ends it as failed when no finish reason came.
      write(translator.end());
      call.notes = [...translator.notes];
      res.end();
      return;
    }
    const text = await readAll(up.res);
    let parsed: unknown = null;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = null;
    }
    const out = api === 'responses' ? chatToResponsesResponse(parsed, t.context as never) : chatToAnthropicResponse(parsed, t.context as never);
    if (!out.ok) {
      const e =
        api === 'responses'
          ? { error: { message: `upstream answer cannot be translated: ${out.reason}`, type: 'server_error', param: null, code: null } }
          : { type: 'error', error: { type: 'api_error', message: `upstream answer cannot be translated: ${out.reason}` } };
      call.sent = JSON.stringify(e);
      return respond(res, 502, 'application/json', call.sent);
    }
    call.notes = out.notes;
    call.sent = JSON.stringify('response' in out ? out.response : out.message);
    respond(res, 200, 'application/json', call.sent);
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    calls,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

function post(url: string, body: Buffer, contentType: string): Promise<{ req: http.ClientRequest; res: IncomingMessage }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', headers: { 'content-type': contentType, 'content-length': body.length } }, (res) => resolve({ req, res }));
    req.on('error', reject);
    req.end(body);
  });
}

function readAll(res: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    res.on('data', (c: Buffer) => parts.push(c));
    res.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    res.on('aborted', () => resolve(Buffer.concat(parts).toString('utf8')));
    res.on('error', () => resolve(Buffer.concat(parts).toString('utf8')));
  });
}

function respond(res: ServerResponse, status: number, contentType: string, text: string): void {
  const bytes = Buffer.from(text);
  res.writeHead(status, { 'content-type': contentType, 'content-length': bytes.length });
  res.end(bytes);
}
