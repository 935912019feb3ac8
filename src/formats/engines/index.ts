import type { EngineDialect, EngineName } from './dialect';
import { sglang } from './sglang';
import { vllm } from './vllm';

export type { EngineDialect, EngineName } from './dialect';

/** Every engine the sidecar speaks, in the order an answer's extras are looked for. */
export const ENGINES: readonly EngineDialect[] = [vllm, sglang];

export const ENGINE: Readonly<Record<EngineName, EngineDialect>> = { vllm, sglang };

/** Answer members each request member brings, over every engine (a member means the same wherever it is used). */
export const BROUGHT: Readonly<Record<string, readonly string[]>> = ENGINES.reduce<Record<string, string[]>>((all, e) => {
  for (const [field, members] of Object.entries(e.brought)) all[field] = [...new Set([...(all[field] ?? []), ...members])];
  return all;
}, {});
