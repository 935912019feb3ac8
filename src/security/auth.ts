import { createHash, timingSafeEqual } from 'node:crypto';

/**
 * The optional API token of the rollout API, the OTLP receivers and the control route
 * (`service.api_token`). Compared in constant time over SHA-256 digests, so neither the content nor
 * the length of the token leaks through timing. Without a token every request is allowed.
 */
export function bearerAuth(token: string | undefined): (authorization: string | undefined, apiKey?: string) => boolean {
  if (!token) return () => true;
  const want = createHash('sha256').update(token).digest();
  const matches = (candidate: string) => timingSafeEqual(createHash('sha256').update(candidate).digest(), want);
  return (authorization, apiKey) => {
    const m = /^Bearer\s+(.+)$/i.exec(authorization ?? '');
    // Evaluate both so the answer takes the same time whichever header carried it.
    const viaBearer = matches(m ? m[1].trim() : '');
    const viaKey = matches(apiKey ?? '');
    return (m !== null && viaBearer) || (apiKey !== undefined && viaKey);
  };
}
