import { createHash, type Hash } from 'node:crypto';

/**
 * What token-in remembers of a rollout's last call, and how the next call is matched against it.
 *
 * A call continues the last one when its messages begin with the last call's messages plus the
 * assistant message the sidecar returned, compared as a framework sends them back: reasoning
 * fields are ignored (most frameworks drop `reasoning_content`), content is compared trimmed with
 * `null`, `""` and whitespace alike (vLLM returns `"\n\n"` beside tool calls), text parts are
 * joined, and tool-call arguments are compared as parsed JSON with sorted keys (frameworks
 * re-serialize them). Only a digest of that prefix is kept, not the messages.
 */

/** A message as compared: role, content, tool calls (name, arguments), the tool call a tool result answers. */
export function canonicalMessage(m: unknown): string {
  if (!m || typeof m !== 'object') return JSON.stringify(m);
  const msg = m as Record<string, unknown>;
  const out: unknown[] = [msg.role, contentText(msg.content)];
  if (Array.isArray(msg.tool_calls) && msg.tool_calls.length > 0) {
    out.push(
      msg.tool_calls.map((c) => {
        const f = (c as { function?: { name?: unknown; arguments?: unknown } }).function ?? {};
        return [f.name, canonicalJson(parseMaybe(f.arguments))];
      }),
    );
  }
  if (typeof msg.tool_call_id === 'string') out.push(msg.tool_call_id);
  if (typeof msg.name === 'string') out.push(msg.name);
  return JSON.stringify(out);
}

function contentText(content: unknown): string {
  if (typeof content === 'string') return content.trim();
  if (Array.isArray(content))
    return content
      .map((p) => (p && typeof p === 'object' && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : JSON.stringify(p)))
      .join('')
      .trim();
  return content === null || content === undefined ? '' : JSON.stringify(content);
}

function parseMaybe(v: unknown): unknown {
  if (typeof v !== 'string') return v;
  try {
    return JSON.parse(v);
  } catch {
    return v;
  }
}

/** JSON with object keys sorted, so two serializations of one value compare equal. */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  const o = v as Record<string, unknown>;
  return `{${Object.keys(o)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`)
    .join(',')}}`;
}

/** Digest of a conversation prefix, built message by message. */
export class PrefixDigest {
  private readonly hash: Hash = createHash('sha256');
  private n = 0;

  add(canonical: string): void {
    this.hash.update(`${canonical.length}:${canonical}`);
    this.n++;
  }

  get count(): number {
    return this.n;
  }

  /** The digest so far (the digest can still grow). */
  peek(): string {
    return this.hash.copy().digest('base64');
  }
}

/** What a rollout's last token-in call left. */
export interface TokenState {
  /** Digest of its messages plus the assistant message returned, and their count. */
  digest: string;
  messages: number;
  /** Digest of what else shapes the rendering (tools, template arguments, model). */
  context: string;
  /** The prompt it sent and the ids the model sampled (ending with the end-of-turn token when it stopped). */
  prompt: Uint32Array;
  sampled: Uint32Array;
  /** It stopped on its own (not cut by max_tokens): its last sampled id ends a turn. */
  stopped: boolean;
}

/**
 * The last call of each rollout attempt, least recently used first out: at most `maxRollouts`
 * entries and `maxTokens` token ids held (4 bytes each). A rollout pushed out renders its next
 * call afresh (a new trajectory segment), which its transition says.
 */
export class TokenStates {
  private readonly states = new Map<string, TokenState>();
  private tokens = 0;

  constructor(
    private readonly maxRollouts: number,
    private readonly maxTokens: number,
  ) {}

  get size(): number {
    return this.states.size;
  }

  get heldTokens(): number {
    return this.tokens;
  }

  get(key: string): TokenState | undefined {
    const s = this.states.get(key);
    if (s) {
      this.states.delete(key);
      this.states.set(key, s);
    }
    return s;
  }

  set(key: string, s: TokenState): void {
    this.delete(key);
    const size = s.prompt.length + s.sampled.length;
    if (size > this.maxTokens) return;
    this.states.set(key, s);
    this.tokens += size;
    while (this.states.size > this.maxRollouts || this.tokens > this.maxTokens) {
      const [oldest] = this.states.keys();
      this.delete(oldest);
    }
  }

  delete(key: string): void {
    const s = this.states.get(key);
    if (!s) return;
    this.states.delete(key);
    this.tokens -= s.prompt.length + s.sampled.length;
  }
}
