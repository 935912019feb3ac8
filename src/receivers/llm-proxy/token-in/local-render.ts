import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { TokenizerLoader } from '@lenml/tokenizers';
import { extend } from '../../../model/extend';

/**
 * Renders a chat conversation into token ids in the sidecar, from the model's own tokenizer files
 * (the `tokenizer.json` and `tokenizer_config.json` vLLM loads, mounted from the same volume), so
 * token-in needs no `/tokenize` round trip per call (docs/token-in.md#local-rendering). The chat
 * template runs in `@huggingface/jinja` with what vLLM and `transformers` give it: the messages,
 * the tools, `add_generation_prompt`, the special tokens by name and the request's
 * `chat_template_kwargs`; the text is tokenized with `@lenml/tokenizers` (a port of the `tokenizers`
 * library's pipeline that reads `tokenizer.json` as it is), special tokens taken as written.
 */
export interface LocalRenderer {
  /** The tokenizer folder, for logs. */
  readonly dir: string;
  /** The conversation as the template writes it. */
  renderText(messages: readonly unknown[], tools: readonly unknown[] | undefined, kwargs: Record<string, unknown> | undefined): string;
  /** Ids of a text (special tokens in it taken as the tokens they name; no BOS added). */
  encode(text: string): number[];
  /** The text of a special (added) token id, or null for any other id. */
  specialText(id: number): string | null;
}

/** What is wrong with a tokenizer folder, for the start-up error. */
export class TokenizerFilesError extends Error {}

/** Loads the renderer from a folder holding `tokenizer.json` and `tokenizer_config.json` (its chat template, or `chat_template.jinja` beside it). */
export function loadLocalRenderer(dir: string): LocalRenderer {
  const read = (name: string): string => {
    const file = path.join(dir, name);
    if (!existsSync(file)) throw new TokenizerFilesError(`${file} does not exist (the model's tokenizer files, as vLLM loads them)`);
    return readFileSync(file, 'utf8');
  };
  const json = (name: string): Record<string, unknown> => {
    try {
      return JSON.parse(read(name)) as Record<string, unknown>;
    } catch (err) {
      if (err instanceof TokenizerFilesError) throw err;
      throw new TokenizerFilesError(`${path.join(dir, name)} is not JSON: ${(err as Error).message}`);
    }
  };
  const tokenizerJSON = json('tokenizer.json');
  const tokenizerConfig = json('tokenizer_config.json');
  const template = new Template(chatTemplate(dir, tokenizerConfig, read));
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  // The special tokens a template may name (`bos_token`, `eos_token`, …), as strings.
  const named: Record<string, string> = {};
  for (const key of ['bos_token', 'eos_token', 'unk_token', 'pad_token', 'sep_token', 'cls_token', 'mask_token']) {
    const v = tokenizerConfig[key];
    const text =
      typeof v === 'string'
        ? v
        : typeof v === 'object' && v !== null && typeof (v as { content?: unknown }).content === 'string'
          ? (v as { content: string }).content
          : null;
    if (text !== null) named[key] = text;
  }
  const special = new Map<number, string>();
  for (const a of (tokenizerJSON.added_tokens as { id: number; content: string; special?: boolean }[] | undefined) ?? [])
    if (a.special !== false) special.set(a.id, a.content);
  return {
    dir,
    renderText(messages, tools, kwargs) {
      return template.render(
        extend(extend(named, kwargs ?? {}), {
          messages: messages.map(asTemplateMessage),
          tools: tools && tools.length > 0 ? tools.map(asTemplateTool) : undefined,
          add_generation_prompt: true,
        }),
      );
    },
    encode: (text) => tok.encode(text, { add_special_tokens: false }),
    specialText: (id) => special.get(id) ?? null,
  };
}

/** The template: `tokenizer_config.json`'s `chat_template` (a string, or the one named `default` of a list), else `chat_template.jinja`. */
function chatTemplate(dir: string, config: Record<string, unknown>, read: (name: string) => string): string {
  const t = config.chat_template;
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) {
    const named = (t as { name?: unknown; template?: unknown }[]).find((x) => x.name === 'default') ?? t[0];
    if (typeof named?.template === 'string') return named.template;
  }
  if (existsSync(path.join(dir, 'chat_template.jinja'))) return read('chat_template.jinja');
  throw new TokenizerFilesError(`${path.join(dir, 'tokenizer_config.json')} has no chat_template, and there is no chat_template.jinja beside it`);
}

/**
 * A message as vLLM's chat route hands it to the template: a content of text parts becomes their
 * text joined by newlines, a null or missing content an empty string; the reasoning the template
 * reads (`reasoning_content`) is the message's `reasoning` (vLLM reads that name only, and drops a
 * `reasoning_content` the client sent); tool calls' `arguments` strings are parsed into objects
 * (the template writes them back with `tojson`; a string that is not a JSON object becomes `{}`),
 * and an empty `tool_calls` is dropped.
 */
function asTemplateMessage(m: unknown): unknown {
  if (typeof m !== 'object' || m === null) return m;
  const msg = m as Record<string, unknown>;
  const { reasoning_content: _dropped, ...out } = msg;
  if (Array.isArray(msg.content))
    out.content = (msg.content as unknown[])
      .filter((p): p is { type: string; text: string } => typeof p === 'object' && p !== null && (p as { type?: unknown }).type === 'text')
      .map((p) => p.text)
      .join('\n');
  else if (msg.content === null || msg.content === undefined) out.content = '';
  if (typeof msg.reasoning === 'string') out.reasoning_content = msg.reasoning;
  if (Array.isArray(msg.tool_calls)) {
    if (msg.tool_calls.length === 0) delete out.tool_calls;
    else out.tool_calls = msg.tool_calls.map(withParsedArguments);
  }
  return out;
}

function withParsedArguments(call: unknown): unknown {
  if (typeof call !== 'object' || call === null) return call;
  const c = call as { function?: { arguments?: unknown } };
  if (typeof c.function !== 'object' || c.function === null || typeof c.function.arguments !== 'string') return call;
  let args: unknown;
  try {
    args = JSON.parse(c.function.arguments);
  } catch {
    args = {};
  }
  return extend(c, { function: extend(c.function, { arguments: typeof args === 'object' && args !== null && !Array.isArray(args) ? args : {} }) });
}

/** A tool as vLLM hands it to the template: its function's `name`, `description` and `parameters` first, null when missing. */
function asTemplateTool(t: unknown): unknown {
  if (typeof t !== 'object' || t === null) return t;
  const tool = t as { function?: Record<string, unknown> };
  if (typeof tool.function !== 'object' || tool.function === null) return t;
  const f = tool.function;
  return extend(tool, { function: { name: f.name ?? null, description: f.description ?? null, parameters: f.parameters ?? null, ...f } });
}
