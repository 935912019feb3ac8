import type { BodyReader, CallFacts } from '../../formats/extract';
import { routingRange } from '../../formats/adapters/shape';
import { base64Range, RoutingFormatError, sglangRoutedExperts, vllmRoutedExperts } from '../../formats/routed-experts';
import { requestNumbers } from './request-numbers';

/** SGLang's routing shape (its wire form has none): the model's layers and experts per token. */
export interface SglangRoutingShape {
  layers: number;
  topK: number;
}

/**
 * Decodes the routed experts of a call's answer, choice by choice (`routing`, or why not in
 * `routingError`), and drops the wire form. vLLM's rows start at the request's own
 * `routed_experts_prompt_start`, SGLang's at the `routed_experts_start_len` it echoes or the
 * request set (0 when neither says); SGLang's need the model's shape (`sglang`).
 */
export function decodeRouting(call: CallFacts, read: BodyReader, sglang: SglangRoutingShape | null = null, response: Buffer | null = null): void {
  const raw = call.choices.filter((c) => c.routedExperts !== undefined);
  if (raw.length === 0) return;
  let request: ReturnType<typeof requestNumbers> | undefined;
  /** A non-negative integer top-level member of the request (0 when absent or not one). */
  const requested = (key: string): number => {
    request ??= requestNumbers(call, read);
    const v = request?.(key) ?? null;
    return v !== null && Number.isSafeInteger(v) && v >= 0 ? v : 0;
  };
  for (const c of raw) {
    const { value: wire, prompt, form, start } = c.routedExperts!;
    c.routedExperts = undefined;
    try {
      // A base64 string cut out of the parse (formats/extract.ts) is decoded from the answer's bytes.
      const range = routingRange(wire);
      if (range !== null && response === null) throw new RoutingFormatError('the answer is not readable');
      const value = range === null ? wire : base64Range(response!, range[0], range[1]);
      if (form === 'vllm') c.routing = vllmRoutedExperts(value, prompt, requested('routed_experts_prompt_start'));
      else if (sglang === null) throw new RoutingFormatError('SGLang routing without processors.routed_experts.sglang (layers, top_k) to shape it');
      else {
        const from = Number.isSafeInteger(start) && (start as number) >= 0 ? (start as number) : requested('routed_experts_start_len');
        c.routing = sglangRoutedExperts(value, sglang.layers, sglang.topK, from);
      }
    } catch (err) {
      c.routingError = (err as Error).message;
    }
  }
}
