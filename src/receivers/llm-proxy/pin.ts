/**
 * Training values for sampling parameters (`processors.sampling.pin`): agent frameworks send their
 * own temperature or top-p, or none, and a trainer wants the rollout sampled as it trains. A
 * pinned parameter the request leaves out is set to its value; one the request sets otherwise is
 * overridden (`force`) or the call is refused with a 400 that says why (`refuse`).
 */

export type PinMode = 'force' | 'refuse';
export type Pins = Record<string, { value: number; mode: PinMode }>;

export type Pinned =
  /** The body to send (the agent's own bytes when nothing changed), and the parameters overridden. */
  | { body: Buffer; set: string[]; overridden: string[] }
  /** The call is refused: which parameter, and why. */
  | { refused: string; message: string };

export function pinSampling(body: Buffer, pins: Pins): Pinned {
  let request: unknown;
  try {
    request = JSON.parse(body.toString('utf8'));
  } catch {
    // Not JSON: the model server answers it as it would; nothing to pin.
    return { body, set: [], overridden: [] };
  }
  if (typeof request !== 'object' || request === null || Array.isArray(request)) return { body, set: [], overridden: [] };
  const r = request as Record<string, unknown>;
  const set: string[] = [];
  const overridden: string[] = [];
  for (const [key, pin] of Object.entries(pins)) {
    const v = r[key];
    if (v === pin.value) continue;
    if (v === undefined || v === null) {
      set.push(key);
      r[key] = pin.value;
      continue;
    }
    if (pin.mode === 'refuse')
      return {
        refused: key,
        message: `${key} ${JSON.stringify(v)} is not the training value ${pin.value} (processors.sampling.pin.${key} refuses calls that set another; leave it out or send ${pin.value})`,
      };
    overridden.push(key);
    r[key] = pin.value;
  }
  if (set.length === 0 && overridden.length === 0) return { body, set, overridden };
  return { body: Buffer.from(JSON.stringify(r)), set, overridden };
}
