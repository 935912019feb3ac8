import { createHash } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import { gzipSync } from 'node:zlib';
import type { AddressInfo, Socket } from 'node:net';
import { buildAnthropic, buildChat, buildCompletions, buildResponses, type Generation, type Turn } from './fake-responses';
import { assistantTokens, renderPrompt, tokenize } from './fake-tokenizer';

export type { Turn } from './fake-responses';

/**
 * A scripted model server that answers like vLLM (or SGLang / plain OpenAI) on
 * `/v1/chat/completions`, `/v1/completions`, `/v1/responses` and Anthropic `/v1/messages`, streamed
 * and not, with token ids and logprobs when asked. Test code: its answers come from a script.
 */
export interface ReceivedRequest {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  body: Buffer;
  json: Record<string, unknown> | null;
}

/** Overrides the normal answer to one request. */
export type Fault =
  | { kind: 'status'; status: number; body: string; contentType?: string }
  | { kind: 'hang' }
  | { kind: 'reset' }
  | { kind: 'reset-mid-stream'; afterEvents: number }
  | { kind: 'delay'; ms: number };

export interface FakeModelServerOptions {
  flavor?: 'vllm' | 'sglang' | 'openai';
  /** Decides the next turn from the request; default: a calculator agent script. */
  script?: (req: ReceivedRequest) => Turn;
  /** Milliseconds between stream events. */
  chunkDelayMs?: number;
  /** Fixed delay before answering, like a model's prefill. */
  delayMs?: number;
  /** When set, a stream pauses after its first event until this resolves. */
  holdAfterFirstEvent?: () => Promise<void>;
  /** Per-request fault (return null for a normal answer). */
  fault?: (req: ReceivedRequest) => Fault | null;
  model?: string;
  /** gzip JSON bodies when the client accepts it (like OpenAI's API does). */
  gzip?: boolean;
}

export interface FakeModelServer {
  url: string;
  port: number;
  requests: ReceivedRequest[];
  /** Bytes of each response body as written, by request index. */
  responses: Buffer[];
  close(): Promise<void>;
}

export async function startFakeModelServer(options: FakeModelServerOptions = {}): Promise<FakeModelServer> {
  const requests: ReceivedRequest[] = [];
  const responses: Buffer[] = [];
  const sockets = new Set<Socket>();
  const flavor = options.flavor ?? 'vllm';
  const server = http.createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (c: Buffer) => parts.push(c));
    req.on('end', () => {
      const body = Buffer.concat(parts);
      let json: Record<string, unknown> | null = null;
      try {
        json = JSON.parse(body.toString('utf8')) as Record<string, unknown>;
      } catch {
        json = null;
      }
      const received: ReceivedRequest = { method: req.method ?? '', path: req.url ?? '', headers: req.headers, rawHeaders: req.rawHeaders, body, json };
      const index = requests.push(received) - 1;
      void answer(received, req, res, index).catch(() => res.destroy());
    });
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });

  async function answer(r: ReceivedRequest, req: IncomingMessage, res: ServerResponse, index: number): Promise<void> {
    const fault = options.fault?.(r) ?? null;
    if (fault?.kind === 'hang') return;
    if (fault?.kind === 'reset') {
      req.socket.destroy();
      return;
    }
    if (fault?.kind === 'delay') await sleep(fault.ms);
    if (options.delayMs) await sleep(options.delayMs);
    if (fault?.kind === 'status') {
      const bytes = Buffer.from(fault.body);
      responses[index] = bytes;
      res.writeHead(fault.status, { 'content-type': fault.contentType ?? 'application/json', 'content-length': bytes.length, 'x-fake-upstream': 'yes' });
      res.end(bytes);
      return;
    }
    const path = r.path.split('?')[0];
    if (r.method === 'GET' && path === '/v1/models') {
      return sendJson(res, index, { object: 'list', data: [{ id: options.model ?? 'fake-model', object: 'model', owned_by: 'lightning-sidecar-tests' }] });
    }
    if (r.method !== 'POST' || !r.json) {
      return sendJson(res, index, { error: { message: `fake model server: no route ${r.method} ${path}`, type: 'not_found' } }, 404);
    }
    const gen = generate(r, path);
    if (!gen) return sendJson(res, index, { error: { message: `fake model server: no route ${path}`, type: 'not_found' } }, 404);
    const stream = r.json.stream === true;
    const out =
      path === '/v1/chat/completions'
        ? buildChat(gen, stream)
        : path === '/v1/completions'
          ? buildCompletions(gen, stream)
          : path === '/v1/responses'
            ? buildResponses(gen, stream)
            : buildAnthropic(gen, stream);
    if (!stream) return sendJson(res, index, out.body);
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-fake-upstream': 'yes' });
    res.flushHeaders();
    const written: Buffer[] = [];
    let n = 0;
    for (const event of out.events) {
      if (fault?.kind === 'reset-mid-stream' && n === fault.afterEvents) {
        responses[index] = Buffer.concat(written);
        req.socket.destroy();
        return;
      }
      const bytes = Buffer.from(event);
      written.push(bytes);
      if (!res.write(bytes)) await new Promise((r2) => res.once('drain', r2));
      n++;
      if (n === 1 && options.holdAfterFirstEvent) await options.holdAfterFirstEvent();
      else if (options.chunkDelayMs) await sleep(options.chunkDelayMs);
      if (res.destroyed) return;
    }
    responses[index] = Buffer.concat(written);
    res.end();
  }

  function generate(r: ReceivedRequest, path: string): Generation | null {
    const body = r.json!;
    // Distinct for distinct requests (frameworks key messages by id), equal for equal ones (tests compare direct and proxied bytes).
    const serial = createHash('sha1').update(r.body).digest().readUInt32BE(0);
    const turn = (options.script ?? calculatorScript)(r);
    const n = typeof body.n === 'number' && body.n > 1 ? body.n : 1;
    const withIds = flavor !== 'openai' && (body.return_token_ids === true || flavor === 'sglang');
    const withLogprobs = body.logprobs === true || typeof body.logprobs === 'number';
    let promptIds: number[];
    if (path === '/v1/chat/completions') promptIds = renderPrompt((body.messages as never[]) ?? []);
    else if (path === '/v1/completions') promptIds = tokenize(String(body.prompt ?? ''));
    else if (path === '/v1/responses') promptIds = renderPrompt(responsesInputAsMessages(body.input));
    else if (path === '/v1/messages') promptIds = renderPrompt((body.messages as never[]) ?? []);
    else return null;
    const choices = Array.from({ length: n }, (_, i) => {
      const content = n > 1 && turn.content ? `${turn.content} (sample ${i})` : (turn.content ?? null);
      const toolCalls = (turn.toolCalls ?? []).map((tc, j) => ({
        id: tc.id ?? `call_${serial}_${i}_${j}`,
        name: tc.name,
        arguments: JSON.stringify(tc.arguments),
      }));
      const tokens = path === '/v1/completions' ? tokenize(content ?? '') : assistantTokens(content, toolCalls);
      return { index: i, content, toolCalls, tokens };
    });
    return {
      serial,
      model: typeof body.model === 'string' ? body.model : (options.model ?? 'fake-model'),
      flavor,
      withIds,
      withLogprobs,
      promptIds,
      choices,
      includeUsage: includeUsage(body),
    };
  }

  function sendJson(res: ServerResponse, index: number, value: unknown, status = 200): void {
    let bytes = Buffer.from(JSON.stringify(value));
    const gzip = options.gzip === true && /gzip/.test(String(res.req.headers['accept-encoding'] ?? ''));
    if (gzip) bytes = gzipSync(bytes);
    responses[index] = bytes;
    res.writeHead(status, {
      'content-type': 'application/json',
      'content-length': bytes.length,
      'x-fake-upstream': 'yes',
      ...(gzip ? { 'content-encoding': 'gzip' } : {}),
    });
    res.end(bytes);
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    port,
    requests,
    responses,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

function includeUsage(body: Record<string, unknown>): boolean {
  const so = body.stream_options as { include_usage?: unknown } | undefined;
  return body.stream !== true || so?.include_usage === true;
}

function responsesInputAsMessages(input: unknown): { role: string; content: unknown }[] {
  if (typeof input === 'string') return [{ role: 'user', content: input }];
  if (!Array.isArray(input)) return [];
  return input.map((item: { role?: string; content?: unknown; type?: string; output?: unknown; arguments?: unknown }) => {
    if (item.type === 'function_call_output') return { role: 'tool', content: String(item.output ?? '') };
    if (item.type === 'function_call') return { role: 'assistant', content: String(item.arguments ?? '') };
    return { role: item.role ?? 'user', content: item.content };
  });
}

/**
 * Default script: ask the calculator for `2+2` when the last message is the user's, answer when
 * the last message is a tool result.
 */
export function calculatorScript(r: ReceivedRequest): Turn {
  const body = r.json ?? {};
  const messages = (Array.isArray(body.messages) ? body.messages : Array.isArray(body.input) ? body.input : []) as { role?: string; type?: string }[];
  const last = messages[messages.length - 1];
  const afterTool = last?.role === 'tool' || last?.type === 'function_call_output' || hasToolResult(last);
  if (afterTool) return { content: 'The answer is 4.' };
  if (!body.tools) return { content: 'Hello from the fake model.' };
  return { toolCalls: [{ name: 'calculator', arguments: { expression: '2+2' } }] };
}

function hasToolResult(m: unknown): boolean {
  const content = (m as { content?: unknown } | undefined)?.content;
  return Array.isArray(content) && content.some((b) => (b as { type?: string }).type === 'tool_result');
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
