import type { TransitionRecord } from '../model/records';
import { isDigit, startsWithConcat } from '../formats/json-scan';
import type { TransitionWriter } from './transition-json';
import { extend } from '../model/extend';

/**
 * A prompt delta as JSON pieces: `{"previous_transition_id":…,"prefix_length":N,"suffix":[…]}`
 * with the suffix copied from the model server's own bytes (docs/kafka-records.md has the shape).
 */
export interface PromptDeltaParts {
  previousTransitionId: string;
  prefixLength: number;
  /** The suffix as a JSON array: `[`, then the bytes after the shared prefix up to the closing `]`. */
  suffix: Buffer[];
}

/**
 * Walks an episode's transitions in order and, for each that continues the previous call, gives
 * the delta against it: the previous call's (first choice's) prompt ids then its answer ids are
 * the prefix. Works on the JSON text of the id arrays: the prefix is checked by comparing bytes
 * (memcmp) and the suffix is sliced out, so no id is parsed or formatted; a prompt that spells
 * the shared ids differently (white space) is written whole. Keeps one call's ids in a buffer of
 * its own (the writer's buffers are reused between transitions).
 */
export class PromptDeltaBytes {
  /** Two buffers in turn: the previous call's ids (the prefix) and this call's (the next prefix). */
  private readonly bufs: [Buffer, Buffer] = [Buffer.alloc(0), Buffer.alloc(0)];
  private prev: Held | null = null;
  private pending: Held | null = null;
  private lastSeq = -1;

  constructor(private readonly writer: TransitionWriter) {}

  /** The delta for `t`, or null when it carries its full prompt. Call in order, for every transition. */
  next(t: TransitionRecord): PromptDeltaParts | null {
    if (t.seq !== this.lastSeq) {
      this.prev = this.pending;
      this.pending = null;
      this.lastSeq = t.seq;
    }
    const prompt = this.writer.idsBytes(t, t.prompt_token_ids);
    const prev = this.prev;
    let delta: PromptDeltaParts | null = null;
    let promptCount = -1;
    if (t.continues_previous && prev !== null && prompt !== null) {
      const held = this.bufs[prev.buf];
      if (startsWithConcat(prompt, 0, prompt.length, held, [0, prev.promptEnd], [prev.promptEnd, prev.end]) === true) {
        // Just past the shared ids: `,` before the first new id, or the closing `]`.
        const at = prev.end - 2;
        const more = prompt[at] === 0x2c;
        const prefixLength = prev.promptCount + prev.responseCount;
        delta = { previousTransitionId: prev.id, prefixLength, suffix: more ? [OPEN, prompt.subarray(at + 1)] : [EMPTY] };
        promptCount = prefixLength + (more ? countInts(prompt, at + 1, prompt.length) : 0);
      }
    }
    if (t.choice_index === 0 || this.pending === null) this.hold(t, prompt, promptCount);
    return delta;
  }

  /** Keeps `t`'s prompt and answer ids as the prefix for the next call, in the buffer `prev` does not use. */
  private hold(t: TransitionRecord, prompt: Buffer | null, promptCount: number): void {
    const response = this.writer.idsBytes(t, t.response_token_ids);
    if (prompt === null || response === null) {
      this.pending = null;
      return;
    }
    const buf: 0 | 1 = this.prev === null || this.prev.buf === 1 ? 0 : 1;
    const need = prompt.length + response.length;
    if (this.bufs[buf].length < need) this.bufs[buf] = Buffer.allocUnsafe(Math.max(need, 2 * this.bufs[buf].length));
    prompt.copy(this.bufs[buf], 0);
    response.copy(this.bufs[buf], prompt.length);
    this.pending = {
      id: t.transition_id,
      buf,
      promptEnd: prompt.length,
      end: need,
      promptCount: promptCount >= 0 ? promptCount : countInts(prompt, 0, prompt.length),
      responseCount: countInts(response, 0, response.length),
    };
  }
}

interface Held {
  id: string;
  /** Which of the two buffers holds the ids: the prompt's JSON text in `[0, promptEnd)`, the answer's in `[promptEnd, end)`. */
  buf: 0 | 1;
  promptEnd: number;
  end: number;
  promptCount: number;
  responseCount: number;
}

/**
 * `t`'s JSON as pieces with its prompt as the delta `d`: `prompt_token_ids` null and a
 * `prompt_token_ids_delta` member, the suffix being the model server's bytes.
 */
export function deltaJsonParts(writer: TransitionWriter, t: TransitionRecord, d: PromptDeltaParts): Buffer[] {
  return writer.jsonParts(extend(t, { prompt_token_ids: null }), undefined, deltaMember(d));
}

/** The same bytes in one buffer. */
export function deltaJson(writer: TransitionWriter, t: TransitionRecord, d: PromptDeltaParts): Buffer {
  return writer.json(extend(t, { prompt_token_ids: null }), undefined, deltaMember(d));
}

/** `,"prompt_token_ids_delta":{…}` as pieces. */
function deltaMember(d: PromptDeltaParts): Buffer[] {
  const head = `,"prompt_token_ids_delta":{"previous_transition_id":${JSON.stringify(d.previousTransitionId)},"prefix_length":${d.prefixLength},"suffix":`;
  return [Buffer.from(head), ...d.suffix, CLOSE];
}

const CLOSE = Buffer.from('}');
const OPEN = Buffer.from('[');
const EMPTY = Buffer.from('[]');

/** How many integers the JSON text `[start, end)` holds (runs of digits). */
function countInts(buf: Buffer, start: number, end: number): number {
  let n = 0;
  let inNumber = false;
  for (let i = start; i < end; i++) {
    const digit = isDigit(buf[i]);
    if (digit && !inNumber) n++;
    inNumber = digit;
  }
  return n;
}
