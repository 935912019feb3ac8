import { createHash } from 'node:crypto';
import { chatImageParts, imageDimensions, qwenVlPads, type ImagePart } from '../../formats/images';
import type { ImageProcessorJson, TrajectoryImage, TrajectoryImages } from '../../model/records';

/**
 * A trajectory's images (docs/images.md): the image parts of its last call's request (which holds
 * the whole conversation), in order, paired with the runs of the image placeholder token in that
 * call's prompt ids: the k-th run is the k-th image, as the Qwen-VL processor expands them. Fails
 * closed: a count that does not pair, a run of another length than the processor gives the image
 * (when its settings are known), an image the request only names by URL, or one that cannot be
 * read makes the trajectory `images_complete: false`, with why.
 */

export interface ImageOptions {
  /** The placeholder token (`<|image_pad|>`: 151655 on Qwen2/2.5/3-VL). */
  imageTokenId: number;
  /** The Qwen-VL resize settings, to check each run's length; null: runs are taken as the server made them. */
  processor: { factor: number; minPixels: number; maxPixels: number } | null;
}

/** The decoded bytes of a data image part, or null. */
export function imageBytes(part: ImagePart): Buffer | null {
  if (part.kind !== 'data') return null;
  const bytes = Buffer.from(part.base64, 'base64');
  return bytes.length > 0 ? bytes : null;
}

export function sha256Hex(bytes: Buffer): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/** Runs of `id` in the prompt: [start, length] each, in order. */
export function placeholderRuns(ids: ArrayLike<number>, id: number): [number, number][] {
  const runs: [number, number][] = [];
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== id) continue;
    const start = i;
    while (i + 1 < ids.length && ids[i + 1] === id) i++;
    runs.push([start, i + 1 - start]);
  }
  return runs;
}

/** The trajectory's images; null when its last call's request has none (and its prompt no placeholder). */
export function trajectoryImages(request: unknown, promptIds: ArrayLike<number> | null, o: ImageOptions): TrajectoryImages | null {
  const parts = chatImageParts(request);
  const runs = promptIds === null ? [] : placeholderRuns(promptIds, o.imageTokenId);
  if (parts.length === 0 && runs.length === 0) return null;
  const processor: ImageProcessorJson = { image_token_id: o.imageTokenId };
  if (o.processor) Object.assign(processor, { factor: o.processor.factor, min_pixels: o.processor.minPixels, max_pixels: o.processor.maxPixels });
  const problems: string[] = [];
  const pending: (Buffer | null)[] = [];
  const pairs = parts.length === runs.length;
  if (promptIds === null) problems.push('no_prompt_ids');
  else if (!pairs) problems.push(`placeholders_do_not_pair: ${runs.length} placeholder run(s) for ${parts.length} image(s)`);
  const images: TrajectoryImage[] = parts.map((part, order) => {
    const bytes = imageBytes(part);
    pending.push(bytes);
    const image = describe(part, bytes, order, problems);
    if (pairs && promptIds !== null) [image.start, image.length] = runs[order];
    if (pairs && o.processor && image.width !== null && image.height !== null) {
      const expected = qwenVlPads(image.height, image.width, o.processor);
      if (expected !== image.length)
        problems.push(
          `placeholder_length: image ${order} (${image.width}x${image.height}) has ${image.length} placeholders, the processor gives ${expected ?? 'none (it refuses the image)'}`,
        );
    }
    return image;
  });
  return { images, complete: problems.length === 0, error: problems[0] ?? null, processor, pending };
}

function describe(part: ImagePart, bytes: Buffer | null, order: number, problems: string[]): TrajectoryImage {
  const image: TrajectoryImage = { order, sha256: null, mime: null, bytes: null, width: null, height: null, url: null, start: null, length: null };
  if (part.kind === 'url') {
    image.url = part.url;
    problems.push(`url_not_stored: image ${order} is named by URL; the sidecar keeps no bytes of it`);
    return image;
  }
  if (part.kind === 'invalid') {
    problems.push(`unreadable_image: image ${order}: ${part.why}`);
    return image;
  }
  if (bytes === null) {
    problems.push(`unreadable_image: image ${order}: empty data URL`);
    return image;
  }
  const size = imageDimensions(bytes);
  Object.assign(image, { sha256: sha256Hex(bytes), mime: part.mime, bytes: bytes.length, width: size?.width ?? null, height: size?.height ?? null });
  return image;
}
