import { LimitedWarnings, type Logger } from '../../telemetry/logger';

/**
 * Hints for the commonest set-up mistake: a `/v1` missing from a base URL. The proxy maps `/v1/x`
 * to `{upstream_url}/x` and passes any other path to the server's origin as it is, so either
 *  (a) `upstream_url` lacks `/v1` (`http://vllm:8000`): the agent calls `/v1/chat/completions`
 *      and the server is asked for `/chat/completions`; or
 *  (b) the agent's base URL lacks it (`OPENAI_BASE_URL=http://127.0.0.1:4000`): the agent calls
 *      `/chat/completions` (or `/rollout/<id>/chat/completions`), which goes to the server as it is.
 * Both end in the server's 404, which the agent gets unchanged; the sidecar says which fix applies.
 */

/** The API paths an OpenAI-style client calls below its base URL. */
const API_TAIL = /\/(chat\/completions|completions|responses|messages|models|embeddings)\/?$/;

export interface PathHint {
  kind: 'upstream_url' | 'agent_base_url';
  message: string;
  fields: Record<string, string>;
}

/** Upstream paths keep `/v1` in the configured URL (`http://vllm:8000/v1`). */
function endsInV1(basePath: string): boolean {
  return /\/v1$/.test(basePath);
}

/**
 * What a 404 from the model server says about a missing `/v1`, from the path the agent used (after
 * any rollout prefix was taken off; one that was not recognised stays) and the configured upstream
 * path; null when the 404 is not about that (e.g. an unknown model, answered 404 by vLLM).
 */
export function missingV1Hint(agentPath: string, basePath: string, status: number, proxyEndpoint: string): PathHint | null {
  if (status !== 404) return null;
  const q = agentPath.indexOf('?');
  const bare = q < 0 ? agentPath : agentPath.slice(0, q);
  const tail = API_TAIL.exec(bare)?.[0];
  if (bare === '/v1' || bare.startsWith('/v1/')) {
    if (endsInV1(basePath)) return null;
    const asked = `${basePath}${bare.slice(3)}`;
    return {
      kind: 'upstream_url',
      message:
        `the model server answered 404 to ${asked}: receivers.llm_proxy.upstream_url (LIGHTNING_UPSTREAM_URL) should probably end in /v1, ` +
        `e.g. http://vllm:8000/v1 (its path is '${basePath || '/'}'; the proxy sends /v1/x to {upstream_url}/x). The agent got the server's answer unchanged`,
      fields: { upstream_path: asked },
    };
  }
  if (tail === undefined) return null;
  const rollout = /^\/(?:proxy\/)?rollout\//.test(bare);
  const example = rollout
    ? `http://${proxyEndpoint}/rollout/<id>/v1`
    : `http://${proxyEndpoint}/v1 (or http://${proxyEndpoint}/rollout/<id>/v1 to name the rollout)`;
  const alsoUpstream = endsInV1(basePath) ? '' : '; receivers.llm_proxy.upstream_url (LIGHTNING_UPSTREAM_URL) should end in /v1 too';
  return {
    kind: 'agent_base_url',
    message:
      `the model server answered 404 to an agent's ${tail} called without /v1: the agent's OPENAI_BASE_URL (its client's base URL) should end in /v1, ` +
      `e.g. ${example}${alsoUpstream}. The agent got the server's answer unchanged`,
    fields: { agent_path: rollout ? `/rollout/<id>${tail}` : tail },
  };
}

/** The start-time warning for an `upstream_url` without a path (not an error: some servers are mounted at their root). */
export function upstreamPathWarning(basePath: string): string | null {
  if (basePath !== '') return null;
  return (
    'receivers.llm_proxy.upstream_url (LIGHTNING_UPSTREAM_URL) has no path: /v1/x on the proxy goes to /x on the model server, which vLLM and SGLang answer 404; ' +
    'it should end in /v1 (e.g. http://vllm:8000/v1) unless the server serves its API at its root'
  );
}

/** At most one warning per kind every `everyMs`, with how many were held back since the last. */
export class HintLog {
  private readonly limited: LimitedWarnings;

  constructor(log: Logger, now: () => number = Date.now, everyMs = 60_000) {
    this.limited = new LimitedWarnings(log, everyMs, now);
  }

  warn(hint: PathHint): void {
    this.limited.warn(hint.kind, hint.message, hint.fields);
  }
}
