import type { Logger } from '../../../telemetry/logger';
import type { Metrics } from '../../../telemetry/metrics';
import type { TokenState } from './conversation';
import type { LocalRenderer } from './local-render';
import type { TokenInRequest } from './request';

/**
 * Token-in's local rendering (docs/token-in.md#local-rendering): a spliced call's new ids come from
 * the sidecar's own rendering of the conversation, not from `/tokenize`. It keeps itself honest:
 * every call that does not continue its rollout (a rollout's first), and a share of those that do
 * (`verify_fraction`), is rendered by the server too and compared id by id; the first mismatch of a model is counted, logged once with the
 * first differing position, and that model goes back to the server's rendering until restart.
 */
export class LocalRendering {
  /** Models whose rendering differed from the server's: served by the server's rendering from then on. */
  private readonly off = new Set<string>();
  /** `max_model_len` as the server's `/tokenize` last said it, by model. */
  private readonly maxLen = new Map<string, number>();
  private readonly log: Logger;

  constructor(
    private readonly renderer: LocalRenderer,
    private readonly verifyFraction: number,
    private readonly metrics: Metrics,
    logger: Logger,
    private readonly random: () => number = Math.random,
  ) {
    this.log = logger.child('token_in');
  }

  /**
   * The prompt of a call that continues `state` (the checks of `splice` passed), rendered here:
   * the previous prompt and sampled ids, then the ids the sidecar renders for what follows the turn
   * the model ended. Null when this call is to be rendered by the server: a model that fell back,
   * a call picked to be checked, a template that errs, or no boundary.
   */
  continued(state: TokenState, r: TokenInRequest): { prompt: Uint32Array; maxModelLen: number | null } | null {
    const model = modelOf(r);
    if (this.off.has(model) || this.random() < this.verifyFraction) return null;
    let tail: number[] | null;
    try {
      tail = this.tail(state, r);
    } catch {
      return null;
    }
    if (tail === null || tail.length === 0) return null;
    const prompt = new Uint32Array(state.prompt.length + state.sampled.length + tail.length);
    prompt.set(state.prompt, 0);
    prompt.set(state.sampled, state.prompt.length);
    prompt.set(tail, state.prompt.length + state.sampled.length);
    this.metrics.tokenInRendering.inc({ by: 'sidecar' });
    return { prompt, maxModelLen: this.maxLen.get(model) ?? null };
  }

  /**
   * The server rendered this call (`server`: its ids): remembers its `max_model_len`, and compares
   * the sidecar's own rendering with it, unless the model fell back already: the whole of it for a
   * call that starts its rollout, and for one that continues (`state`) the part the sidecar would
   * have rendered, the ids after the turn the model ended (the rest is the rollout's own ids).
   */
  serverRendered(r: TokenInRequest, server: readonly number[], maxModelLen: number | null, state: TokenState | null): void {
    const model = modelOf(r);
    if (maxModelLen !== null) remember(this.maxLen, model, maxModelLen);
    this.metrics.tokenInRendering.inc({ by: 'server' });
    if (this.off.has(model)) return;
    let theirs: readonly number[] = server;
    let ours: number[] | null = null;
    let error: string | null = null;
    try {
      if (state === null) ours = this.renderer.encode(this.render(r));
      else {
        const at = boundary(server, state);
        ours = this.tail(state, r);
        if (at < 0 || ours === null) error = `the end of the turn the model ended is not found in the ${at < 0 ? "server's" : "sidecar's"} rendering`;
        else theirs = server.slice(at);
      }
    } catch (err) {
      error = (err as Error).message;
    }
    const at = error === null ? firstDifference(ours!, theirs) : 0;
    this.metrics.tokenInRenderChecks.inc({ result: at < 0 ? 'match' : 'mismatch' });
    if (at < 0) return;
    if (this.off.size >= MAX_MODELS) this.off.delete(this.off.values().next().value!);
    this.off.add(model);
    // Positions are counted in the ids compared: the whole rendering, or what follows the model's turn.
    this.log.warn(
      "the sidecar's rendering of a conversation differs from the model server's: this model's token-in calls are rendered by the server from now on",
      {
        model,
        tokenizer_dir: this.renderer.dir,
        compared: state === null ? 'whole conversation' : "after the model's last turn",
        ...(error !== null
          ? { error }
          : { first_difference: at, server_ids: theirs.slice(Math.max(0, at - 2), at + 3), sidecar_ids: ours!.slice(Math.max(0, at - 2), at + 3) }),
      },
    );
  }

  /**
   * The ids of the rendering's text after the turn the model ended: after the (n+1)-th end-of-turn
   * token, n being how many the previous prompt holds (the tokenizer splits at special tokens, so
   * they are the tail of the whole rendering's ids). Null when that token has no text or is not there.
   */
  private tail(state: TokenState, r: TokenInRequest): number[] | null {
    const end = state.sampled[state.sampled.length - 1];
    const endText = this.renderer.specialText(end);
    if (endText === null) return null;
    const text = this.render(r);
    let n = 0;
    for (const t of state.prompt) if (t === end) n++;
    let at = -1;
    for (let seen = 0; seen <= n; seen++) {
      at = text.indexOf(endText, at + 1);
      if (at < 0) return null;
    }
    return this.renderer.encode(text.slice(at + endText.length));
  }

  private render(r: TokenInRequest): string {
    const c = r.chat;
    return this.renderer.renderText(r.messages, Array.isArray(c.tools) ? c.tools : undefined, c.chat_template_kwargs as Record<string, unknown> | undefined);
  }
}

/** Where the ids after the turn the model ended begin in a rendering, or -1 (as `splice` finds it). */
function boundary(ids: readonly number[], state: TokenState): number {
  const end = state.sampled[state.sampled.length - 1];
  let n = 0;
  for (const t of state.prompt) if (t === end) n++;
  for (let i = 0, seen = 0; i < ids.length; i++) if (ids[i] === end && ++seen === n + 1) return i + 1;
  return -1;
}

/** The first position where two id lists differ (the shorter one's length when one is the other's start), or -1 when equal. */
function firstDifference(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

/** Sets a model's fact, the map bounded (the names come from agents): the oldest forgotten first. */
function remember<V>(map: Map<string, V>, model: string, value: V): void {
  if (!map.has(model) && map.size >= MAX_MODELS) map.delete(map.keys().next().value!);
  map.set(model, value);
}

/** Models whose facts are remembered. */
const MAX_MODELS = 256;

function modelOf(r: TokenInRequest): string {
  return typeof r.chat.model === 'string' ? r.chat.model : '';
}
