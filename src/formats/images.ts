import { isObject } from './json';

/**
 * Images in a chat completions request (docs/images.md): `image_url` parts of the messages'
 * content, in conversation order (Anthropic image blocks and Responses `input_image` parts reach
 * the model server as these once translated). A part is a data URL (the bytes are in the request)
 * or an http(s) URL (the model server fetches it; the request holds only the address).
 */

/** What an image name begins with: `"image_url"` and `"image"` both do. */
export const IMAGE_NAME = Buffer.from('"image');
/** The longest image name's length (`"image_url"`, quotes included). */
export const IMAGE_NAME_SPAN = 11;

/**
 * Whether the bytes at `at` (where `"image` begins) are a whole `"image"` or `"image_url"`, read
 * through `byteAt` (bytes of one buffer or of several chunks). A request that names neither has no
 * image part, as a member name or as a part's type; one that does is parsed to find out.
 */
export function imageNameAt(byteAt: (i: number) => number | undefined, at: number): boolean {
  const end = at + IMAGE_NAME.length;
  if (byteAt(end) === 0x22) return true;
  return byteAt(end) === 0x5f && byteAt(end + 1) === 0x75 && byteAt(end + 2) === 0x72 && byteAt(end + 3) === 0x6c && byteAt(end + 4) === 0x22;
}

/** Whether a request's bytes name `"image_url"` or `"image"` (one pass for both: they begin alike). */
export function namesImage(bytes: Buffer): boolean {
  const byteAt = (i: number): number | undefined => bytes[i];
  for (let i = bytes.indexOf(IMAGE_NAME); i >= 0; i = bytes.indexOf(IMAGE_NAME, i + 1)) if (imageNameAt(byteAt, i)) return true;
  return false;
}

export type ImagePart = { kind: 'data'; mime: string; base64: string } | { kind: 'url'; url: string } | { kind: 'invalid'; why: string };

/** The request's image parts, in the order the chat template renders them. */
export function chatImageParts(request: unknown): ImagePart[] {
  const out: ImagePart[] = [];
  if (!isObject(request) || !Array.isArray(request.messages)) return out;
  for (const m of request.messages) {
    if (!isObject(m) || !Array.isArray(m.content)) continue;
    for (const p of m.content) {
      if (!isObject(p) || (p.type !== 'image_url' && p.type !== 'image')) continue;
      const raw = isObject(p.image_url) ? p.image_url.url : p.image_url;
      out.push(typeof raw === 'string' ? imagePart(raw) : { kind: 'invalid', why: 'image part without a url' });
    }
  }
  return out;
}

/** Whether a chat request has any image part (cheap: no decoding). */
export function hasImageParts(request: unknown): boolean {
  if (!isObject(request) || !Array.isArray(request.messages)) return false;
  return request.messages.some(
    (m) => isObject(m) && Array.isArray(m.content) && m.content.some((p) => isObject(p) && (p.type === 'image_url' || p.type === 'image')),
  );
}

function imagePart(url: string): ImagePart {
  const m = /^data:([^;,]+)?((?:;[^;,]*)*?);base64,/i.exec(url);
  if (m) return { kind: 'data', mime: (m[1] ?? 'application/octet-stream').toLowerCase(), base64: url.slice(m[0].length) };
  if (/^https?:\/\//i.test(url)) return { kind: 'url', url };
  if (url.startsWith('data:')) return { kind: 'invalid', why: 'a data URL that is not base64' };
  return { kind: 'invalid', why: 'an image URL that is neither data: nor http(s):' };
}

const EXT: Record<string, string> = { 'image/png': 'png', 'image/jpeg': 'jpg', 'image/jpg': 'jpg', 'image/gif': 'gif', 'image/webp': 'webp' };

/** Where the image store keeps an image: `<dir>/<first two hex digits>/<sha256>.<ext>` (docs/images.md). */
export function imagePath(dir: string, sha256: string, mime: string | null): string {
  return `${dir}/${sha256.slice(0, 2)}/${sha256}.${EXT[mime ?? ''] ?? 'bin'}`;
}

/** Width and height from an image's header (PNG, JPEG, GIF, WebP); null for anything else. */
export function imageDimensions(b: Buffer): { width: number; height: number } | null {
  if (b.length >= 24 && b.readUInt32BE(0) === 0x89504e47 && b.toString('latin1', 12, 16) === 'IHDR')
    return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
  if (b.length >= 10 && b.toString('latin1', 0, 4) === 'GIF8') return { width: b.readUInt16LE(6), height: b.readUInt16LE(8) };
  if (b.length >= 30 && b.toString('latin1', 0, 4) === 'RIFF' && b.toString('latin1', 8, 12) === 'WEBP') return webpDimensions(b);
  if (b.length >= 4 && b[0] === 0xff && b[1] === 0xd8) return jpegDimensions(b);
  return null;
}

function jpegDimensions(b: Buffer): { width: number; height: number } | null {
  let i = 2;
  while (i + 9 < b.length) {
    if (b[i] !== 0xff) return null;
    const marker = b[i + 1];
    if (marker === 0xff) {
      i++;
      continue;
    }
    const length = b.readUInt16BE(i + 2);
    // Start-of-frame markers (baseline, progressive, …) carry the size; DHT, JPG and DAC do not.
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc)
      return { height: b.readUInt16BE(i + 5), width: b.readUInt16BE(i + 7) };
    i += 2 + length;
  }
  return null;
}

function webpDimensions(b: Buffer): { width: number; height: number } | null {
  const chunk = b.toString('latin1', 12, 16);
  if (chunk === 'VP8X') return { width: 1 + b.readUIntLE(24, 3), height: 1 + b.readUIntLE(27, 3) };
  if (chunk === 'VP8 ' && b.length >= 30) return { width: b.readUInt16LE(26) & 0x3fff, height: b.readUInt16LE(28) & 0x3fff };
  if (chunk === 'VP8L' && b.length >= 25) {
    const bits = b.readUInt32LE(21);
    return { width: (bits & 0x3fff) + 1, height: ((bits >> 14) & 0x3fff) + 1 };
  }
  return null;
}

/**
 * The placeholder count a Qwen-VL processor gives an image (its `smart_resize`, height first;
 * Python's round is half to even), for the check of the server's expansion. Null when the
 * processor would refuse the image (a side under `factor`, an aspect ratio over 200).
 */
export function qwenVlPads(height: number, width: number, o: { factor: number; minPixels: number; maxPixels: number }): number | null {
  const { factor, minPixels, maxPixels } = o;
  if (height < factor || width < factor || Math.max(height, width) / Math.min(height, width) > 200) return null;
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
  return (h * w) / (factor * factor);
}

function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}
