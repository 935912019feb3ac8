/** Where the examples find the sidecar, from the environment (defaults: the sidecar's own). */
export const SIDECAR = process.env.SIDECAR_URL ?? 'http://127.0.0.1:4000';
export const OTLP = process.env.OTLP_URL ?? 'http://127.0.0.1:4318';
export const MODEL = process.env.MODEL ?? 'policy';

/** A rollout id of `[A-Za-z0-9._:-]`, unique enough for a try-out. */
export function newRolloutId(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}`;
}

/** Reports the episode's final reward; the sidecar closes the episode and writes its transitions. */
export async function reportReward(rolloutId: string, value: number): Promise<void> {
  const res = await fetch(`${SIDECAR}/lightning/v1/rollouts/${rolloutId}/reward`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ value, attempt_id: '0', final: true }),
  });
  if (res.status !== 202) throw new Error(`reward not accepted: ${res.status} ${await res.text()}`);
  console.log(`rollout ${rolloutId}: reward ${value} reported`);
}
