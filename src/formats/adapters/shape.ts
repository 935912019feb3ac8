import { randomBytes } from 'node:crypto';
import { ENGINES } from '../engines';
import type { ChoiceCapture, IdsRange, TokenIds, ToolCallRequest } from '../../model/records';
import { intList, str } from '../json';

/*
 * What the API adapters share beyond the checked JSON reads of `../json`: the shape of what they
 * extract, the markers that stand for token ids and logprobs read from the bytes, and choice and
 * tool-call records.
 */

/** What an API adapter extracts from one call. */
export interface Extracted {
  /** The response body, or one assembled from the stream in the non-streamed shape. */
  response: unknown;
  model: string | null;
  usage: unknown;
  promptTokenIds: TokenIds | null;
  choices: ChoiceCapture[];
  /** The stream ended without its terminal event. */
  incomplete: boolean;
}

/**
 * Big id arrays are cut out of a body before it is parsed and replaced by a marker string naming
 * their byte range (see formats/extract.ts); this reads either form.
 */
export const IDS_MARKER = '\u0000ids:';

/** A byte range of token ids made from a marker (never from JSON a server sent). */
class IdsSpan implements IdsRange {
  constructor(
    readonly start: number,
    readonly end: number,
  ) {}
}

export function intArray(v: unknown): TokenIds | null {
  if (v instanceof IdsSpan) return v;
  if (typeof v === 'string' && v.startsWith(IDS_MARKER)) {
    const [start, end] = v.slice(IDS_MARKER.length).split(':').map(Number);
    return new IdsSpan(start, end);
  }
  return intList(v);
}

/**
 * A chat answer's logprobs object read from the bytes before the parse (formats/extract.ts) is
 * replaced by this marker, naming where it was; its values come beside the parsed body. The random
 * part keeps a string a server sent from ever being taken for one.
 */
const LOGPROBS_MARKER = `\u0000logprobs:${randomBytes(8).toString('hex')}:`;

export function logprobsMarker(valueStart: number): string {
  return `${LOGPROBS_MARKER}${valueStart}`;
}

/**
 * A routed-experts string (base64, megabytes of it) is cut out of the text before the parse too,
 * and replaced by this marker naming its byte range `[start, end)` (the JSON string, quotes
 * included); it is decoded from the bytes (formats/routed-experts.ts `base64Range`).
 */
export const ROUTING_MARKER = `\u0000routing:${randomBytes(8).toString('hex')}:`;

/** The byte range a routing marker names, or null for any other value. */
export function routingRange(v: unknown): [number, number] | null {
  if (typeof v !== 'string' || !v.startsWith(ROUTING_MARKER)) return null;
  const [start, end] = v.slice(ROUTING_MARKER.length).split(':').map(Number);
  return Number.isSafeInteger(start) && Number.isSafeInteger(end) ? [start, end] : null;
}

/** Logprobs read from the bytes, by marker. */
export type ReadLogprobs = ReadonlyMap<string, number[] | null>;

export const NONE_READ: ReadLogprobs = new Map();

/** Chosen-token logprobs; null when absent or any value is not a finite number. */
export function logprobList(entries: unknown, pick: (e: unknown) => unknown): number[] | null {
  if (!Array.isArray(entries) || entries.length === 0) return null;
  const out: number[] = new Array(entries.length);
  for (let i = 0; i < entries.length; i++) {
    const v = pick(entries[i]);
    if (typeof v !== 'number' || !Number.isFinite(v)) return null;
    out[i] = v;
  }
  return out;
}

export function emptyChoice(index: number): ChoiceCapture {
  return { index, finishReason: null, responseTokenIds: null, responseLogprobs: null, promptTokenIds: null, toolCalls: [] };
}

export function toolCall(id: unknown, name: unknown, args: unknown): ToolCallRequest {
  return { id: str(id), name: str(name), arguments: typeof args === 'string' ? args : args === undefined ? null : JSON.stringify(args) };
}

/**
 * Keeps a choice's engine extras as the server wrote them (routed experts, for decoding when the
 * episode is built; weight versions; sampling mask), read by the engine whose fields the answer
 * has (src/formats/engines).
 */
export function withEngineExtras(choice: ChoiceCapture, c: Record<string, unknown>, res: Record<string, unknown>): ChoiceCapture {
  for (const engine of ENGINES) if (engine.readChoice(choice, c, res)) break;
  return choice;
}
