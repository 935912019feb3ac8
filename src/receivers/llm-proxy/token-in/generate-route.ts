import type { Logger } from '../../../telemetry/logger';
import { extend } from '../../../model/extend';

/**
 * Whether token-in calls go to vLLM's token-in route `/inference/v1/generate` (where newer vLLM
 * returns sampling masks and weight-version spans) or to `/v1/completions` (docs/token-in.md).
 * `auto` asks the server once, with the first token-in call: a one-token generation in text mode
 * (a server without the route answers 404; one that predates `output_mode` or has no tokenizer
 * answers without text, which the parsers need). A call the route then refuses with 404 (the
 * server was replaced) makes it ask again next time.
 */
export class GenerateRoute {
  private known: boolean | null;
  private asking: Promise<boolean> | null = null;
  private readonly log: Logger;

  constructor(
    private readonly configured: 'auto' | 'completions' | 'generate',
    logger: Logger,
  ) {
    this.known = configured === 'auto' ? null : configured === 'generate';
    this.log = logger.child('token_in');
  }

  /** Whether to use the route; `probe` asks the server (status and body of the one-token call). */
  use(probe: () => Promise<{ status: number; body: Buffer } | { error: NodeJS.ErrnoException }>): Promise<boolean> | boolean {
    if (this.known !== null) return this.known;
    this.asking ??= probe().then((answer) => {
      this.asking = null;
      const usable = 'status' in answer && answer.status === 200 && hasText(answer.body);
      // Only an answer that says what the route is decides: there (200 with text), or not there or
      // of no use (404, 405, 200 without text). A server that could not be reached, or is busy or
      // refusing for now (a 503 during a weight update, 429, 401), is asked again with the next call.
      const decides = 'status' in answer && (answer.status === 200 || answer.status === 404 || answer.status === 405);
      if (decides) {
        this.known = usable;
        this.log.info(usable ? 'token-in calls go to /inference/v1/generate' : 'token-in calls go to /v1/completions', {
          why: usable
            ? 'the server answers it with text'
            : 'status' in answer && answer.status !== 200
              ? `it answered ${answer.status}`
              : 'its answer has no text',
        });
      }
      return usable;
    });
    return this.asking;
  }

  /** The route answered a call 404: ask again with the next call (`auto`). */
  gone(): void {
    if (this.configured === 'auto') this.known = null;
  }
}

/** The one-token probe: `text` on its first choice. */
export const PROBE_BODY = (model: unknown): Buffer =>
  Buffer.from(JSON.stringify(extend(model !== undefined ? { model } : {}, { token_ids: [0], sampling_params: { max_tokens: 1 }, output_mode: 'text' })));

function hasText(body: Buffer): boolean {
  try {
    const v = JSON.parse(body.toString('utf8')) as { choices?: { text?: unknown }[] };
    return Array.isArray(v.choices) && typeof v.choices[0]?.text === 'string';
  } catch {
    return false;
  }
}
