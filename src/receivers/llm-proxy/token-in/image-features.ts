import { isObject, type Json } from '../../../formats/json';
import { extend } from '../../../model/extend';

/**
 * Token-in with images (docs/images.md#token-in), on vLLM's render and generate routes: the render
 * route gives the conversation's ids with each image expanded into its placeholder run, and the
 * images' `features` (hashes, where each run is, the processed data); the generate route takes ids
 * with those features. The sidecar's prompt continues the rollout's ids, so each image's run may
 * sit elsewhere than in the render: the features are placed on the runs found in the prompt.
 */

/** The render route's answer: the ids and the image features (null when there are no images). */
export function readRender(body: Buffer): { tokens: number[]; features: Json | null } | null {
  try {
    const v = JSON.parse(body.toString('utf8')) as unknown;
    // An older server answers `[conversation, engine_prompts]`; only the GenerateRequest shape is read.
    if (!isObject(v) || !Array.isArray(v.token_ids) || v.token_ids.length === 0) return null;
    if (!v.token_ids.every((x) => Number.isInteger(x) && (x as number) >= 0)) return null;
    return { tokens: v.token_ids as number[], features: isObject(v.features) ? v.features : null };
  } catch {
    return null;
  }
}

/**
 * The features for `prompt`: the render's, with its image placeholders moved onto the runs of
 * `imageTokenId` in the prompt (the k-th run is the k-th image). Null when they do not line up:
 * another number of runs, or a run of another length than the render gave its image.
 */
export function placeFeatures(prompt: ArrayLike<number>, features: Json, imageTokenId: number): Json | null {
  const placeholders = isObject(features.mm_placeholders) ? features.mm_placeholders : {};
  const rendered = Array.isArray(placeholders.image) ? (placeholders.image as unknown[]) : [];
  const runs: { offset: number; length: number }[] = [];
  for (let i = 0; i < prompt.length; i++) {
    if (prompt[i] !== imageTokenId) continue;
    const offset = i;
    while (i + 1 < prompt.length && prompt[i + 1] === imageTokenId) i++;
    runs.push({ offset, length: i + 1 - offset });
  }
  if (runs.length !== rendered.length) return null;
  for (let k = 0; k < runs.length; k++) {
    const r = rendered[k];
    if (!isObject(r) || r.length !== runs[k].length) return null;
  }
  return extend(features, { mm_placeholders: extend(placeholders, { image: runs }) });
}

/** The features as journaled: the images' processed data left out (tens of MB an image; the trainer recomputes it from the image). */
export function journaledFeatures(features: Json): Json {
  const data = isObject(features.kwargs_data) ? features.kwargs_data : null;
  if (data === null) return features;
  const elided: Json = {};
  for (const [kind, items] of Object.entries(data)) elided[kind] = Array.isArray(items) ? items.map(() => null) : null;
  return extend(features, { kwargs_data: elided, kwargs_data_elided: true });
}
