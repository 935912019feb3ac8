import { logprobOf, pieces } from './fake-tokenizer';

export interface GeneratedChoice {
  index: number;
  content: string | null;
  toolCalls: { id: string; name: string; arguments: string }[];
  tokens: number[];
}

export interface Generation {
  /** Distinct per response, as real servers make them (frameworks key messages by it). */
  serial: number;
  model: string;
  flavor: 'vllm' | 'sglang' | 'openai';
  withIds: boolean;
  withLogprobs: boolean;
  promptIds: number[];
  choices: GeneratedChoice[];
  includeUsage: boolean;
}

export interface Built {
  body: unknown;
  /** SSE events, each complete with its blank line. */
  events: string[];
}

const CREATED = 1_760_000_000;

function usage(g: Generation) {
  const completion = g.choices.reduce((n, c) => n + c.tokens.length, 0);
  return { prompt_tokens: g.promptIds.length, completion_tokens: completion, total_tokens: g.promptIds.length + completion };
}

function lpEntry(id: number, position: number) {
  return { token: `token_id:${id}`, logprob: logprobOf(id, position), bytes: null, top_logprobs: [] };
}

function sse(value: unknown, event?: string): string {
  return `${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(value)}\n\n`;
}

/** Splits `n` tokens over `parts` chunks: one each for the first parts-1, the rest last. */
function slices(tokens: number[], parts: number): number[][] {
  const out: number[][] = [];
  let i = 0;
  for (let p = 0; p < parts - 1; p++) out.push(i < tokens.length - 1 ? [tokens[i++]] : []);
  out.push(tokens.slice(i));
  return out;
}

export function buildChat(g: Generation, stream: boolean): Built {
  const id = `chatcmpl-fake-${g.serial}`;
  const finish = (c: GeneratedChoice) => (c.toolCalls.length > 0 ? 'tool_calls' : 'stop');
  if (!stream) {
    const body: Record<string, unknown> = {
      id,
      object: 'chat.completion',
      created: CREATED,
      model: g.model,
      choices: g.choices.map((c) => {
        const choice: Record<string, unknown> = {
          index: c.index,
          message: {
            role: 'assistant',
            content: c.content,
            ...(c.toolCalls.length > 0
              ? { tool_calls: c.toolCalls.map((t) => ({ id: t.id, type: 'function', function: { name: t.name, arguments: t.arguments } })) }
              : {}),
            reasoning_content: null,
          },
          logprobs: g.withLogprobs ? { content: c.tokens.map(lpEntry) } : null,
          finish_reason: finish(c),
          stop_reason: null,
        };
        if (g.withIds) {
          choice.token_ids = c.tokens;
          if (g.flavor === 'sglang') choice.prompt_token_ids = g.promptIds;
        }
        return choice;
      }),
      usage: usage(g),
      prompt_logprobs: null,
      kv_transfer_params: null,
    };
    if (g.withIds && g.flavor === 'vllm') body.prompt_token_ids = g.promptIds;
    return { body, events: [] };
  }
  const events: string[] = [];
  const base = { id, object: 'chat.completion.chunk', created: CREATED, model: g.model };
  for (const c of g.choices) {
    const words = pieces(c.content ?? '');
    const argChunks = c.toolCalls.flatMap((t, j) => [
      { index: j, id: t.id, type: 'function', function: { name: t.name, arguments: '' } },
      { index: j, function: { arguments: t.arguments.slice(0, Math.ceil(t.arguments.length / 2)) } },
      { index: j, function: { arguments: t.arguments.slice(Math.ceil(t.arguments.length / 2)) } },
    ]);
    const deltas: Record<string, unknown>[] = [
      { role: 'assistant', content: '' },
      ...words.map((w) => ({ content: w })),
      ...argChunks.map((tc) => ({ tool_calls: [tc] })),
      {},
    ];
    const tokenParts = slices(c.tokens, deltas.length);
    let position = 0;
    deltas.forEach((delta, k) => {
      const ids = tokenParts[k];
      const last = k === deltas.length - 1;
      const choice: Record<string, unknown> = {
        index: c.index,
        delta,
        logprobs: g.withLogprobs && ids.length > 0 ? { content: ids.map((t) => lpEntry(t, position++)) } : null,
        finish_reason: last ? finish(c) : null,
      };
      if (!g.withLogprobs) position += ids.length;
      if (g.withIds && g.flavor === 'vllm') choice.token_ids = ids;
      const chunk: Record<string, unknown> = { ...base, choices: [choice] };
      if (k === 0 && c.index === 0 && g.withIds && g.flavor === 'vllm') chunk.prompt_token_ids = g.promptIds;
      events.push(sse(chunk));
    });
  }
  if (g.includeUsage) events.push(sse({ ...base, choices: [], usage: usage(g) }));
  events.push('data: [DONE]\n\n');
  return { body: null, events };
}

export function buildCompletions(g: Generation, stream: boolean): Built {
  const base = { id: `cmpl-fake-${g.serial}`, object: 'text_completion', created: CREATED, model: g.model };
  const lp = (tokens: number[], from: number) => ({
    tokens: tokens.map((t) => `token_id:${t}`),
    token_logprobs: tokens.map((t, i) => logprobOf(t, from + i)),
    top_logprobs: tokens.map(() => null),
    text_offset: tokens.map(() => 0),
  });
  const ids = (c: GeneratedChoice, tokens: number[], first: boolean) =>
    g.withIds ? { token_ids: tokens, ...(first ? { prompt_token_ids: g.promptIds } : {}) } : {};
  if (!stream) {
    return {
      body: {
        ...base,
        choices: g.choices.map((c) => ({
          index: c.index,
          text: c.content ?? '',
          logprobs: g.withLogprobs ? lp(c.tokens, 0) : null,
          finish_reason: 'stop',
          stop_reason: null,
          ...ids(c, c.tokens, true),
        })),
        usage: usage(g),
      },
      events: [],
    };
  }
  const events: string[] = [];
  for (const c of g.choices) {
    const words = pieces(c.content ?? '');
    const parts = slices(c.tokens, words.length + 1);
    let from = 0;
    [...words, ''].forEach((w, k) => {
      const last = k === words.length;
      events.push(
        sse({
          ...base,
          choices: [
            {
              index: c.index,
              text: w,
              logprobs: g.withLogprobs ? lp(parts[k], from) : null,
              finish_reason: last ? 'stop' : null,
              ...ids(c, parts[k], k === 0),
            },
          ],
        }),
      );
      from += parts[k].length;
    });
  }
  if (g.includeUsage) events.push(sse({ ...base, choices: [], usage: usage(g) }));
  events.push('data: [DONE]\n\n');
  return { body: null, events };
}

export function buildResponses(g: Generation, stream: boolean): Built {
  const c = g.choices[0];
  const u = usage(g);
  const msgItem = c.content
    ? {
        type: 'message',
        id: `msg_fake_${g.serial}`,
        status: 'completed',
        role: 'assistant',
        content: [{ type: 'output_text', text: c.content, annotations: [], ...(g.withLogprobs ? { logprobs: c.tokens.map(lpEntry) } : {}) }],
      }
    : null;
  const fnItems = c.toolCalls.map((t, j) => ({
    type: 'function_call',
    id: `fc_fake_${j}`,
    call_id: t.id,
    name: t.name,
    arguments: t.arguments,
    status: 'completed',
  }));
  const output = [...(msgItem ? [msgItem] : []), ...fnItems];
  const response = (status: string, out: unknown[]) => ({
    id: `resp_fake_${g.serial}`,
    object: 'response',
    created_at: CREATED,
    status,
    model: g.model,
    output: out,
    parallel_tool_calls: true,
    tool_choice: 'auto',
    tools: [],
    usage:
      status === 'completed'
        ? {
            input_tokens: u.prompt_tokens,
            output_tokens: u.completion_tokens,
            total_tokens: u.total_tokens,
            input_tokens_details: { cached_tokens: 0 },
            output_tokens_details: { reasoning_tokens: 0 },
          }
        : null,
    error: null,
    incomplete_details: null,
  });
  if (!stream) return { body: response('completed', output), events: [] };
  let seq = 0;
  const events: string[] = [];
  const emit = (type: string, rest: Record<string, unknown>) => events.push(sse({ type, sequence_number: seq++, ...rest }, type));
  emit('response.created', { response: response('in_progress', []) });
  emit('response.in_progress', { response: response('in_progress', []) });
  let outputIndex = 0;
  if (msgItem) {
    emit('response.output_item.added', { output_index: outputIndex, item: { ...msgItem, status: 'in_progress', content: [] } });
    emit('response.content_part.added', {
      item_id: msgItem.id,
      output_index: outputIndex,
      content_index: 0,
      part: { type: 'output_text', text: '', annotations: [] },
    });
    for (const w of pieces(c.content ?? '')) {
      emit('response.output_text.delta', { item_id: msgItem.id, output_index: outputIndex, content_index: 0, delta: w, logprobs: [] });
    }
    emit('response.output_text.done', { item_id: msgItem.id, output_index: outputIndex, content_index: 0, text: c.content, logprobs: [] });
    emit('response.content_part.done', { item_id: msgItem.id, output_index: outputIndex, content_index: 0, part: msgItem.content[0] });
    emit('response.output_item.done', { output_index: outputIndex, item: msgItem });
    outputIndex++;
  }
  for (const item of fnItems) {
    emit('response.output_item.added', { output_index: outputIndex, item: { ...item, arguments: '', status: 'in_progress' } });
    emit('response.function_call_arguments.delta', { item_id: item.id, output_index: outputIndex, delta: item.arguments });
    emit('response.function_call_arguments.done', { item_id: item.id, output_index: outputIndex, arguments: item.arguments });
    emit('response.output_item.done', { output_index: outputIndex, item });
    outputIndex++;
  }
  emit('response.completed', { response: response('completed', output) });
  return { body: null, events };
}

export function buildAnthropic(g: Generation, stream: boolean): Built {
  const c = g.choices[0];
  const u = usage(g);
  const blocks: Record<string, unknown>[] = [];
  if (c.content) blocks.push({ type: 'text', text: c.content });
  for (const t of c.toolCalls) blocks.push({ type: 'tool_use', id: t.id.replace(/^call_/, 'toolu_'), name: t.name, input: JSON.parse(t.arguments) });
  const stop = c.toolCalls.length > 0 ? 'tool_use' : 'end_turn';
  const message = (content: unknown[], stopReason: string | null, outputTokens: number) => ({
    id: `msg_fake_${g.serial}`,
    type: 'message',
    role: 'assistant',
    model: g.model,
    content,
    stop_reason: stopReason,
    stop_sequence: null,
    usage: { input_tokens: u.prompt_tokens, output_tokens: outputTokens },
  });
  if (!stream) return { body: message(blocks, stop, u.completion_tokens), events: [] };
  const events: string[] = [];
  const emit = (type: string, rest: Record<string, unknown>) => events.push(sse({ type, ...rest }, type));
  emit('message_start', { message: message([], null, 1) });
  blocks.forEach((block, index) => {
    if (block.type === 'text') {
      emit('content_block_start', { index, content_block: { type: 'text', text: '' } });
      if (index === 0) emit('ping', {});
      for (const w of pieces(block.text as string)) emit('content_block_delta', { index, delta: { type: 'text_delta', text: w } });
    } else {
      emit('content_block_start', { index, content_block: { ...block, input: {} } });
      const json = JSON.stringify(block.input);
      const half = Math.ceil(json.length / 2);
      emit('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: json.slice(0, half) } });
      emit('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: json.slice(half) } });
    }
    emit('content_block_stop', { index });
  });
  emit('message_delta', { delta: { stop_reason: stop, stop_sequence: null }, usage: { output_tokens: u.completion_tokens } });
  emit('message_stop', {});
  return { body: null, events };
}
