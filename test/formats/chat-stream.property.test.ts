import fc from 'fast-check';
import { assembleChatStream, extractChat } from '../../src/formats/adapters/chat-completions';
import { intArray, type Extracted } from '../../src/formats/adapters/shape';
import { appendTo, intList, isObject, type Json } from '../../src/formats/json';
import type { TokenIds } from '../../src/model/records';

/*
 * The assembly of a streamed chat answer reads each chunk's members by key (no entry pairs): the
 * record must stay what the first implementation, kept here as the reference, made of any chunks
 * (repeated and late members, nulls, odd types, `__proto__` members as `JSON.parse` makes them).
 */

interface ChoiceAcc {
  index: number;
  message: Json;
  toolCalls: Map<number, Json>;
  finishReason: unknown;
  logprobs: unknown[] | null;
  tokenIds: number[] | null;
  promptTokenIds: TokenIds | null;
  extra: Json;
}

function referenceAssemble(chunks: unknown[], done: boolean): Extracted {
  const accs = new Map<number, ChoiceAcc>();
  const top: Json = {};
  let usage: unknown = null;
  let promptTokenIds: TokenIds | null = null;
  for (const chunk of chunks) {
    if (!isObject(chunk)) continue;
    for (const [k, v] of Object.entries(chunk)) {
      if (k === 'choices' || k === 'usage' || k === 'prompt_token_ids') continue;
      if (!(k in top)) top[k] = v;
    }
    if (chunk.usage !== undefined && chunk.usage !== null) usage = chunk.usage;
    if (promptTokenIds === null) promptTokenIds = intArray(chunk.prompt_token_ids);
    if (!Array.isArray(chunk.choices)) continue;
    for (const c of chunk.choices) {
      if (!isObject(c)) continue;
      const index = typeof c.index === 'number' ? c.index : 0;
      let acc = accs.get(index);
      if (!acc) {
        acc = { index, message: {}, toolCalls: new Map(), finishReason: null, logprobs: null, tokenIds: null, promptTokenIds: null, extra: {} };
        accs.set(index, acc);
      }
      referenceMerge(acc, c);
    }
  }
  const ordered = [...accs.values()].sort((a, b) => a.index - b.index);
  const response: Json = {
    ...top,
    object: 'chat.completion',
    choices: ordered.map((a) => {
      const message: Json = { ...a.message };
      if (a.toolCalls.size > 0) message.tool_calls = [...a.toolCalls.entries()].sort((x, y) => x[0] - y[0]).map((e) => e[1]);
      const out: Json = { index: a.index, message, finish_reason: a.finishReason, ...a.extra };
      if (a.logprobs !== null) out.logprobs = { content: a.logprobs };
      if (a.tokenIds !== null) out.token_ids = a.tokenIds;
      if (a.promptTokenIds !== null) out.prompt_token_ids = a.promptTokenIds;
      return out;
    }),
    usage,
  };
  if (promptTokenIds !== null) response.prompt_token_ids = promptTokenIds;
  const extracted = extractChat(response);
  extracted.incomplete = !done && ordered.every((a) => a.finishReason === null);
  return extracted;
}

const MERGED_MEMBERS = new Set(['index', 'delta', 'finish_reason', 'token_ids', 'prompt_token_ids', 'logprobs']);

function referenceMerge(acc: ChoiceAcc, c: Json): void {
  if (c.finish_reason !== undefined && c.finish_reason !== null) acc.finishReason = c.finish_reason;
  const ids = intList(c.token_ids);
  if (ids) appendTo((acc.tokenIds ??= []), ids);
  const pids = intArray(c.prompt_token_ids);
  if (pids && acc.promptTokenIds === null) acc.promptTokenIds = pids;
  if (isObject(c.logprobs) && Array.isArray(c.logprobs.content)) appendTo((acc.logprobs ??= []), c.logprobs.content);
  for (const [k, v] of Object.entries(c)) {
    if (MERGED_MEMBERS.has(k)) continue;
    if (v !== null && v !== undefined) acc.extra[k] = v;
  }
  const delta = isObject(c.delta) ? c.delta : {};
  for (const [k, v] of Object.entries(delta)) {
    if (k === 'tool_calls') {
      if (Array.isArray(v)) for (const tc of v) if (isObject(tc)) referenceToolCall(acc.toolCalls, tc);
    } else if (typeof v === 'string' && typeof acc.message[k] === 'string' && k !== 'role') {
      acc.message[k] = acc.message[k] + v;
    } else if (v !== null || !(k in acc.message)) {
      acc.message[k] = v;
    }
  }
}

function referenceToolCall(calls: Map<number, Json>, tc: Json): void {
  const index = typeof tc.index === 'number' ? tc.index : calls.size;
  const cur = calls.get(index) ?? { id: null, type: 'function', function: { name: '', arguments: '' } };
  if (typeof tc.id === 'string' && tc.id) cur.id = tc.id;
  if (typeof tc.type === 'string') cur.type = tc.type;
  const fn = isObject(tc.function) ? tc.function : {};
  const curFn = cur.function as Json;
  if (typeof fn.name === 'string') curFn.name = (curFn.name as string) + fn.name;
  if (typeof fn.arguments === 'string') curFn.arguments = (curFn.arguments as string) + fn.arguments;
  calls.set(index, cur);
}

/** `PROTO` keys become `__proto__` members once the chunk goes through JSON text, as a server's would. */
const scalar = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.integer({ min: -3, max: 5 }),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
  fc.constantFrom('', 'a', ' b', 'assistant'),
);
const anyValue = fc.oneof(scalar, fc.array(scalar, { maxLength: 3 }), fc.dictionary(fc.constantFrom('x', 'content', 'PROTO'), scalar, { maxKeys: 2 }));
const opt = <T>(a: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> => fc.option(a, { nil: undefined });
const toolCall = fc.record(
  {
    index: opt(fc.oneof(fc.integer({ min: 0, max: 2 }), fc.constant('0'))),
    id: opt(fc.constantFrom('', 'call_1', 'call_2')),
    type: opt(fc.constantFrom('function', 7)),
    function: opt(fc.oneof(fc.record({ name: opt(fc.constantFrom('f', 'g')), arguments: opt(fc.constantFrom('{"a"', ':1}', 3)) }), scalar)),
  },
  { requiredKeys: [] },
);
const delta = fc.oneof(
  fc.record(
    {
      role: opt(fc.constantFrom('assistant', null)),
      content: opt(fc.oneof(fc.constantFrom('w', ' w1', '', null), fc.integer())),
      reasoning_content: opt(fc.constantFrom('r', null)),
      tool_calls: opt(fc.oneof(fc.array(fc.oneof(toolCall, scalar), { maxLength: 2 }), scalar)),
      PROTO: opt(anyValue),
      extra: opt(anyValue),
    },
    { requiredKeys: [] },
  ),
  scalar,
);
const logprobs = fc.oneof(
  scalar,
  fc.record(
    {
      content: fc.oneof(
        fc.array(
          fc.record({
            token: fc.constantFrom('w', 'x'),
            logprob: fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), scalar),
            bytes: fc.constant(null),
            top_logprobs: fc.constant([]),
          }),
          { maxLength: 2 },
        ),
        scalar,
      ),
    },
    { requiredKeys: [] },
  ),
);
const ids = fc.oneof(fc.array(fc.integer({ min: 0, max: 50000 }), { maxLength: 3 }), fc.array(scalar, { maxLength: 2 }), scalar);
const choice = fc.oneof(
  fc.record(
    {
      index: opt(fc.oneof(fc.integer({ min: 0, max: 2 }), fc.constant('1'))),
      delta: opt(delta),
      logprobs: opt(logprobs),
      finish_reason: opt(fc.constantFrom(null, 'stop', 'length', 3)),
      token_ids: opt(ids),
      prompt_token_ids: opt(ids),
      stop_reason: opt(anyValue),
      PROTO: opt(anyValue),
      matched_stop: opt(anyValue),
    },
    { requiredKeys: [] },
  ),
  scalar,
);
const chunk = fc.oneof(
  {
    weight: 8,
    arbitrary: fc.record(
      {
        id: opt(fc.constantFrom('c1', 'c2')),
        object: opt(fc.constantFrom('chat.completion.chunk', 5)),
        created: opt(fc.integer({ min: 0, max: 9 })),
        model: opt(fc.constantFrom('m', null)),
        choices: opt(fc.oneof(fc.array(choice, { maxLength: 3 }), scalar)),
        usage: opt(anyValue),
        prompt_token_ids: opt(ids),
        PROTO: opt(anyValue),
        system_fingerprint: opt(anyValue),
      },
      { requiredKeys: [] },
    ),
  },
  { weight: 1, arbitrary: anyValue },
);
const chunks = fc
  .array(chunk, { maxLength: 8 })
  .map((cs) => cs.map((c) => JSON.parse(JSON.stringify(c ?? null).replaceAll('"PROTO"', '"__proto__"')) as unknown));

describe('assembling a streamed chat answer', () => {
  it('makes the same record as the implementation that read entries', () => {
    fc.assert(
      fc.property(chunks, fc.boolean(), (cs, done) => {
        const got = assembleChatStream(cs, done);
        const want = referenceAssemble(cs, done);
        expect(got).toStrictEqual(want);
        expect(JSON.stringify(got)).toBe(JSON.stringify(want));
        expect(Object.getPrototypeOf(got.response)).toBe(Object.getPrototypeOf(want.response));
      }),
      { numRuns: 3000 },
    );
  });
});
