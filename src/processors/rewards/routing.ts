import { ENGINE } from '../../formats/engines';
import type { RoutingRequest } from '../../formats/engines/dialect';
import type { BodyReader, CallFacts } from '../../formats/extract';
import { routingRange } from '../../formats/adapters/shape';
import { base64Range, RoutingFormatError } from '../../formats/routed-experts';
import { requestNumbers } from './request-numbers';

/** SGLang's routing shape (its wire form has none): the model's layers and experts per token. */
export interface SglangRoutingShape {
  layers: number;
  topK: number;
}

/**
 * Decodes the routed experts of a call's answer, choice by choice (`routing`, or why not in
 * `routingError`), by the engine whose form they are in (src/formats/engines), and drops the wire form.
 * SGLang's need the model's shape (`sglang`).
 */
export function decodeRouting(call: CallFacts, read: BodyReader, sglang: SglangRoutingShape | null = null, response: Buffer | null = null): void {
  const raw = call.choices.filter((c) => c.routedExperts !== undefined);
  if (raw.length === 0) return;
  let numbers: ReturnType<typeof requestNumbers> | undefined;
  const request: RoutingRequest = {
    requested: (key) => {
      numbers ??= requestNumbers(call, read);
      const v = numbers?.(key) ?? null;
      return v !== null && Number.isSafeInteger(v) && v >= 0 ? v : 0;
    },
    shape: sglang,
  };
  for (const c of raw) {
    const kept = c.routedExperts!;
    c.routedExperts = undefined;
    try {
      // A base64 string cut out of the parse (formats/extract.ts) is decoded from the answer's bytes.
      const range = routingRange(kept.value);
      if (range !== null && response === null) throw new RoutingFormatError('the answer is not readable');
      const value = range === null ? kept.value : base64Range(response!, range[0], range[1]);
      c.routing = ENGINE[kept.form].decodeRouting(value, kept, request);
    } catch (err) {
      c.routingError = (err as Error).message;
    }
  }
}
