import { SampledText } from '../../../src/receivers/llm-proxy/token-in/answer';
import { pythonJson } from '../../../src/receivers/llm-proxy/token-in/hermes-tools';
import { READS_SPECIAL_TOKENS, REASONING_PARSERS, TOOL_CALL_PARSERS } from '../../../src/receivers/llm-proxy/token-in/parsers';
import { PrefixDigest, TokenStates, type TokenState } from '../../../src/receivers/llm-proxy/token-in/conversation';
import { completionsBody, readTokenInRequest } from '../../../src/receivers/llm-proxy/token-in/request';
import { splice } from '../../../src/receivers/llm-proxy/token-in/token-in-call';

const THINKING = '<think>\nLet me see.\n</think>\n\n';
const CALLS =
  '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4", "note": "ü"}}\n</tool_call>\n<tool_call>\n{"name":"lookup","arguments":{"q":"x"}}\n</tool_call>';

/** The message the parsers make of `text` when it arrives in pieces of `size` characters. */
function parse(text: string, size: number, prompt: number[] = [1, 2]) {
  const t = new SampledText(REASONING_PARSERS.qwen3(prompt), TOOL_CALL_PARSERS.hermes(undefined));
  const streamed = { reasoning: '', content: '', calls: [] as string[] };
  for (let i = 0; i < text.length; i += size) {
    const p = t.push(text.slice(i, i + size));
    streamed.reasoning += p.reasoning;
    streamed.content += p.content;
    streamed.calls.push(...p.calls.map((c) => `${c.name} ${c.arguments}`));
  }
  const p = t.end();
  streamed.reasoning += p.reasoning;
  streamed.content += p.content;
  streamed.calls.push(...p.calls.map((c) => `${c.name} ${c.arguments}`));
  return {
    message: t.message() as {
      content: string | null;
      reasoning_content: string | null;
      tool_calls: { id: string; function: { name: string; arguments: string } }[];
    },
    streamed,
    notes: t.notes,
  };
}

describe('token-in output parsers (qwen3 reasoning, hermes tool calls)', () => {
  it('split thinking, content and tool calls as vLLM does, whatever the pieces the text arrives in', () => {
    for (const size of [1, 2, 3, 7, 10_000]) {
      const { message, streamed } = parse(`${THINKING}${CALLS}`, size);
      expect(message.reasoning_content).toBe('\nLet me see.\n');
      // The text between </think> and the first call is the content, as vLLM gives it.
      expect(message.content).toBe('\n\n');
      expect(message.tool_calls.map((c) => [c.function.name, c.function.arguments])).toEqual([
        ['calculator', '{"expression": "3*4", "note": "ü"}'],
        ['lookup', '{"q": "x"}'],
      ]);
      expect(message.tool_calls.every((c) => /^chatcmpl-tool-[0-9a-f]{32}$/.test(c.id))).toBe(true);
      expect(streamed).toEqual({
        reasoning: '\nLet me see.\n',
        content: '\n\n',
        calls: ['calculator {"expression": "3*4", "note": "ü"}', 'lookup {"q": "x"}'],
      });
    }
  });

  it('an answer without tool calls is content; text that only looks like a tag stays text', () => {
    for (const size of [1, 4, 10_000]) {
      const { message } = parse(`${THINKING}The answer is <tool or <think> 12.`, size);
      expect(message.content).toBe('\n\nThe answer is <tool or <think> 12.');
      expect(message.tool_calls).toEqual([]);
    }
  });

  it('no <think>: all content (thinking off); cut inside <think>: all reasoning; a prompt that opened the block: reasoning until </think>', () => {
    expect(parse('Plain answer.', 3).message).toMatchObject({ content: 'Plain answer.', reasoning_content: null });
    expect(parse('<think>\nstill thinking', 2).message).toMatchObject({ content: null, reasoning_content: '\nstill thinking' });
    // Qwen3-Thinking-2507's template ends the prompt with <think>\n (151667, 198).
    expect(parse('thought\n</think>\n\nDone.', 2, [5, 151667, 198]).message).toMatchObject({ content: '\n\nDone.', reasoning_content: 'thought\n' });
  });

  it('a tool call whose JSON does not parse is given back as content, noted; an unclosed last call is read', () => {
    const bad = parse(`${THINKING}<tool_call>\n{"name": "calculator", "arguments": {oops}\n</tool_call>`, 5);
    expect(bad.message.tool_calls).toEqual([]);
    expect(bad.message.content).toBe('\n\n<tool_call>\n{"name": "calculator", "arguments": {oops}\n</tool_call>');
    expect(bad.notes).toEqual(['tool_call_unparsed']);
    const open = parse(`${THINKING}<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n`, 3);
    expect(open.message.tool_calls.map((c) => c.function.arguments)).toEqual(['{"expression": "1+1"}']);
  });

  it("writes arguments as Python's json.dumps does", () => {
    expect(pythonJson({ a: [1, { b: null }], 'c"': 'é' })).toBe('{"a": [1, {"b": null}], "c\\"": "é"}');
  });
});

describe('token-in splicing', () => {
  const req = (messages: unknown[]) => {
    const r = readTokenInRequest(Buffer.from(JSON.stringify({ model: 'm', messages })));
    if ('reason' in r) throw new Error(r.reason);
    return r;
  };
  const END = 9;
  const first = [1, END, 2, 3]; // system turn, then the generation prompt
  const sampled = [4, 5, END];
  const state = (over: Partial<TokenState> = {}): TokenState => {
    const r = req([{ role: 'user', content: 'q' }]);
    const digest = new PrefixDigest();
    digest.add(r.canonical[0]);
    digest.add(JSON.stringify(['assistant', 'a']));
    return {
      digest: digest.peek(),
      messages: 2,
      context: r.context,
      prompt: Uint32Array.from(first),
      sampled: Uint32Array.from(sampled),
      stopped: true,
      ...over,
    };
  };
  const next = req([
    { role: 'user', content: 'q' },
    // Sent back with its reasoning and untrimmed: still the same message.
    { role: 'assistant', content: 'a\n', reasoning_content: 'hm' },
    { role: 'user', content: 'q2' },
  ]);
  // The server's rendering: the past turn re-rendered differently (6 7 instead of 4 5), then the new turn.
  const rendered = [1, END, 2, 3, 6, 7, END, 8, 2, 3];

  it('continues the previous prompt and sampled ids with what follows the turn the model ended', () => {
    expect(splice(state(), next, rendered)).toEqual({ prompt: Uint32Array.from([...first, ...sampled, 8, 2, 3]), how: 'spliced' });
  });

  it('renders afresh, saying why, when it cannot continue', () => {
    expect(splice(undefined, next, rendered).how).toBe('rendered:first_call');
    expect(splice(state({ stopped: false }), next, rendered).how).toBe('rendered:previous_cut');
    expect(splice(state({ context: 'other' }), next, rendered).how).toBe('rendered:context_changed');
    const edited = req([
      { role: 'user', content: 'q!' },
      { role: 'assistant', content: 'a' },
      { role: 'user', content: 'q2' },
    ]);
    expect(splice(state(), edited, rendered).how).toBe('rendered:edited_history');
    expect(splice(state(), next, [1, END, 2, 3, 6, 7]).how).toBe('rendered:boundary_not_found');
    expect(splice(state(), next, rendered.slice(0, 7)).how).toBe('rendered:boundary_not_found');
  });

  it('keeps at most the rollouts and tokens it is given, least recently used out first', () => {
    const s = new TokenStates(2, 20);
    const st = (n: number): TokenState => ({ ...state(), prompt: new Uint32Array(n), sampled: new Uint32Array(1) });
    s.set('a', st(4));
    s.set('b', st(4));
    s.get('a');
    s.set('c', st(4));
    expect([s.get('a') !== undefined, s.get('b') !== undefined, s.get('c') !== undefined]).toEqual([true, false, true]);
    s.set('d', st(14));
    // c (5 ids) and d (15) fit the 20; a, the least recently used, went.
    expect(s.size).toBe(2);
    expect(s.heldTokens).toBe(20);
    expect(s.get('a')).toBeUndefined();
    s.set('e', st(30));
    expect(s.get('e')).toBeUndefined();
  });

  it('takes only the requests it can serve as chat would', () => {
    const reason = (body: Record<string, unknown>) => {
      const r = readTokenInRequest(Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'q' }], ...body })));
      return 'reason' in r ? r.reason : 'ok';
    };
    expect(reason({})).toBe('ok');
    expect(
      reason({
        temperature: 0.7,
        max_tokens: 5,
        stream: true,
        stream_options: { include_usage: true },
        tool_choice: 'auto',
        store: false,
        metadata: { run: 'x' },
      }),
    ).toBe('ok');
    expect(reason({ n: 2 })).toBe('n_above_1');
    expect(reason({ logprobs: true })).toBe('logprobs_requested');
    expect(reason({ tool_choice: 'required' })).toBe('tool_choice');
    expect(reason({ response_format: { type: 'json_object' } })).toBe('unsupported_field:response_format');
    expect(readTokenInRequest(Buffer.from('{not json'))).toEqual({ reason: 'not_json' });
  });
});

describe('the completions request of a token-in call', () => {
  it("keeps special tokens in the answer's text only for parsers that read them (gpt-oss's harmony)", () => {
    const r = readTokenInRequest(Buffer.from(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })));
    if ('reason' in r) throw new Error(r.reason);
    const body = (keep: boolean) => JSON.parse(completionsBody(r, Uint32Array.from([1, 2]), null, keep).toString()) as Record<string, unknown>;
    expect(body(true).skip_special_tokens).toBe(false);
    expect('skip_special_tokens' in body(false)).toBe(false);
    expect(READS_SPECIAL_TOKENS.has('openai_gptoss')).toBe(true);
    expect(READS_SPECIAL_TOKENS.has('qwen3')).toBe(false);
  });
});
