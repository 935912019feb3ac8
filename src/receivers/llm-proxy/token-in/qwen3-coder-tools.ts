import { holdPartial, type ToolCallOut, type ToolStream } from './parser-kit';
import { literalEval, MAX_DEPTH, MAX_INT_DIGITS, type Py, PyDict, PyFloat, PyInt, PyTuple, Unwritable } from './python-literal';

const CALL_OPEN = '<tool_call>';
const CALL_CLOSE = '</tool_call>';
const FUNCTION = '<function=';
const FUNCTION_CLOSE = '</function>';
const PARAMETER = '<parameter=';
const PARAMETER_CLOSE = '</parameter>';

/**
 * vLLM's `qwen3_coder` tool-call parser (Qwen3-Coder's XML tool calls), read as vLLM reads a
 * whole answer:
 *
 *     <tool_call>
 *     <function=NAME>
 *     <parameter=PARAM>
 *     VALUE
 *     </parameter>
 *     </function>
 *     </tool_call>
 *
 * - A call block runs from `<tool_call>` to the next `</tool_call>`, or to the end of the output
 *   when the last one is left open. Each `<function=NAME>` in a block, up to `</function>` or the
 *   block's end, is one tool call. A function whose tag has no `>` is dropped (noted).
 * - A parameter runs from `<parameter=NAME>` to `</parameter>`, the next `<parameter=`, or the end
 *   of the function; one newline is taken off each end of its value. A value holding a literal
 *   `</parameter>` ends there, as in vLLM.
 * - The content is the text before the first `<tool_call>`; text between and after blocks is
 *   dropped. When no block holds a `<function=`, the whole output is content. With no
 *   `<tool_call>` at all, bare `<function=…>` blocks are the calls and the content is the text
 *   before the first of them; those calls are given at the end, as a later `<tool_call>` would
 *   turn them back into text.
 * - Values are typed by the request's tool schema: the parameter's `type`, or the first non-null
 *   type of its `anyOf`. Undeclared parameters and string types keep the text; `null`/`None`
 *   (any case) is null for other types, and for a string type whose `anyOf` admits null.
 *   Integer types are read as Python's `int()` reads them, number types as `float()` (a whole
 *   number written as an integer), boolean types are true only for `true` (any case). Object and
 *   array types are read as JSON (`json.loads`), else as a Python literal (`ast.literal_eval`,
 *   e.g. `{'a': True}`); any other type as a Python literal. Text that does not convert stays
 *   text.
 * - Arguments are written as Python's `json.dumps(ensure_ascii=False)` writes them: `", "` and
 *   `": "`, Python's float repr (`1.0`, `1e-05`), integers exact, keys in first-seen order.
 * - Where vLLM's parser would fail and give the whole answer back as text (a number type given
 *   `inf`; a Python literal holding a set, bytes, a complex number or `...`), that value is kept
 *   as text instead, and noted.
 *
 * Content is given as soon as it is known and calls as each `</tool_call>` arrives; any split of
 * the text gives the same result.
 */
export class Qwen3CoderToolParser implements ToolStream {
  /** `text` until a tag; `bare` after a `<function=` with no `<tool_call>` before it; `calls` after a `<tool_call>`. */
  private phase: 'text' | 'bare' | 'calls' = 'text';
  /** `text`: the end that may start a tag; `bare`: everything from the first `<function=`. */
  private held = '';
  /** The raw text from the first `<tool_call>`, kept until a block holds a function (else it is content). */
  private pending = '';
  private haveFunction = false;
  /** Text not yet sorted into blocks, and the open block's text (null between blocks). */
  private rest = '';
  private block: string | null = null;
  /** Calls read before a block was seen to hold a function. */
  private queued: ToolCallOut[] = [];
  private readonly noteList: string[] = [];
  private readonly schemas = new Map<string, Record<string, unknown>>();

  /** `tools`: the request's tools (`{type: 'function', function: {name, parameters}}`), whose schemas type the values. */
  constructor(tools: readonly unknown[] | undefined) {
    for (const t of tools ?? []) {
      if (!isObject(t) || (t.type !== undefined && t.type !== 'function') || !isObject(t.function)) continue;
      const { name, parameters } = t.function;
      if (typeof name !== 'string' || this.schemas.has(name)) continue;
      const props = isObject(parameters) ? parameters.properties : undefined;
      this.schemas.set(name, isObject(props) ? props : {});
    }
  }

  get notes(): readonly string[] {
    return this.noteList;
  }

  push(text: string): { content: string; calls: ToolCallOut[] } {
    const out = { content: '', calls: [] as ToolCallOut[] };
    if (this.phase === 'text') {
      const buf = this.held + text;
      this.held = '';
      const open = buf.indexOf(CALL_OPEN);
      const fn = buf.indexOf(FUNCTION);
      if (open < 0 && fn < 0) {
        const a = holdPartial(buf, CALL_OPEN)[1];
        const b = holdPartial(buf, FUNCTION)[1];
        this.held = a.length >= b.length ? a : b;
        out.content = buf.slice(0, buf.length - this.held.length);
        return out;
      }
      if (open >= 0 && (fn < 0 || open < fn)) {
        out.content = buf.slice(0, open);
        this.phase = 'calls';
        this.feedCalls(buf.slice(open), out);
        return out;
      }
      out.content = buf.slice(0, fn);
      this.phase = 'bare';
      text = buf.slice(fn);
    }
    if (this.phase === 'bare') {
      const from = Math.max(0, this.held.length - CALL_OPEN.length + 1);
      this.held += text;
      const open = this.held.indexOf(CALL_OPEN, from);
      if (open < 0) return out;
      // A <tool_call> after all: the bare function was text.
      out.content += this.held.slice(0, open);
      const rest = this.held.slice(open);
      this.held = '';
      this.phase = 'calls';
      this.feedCalls(rest, out);
      return out;
    }
    this.feedCalls(text, out);
    return out;
  }

  end(): { content: string; calls: ToolCallOut[] } {
    const out = { content: '', calls: [] as ToolCallOut[] };
    if (this.phase === 'text') {
      out.content = this.held;
    } else if (this.phase === 'bare') {
      out.calls = this.readBlock(this.held);
    } else {
      if (this.block !== null) {
        this.appendBlock(this.rest);
        // vLLM reads an open last block with a lazy `(.*?)$`, which stops before a final newline.
        const text = this.block.endsWith('\n') ? this.block.slice(0, -1) : this.block;
        this.queued.push(...this.readBlock(text));
      }
      if (this.haveFunction) out.calls = this.queued;
      else out.content = this.pending;
    }
    this.held = this.pending = this.rest = '';
    this.block = null;
    this.queued = [];
    return out;
  }

  /** Sorts text after the first `<tool_call>` into blocks, reading each as it closes. */
  private feedCalls(text: string, out: { calls: ToolCallOut[] }): void {
    if (!this.haveFunction) this.pending += text;
    this.rest += text;
    for (;;) {
      if (this.block === null) {
        const at = this.rest.indexOf(CALL_OPEN);
        if (at < 0) {
          // Text between blocks: dropped, but a tag may be starting.
          this.rest = holdPartial(this.rest, CALL_OPEN)[1];
          break;
        }
        this.rest = this.rest.slice(at + CALL_OPEN.length);
        this.block = '';
      }
      const close = this.rest.indexOf(CALL_CLOSE);
      if (close < 0) {
        const [safe, held] = holdPartial(this.rest, CALL_CLOSE);
        this.appendBlock(safe);
        this.rest = held;
        break;
      }
      this.appendBlock(this.rest.slice(0, close));
      this.rest = this.rest.slice(close + CALL_CLOSE.length);
      this.queued.push(...this.readBlock(this.block));
      this.block = null;
    }
    if (this.haveFunction) {
      out.calls.push(...this.queued);
      this.queued = [];
      this.pending = '';
    }
  }

  private appendBlock(text: string): void {
    const block = this.block ?? '';
    const from = Math.max(0, block.length - FUNCTION.length + 1);
    this.block = block + text;
    if (!this.haveFunction && this.block.indexOf(FUNCTION, from) >= 0) this.haveFunction = true;
  }

  /** The calls of one block: each `<function=` up to `</function>`, the last possibly to the block's end. */
  private readBlock(block: string): ToolCallOut[] {
    const calls: ToolCallOut[] = [];
    let pos = 0;
    for (;;) {
      const at = block.indexOf(FUNCTION, pos);
      if (at < 0) break;
      const start = at + FUNCTION.length;
      const close = block.indexOf(FUNCTION_CLOSE, start);
      const call = this.readFunction(block.slice(start, close < 0 ? block.length : close));
      if (call) calls.push(call);
      if (close < 0) break;
      pos = close + FUNCTION_CLOSE.length;
    }
    return calls;
  }

  /** One function's text after `<function=`: the name up to the first `>`, then its parameters. */
  private readFunction(text: string): ToolCallOut | null {
    const gt = text.indexOf('>');
    if (gt < 0) {
      this.noteList.push('tool_call_unparsed');
      return null;
    }
    const name = text.slice(0, gt);
    const params = text.slice(gt + 1);
    const schema = this.schemas.get(name) ?? {};
    const args = new PyDict();
    let pos = 0;
    for (;;) {
      const at = params.indexOf(PARAMETER, pos);
      if (at < 0) break;
      const start = at + PARAMETER.length;
      const ends = [params.indexOf(PARAMETER_CLOSE, start), params.indexOf(PARAMETER, start), params.indexOf(FUNCTION_CLOSE, start)].filter((i) => i >= 0);
      let stop: number;
      if (ends.length > 0) {
        stop = Math.min(...ends);
        pos = params.startsWith(PARAMETER_CLOSE, stop) ? stop + PARAMETER_CLOSE.length : stop;
      } else {
        // To the end, where vLLM's lazy `$` stops before a final newline.
        stop = params.endsWith('\n') && params.length - 1 >= start ? params.length - 1 : params.length;
        pos = params.length;
      }
      const body = params.slice(start, stop);
      const nameEnd = body.indexOf('>');
      if (nameEnd < 0) {
        this.noteList.push('tool_parameter_unparsed');
        continue;
      }
      const param = body.slice(0, nameEnd);
      let value = body.slice(nameEnd + 1);
      if (value.startsWith('\n')) value = value.slice(1);
      if (value.endsWith('\n')) value = value.slice(0, -1);
      let typed = typedValue(value, param, schema);
      if (!writable(typed)) {
        this.noteList.push('tool_argument_kept_as_text');
        typed = value;
      }
      args.set(param, typed);
    }
    return { name, arguments: dumps(args) };
  }
}

// ---------------------------------------------------------------------------------------------
// Values as Python holds them (./python-literal), written back as json.dumps writes them.

/** Whether json.dumps (default options) can write the value. */
function writable(v: Py): boolean {
  if (v instanceof Unwritable) return false;
  if (Array.isArray(v)) return v.every(writable);
  if (v instanceof PyTuple) return v.items.every(writable);
  if (v instanceof PyDict)
    return v.entries.every(([k, x]) => (k === null || typeof k !== 'object' || k instanceof PyInt || k instanceof PyFloat) && writable(x));
  return true;
}

/** The JSON text Python's `json.dumps(v, ensure_ascii=False)` writes. */
function dumps(v: Py): string {
  if (v === null) return 'null';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (typeof v === 'string') return JSON.stringify(v);
  if (v instanceof PyInt) return v.value.toString();
  if (v instanceof PyFloat) return floatJson(v.value);
  if (Array.isArray(v)) return `[${v.map(dumps).join(', ')}]`;
  if (v instanceof PyTuple) return dumps(v.items);
  if (v instanceof PyDict) return `{${v.entries.map(([k, x]) => `${JSON.stringify(keyText(k))}: ${dumps(x)}`).join(', ')}}`;
  throw new Error('unwritable value');
}

/** A dict key as json.dumps turns it into a string. */
function keyText(k: Py): string {
  if (k === null) return 'null';
  if (typeof k === 'string') return k;
  if (typeof k === 'boolean') return k ? 'true' : 'false';
  if (k instanceof PyInt) return k.value.toString();
  if (k instanceof PyFloat) return floatJson(k.value);
  throw new Error('unwritable key');
}

function floatJson(x: number): string {
  if (Number.isNaN(x)) return 'NaN';
  if (!Number.isFinite(x)) return x > 0 ? 'Infinity' : '-Infinity';
  return floatRepr(x);
}

/** Python's `repr(float)`: the shortest round-trip digits, exponent form below 1e-4 and from 1e16. */
export function floatRepr(x: number): string {
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const [mantissa, exp] = Math.abs(x).toExponential().split('e');
  const digits = mantissa.replace('.', '');
  const e = Number(exp);
  const sign = x < 0 ? '-' : '';
  const point = e + 1; // digits[0..point) are the integer part
  if (point > -4 && point <= 16) {
    if (point <= 0) return `${sign}0.${'0'.repeat(-point)}${digits}`;
    if (point >= digits.length) return `${sign}${digits}${'0'.repeat(point - digits.length)}.0`;
    return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${e < 0 ? '-' : '+'}${String(Math.abs(e)).padStart(2, '0')}`;
}

// ---------------------------------------------------------------------------------------------
// Typing a value by its schema, as vLLM's `_convert_param_value` does.

const STRING_TYPES = ['string', 'str', 'text', 'varchar', 'char', 'enum'];

function typedValue(value: string, param: string, schema: Record<string, unknown>): Py {
  if (!Object.prototype.hasOwnProperty.call(schema, param)) return value;
  const spec = schema[param];
  let type = 'string';
  let nullable = false;
  if (isObject(spec) && 'type' in spec) {
    type = pythonStr(spec.type).trim().toLowerCase();
    nullable = type === 'null';
  } else if (isObject(spec) && 'anyOf' in spec) {
    let picked = false;
    for (const option of Array.isArray(spec.anyOf) ? spec.anyOf : []) {
      if (!isObject(option) || !('type' in option)) continue;
      const t = pythonStr(option.type).trim().toLowerCase();
      if (t === 'null') nullable = true;
      else if (!picked) {
        type = t;
        picked = true;
      }
    }
  }
  const lower = value.toLowerCase();
  if (nullable && (lower === 'null' || lower === 'none')) return null;
  if (STRING_TYPES.includes(type)) return value;
  if (lower === 'null' || lower === 'none') return null;
  if (['int', 'uint', 'long', 'short', 'unsigned'].some((p) => type.startsWith(p))) return pythonInt(value) ?? value;
  if (type.startsWith('num') || type.startsWith('float')) {
    const f = pythonFloat(value);
    if (f === null || Number.isNaN(f)) return value;
    // vLLM's int(inf) raises where the whole answer is given back as text; this keeps the text.
    if (!Number.isFinite(f)) return new Unwritable();
    return Number.isInteger(f) ? new PyInt(BigInt(f)) : new PyFloat(f);
  }
  if (['boolean', 'bool', 'binary'].includes(type)) return lower === 'true';
  const container = ['object', 'array', 'arr'].includes(type) || type.startsWith('dict') || type.startsWith('list');
  if (container) {
    const parsed = jsonLoads(value);
    if (parsed !== undefined) {
      // A string inside the JSON (a template that wrote str(dict) as JSON): read it once more.
      if (typeof parsed === 'string') return literalEval(parsed) ?? parsed;
      return parsed;
    }
  }
  const lit = literalEval(value);
  if (lit === undefined) return value;
  if (container && typeof lit === 'string') return literalEval(lit) ?? lit;
  return lit;
}

/** `str()` of a schema's `type` as Python writes it, enough to tell the type names apart. */
function pythonStr(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === null) return 'None';
  if (typeof v === 'boolean') return v ? 'True' : 'False';
  if (typeof v === 'number') return String(v);
  return '[…]';
}

/** The spaces Python's `int()` and `float()` allow around a number: ASCII ones, and Unicode ones above ASCII. */
function numberStrip(text: string): string {
  const space = (c: number) =>
    (c >= 9 && c <= 13) ||
    c === 0x20 ||
    c === 0x85 ||
    c === 0xa0 ||
    c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) ||
    c === 0x2028 ||
    c === 0x2029 ||
    c === 0x202f ||
    c === 0x205f ||
    c === 0x3000;
  let a = 0;
  let b = text.length;
  while (a < b && space(text.charCodeAt(a))) a++;
  while (b > a && space(text.charCodeAt(b - 1))) b--;
  return text.slice(a, b);
}

/** Python's `int(text)` (base 10), or null where it raises. */
function pythonInt(text: string): PyInt | null {
  const s = numberStrip(text);
  if (!/^[+-]?\d(?:_?\d)*$/.test(s)) return null;
  const digits = s.replace(/[+_-]/g, '');
  if (digits.length > MAX_INT_DIGITS) return null;
  return new PyInt(BigInt(s.replace(/_/g, '')));
}

/** Python's `float(text)`, or null where it raises. */
function pythonFloat(text: string): number | null {
  const s = numberStrip(text);
  const special = /^([+-]?)(inf|infinity|nan)$/i.exec(s);
  if (special) return special[2].toLowerCase() === 'nan' ? NaN : special[1] === '-' ? -Infinity : Infinity;
  const d = String.raw`\d(?:_?\d)*`;
  if (!new RegExp(String.raw`^[+-]?(?:${d}\.(?:${d})?|\.${d}|${d})(?:[eE][+-]?${d})?$`).test(s)) return null;
  return Number(s.replace(/_/g, ''));
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

// ---------------------------------------------------------------------------------------------
// Python's json.loads: standard JSON plus NaN and ±Infinity; integers exact, others floats.

/** The value, or undefined where json.loads raises. */
function jsonLoads(text: string): Py | undefined {
  let i = 0;
  const ws = () => {
    while (i < text.length && ' \t\n\r'.includes(text[i])) i++;
  };
  const fail = (): never => {
    throw new SyntaxError('json');
  };
  const value = (depth: number): Py => {
    if (depth > MAX_DEPTH) fail();
    ws();
    const c = text[i];
    if (c === '{') {
      i++;
      const dict = new PyDict();
      ws();
      if (text[i] === '}') {
        i++;
        return dict;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail();
        const key = string();
        ws();
        if (text[i++] !== ':') fail();
        dict.set(key, value(depth + 1));
        ws();
        const sep = text[i++];
        if (sep === '}') return dict;
        if (sep !== ',') fail();
      }
    }
    if (c === '[') {
      i++;
      const list: Py[] = [];
      ws();
      if (text[i] === ']') {
        i++;
        return list;
      }
      for (;;) {
        list.push(value(depth + 1));
        ws();
        const sep = text[i++];
        if (sep === ']') return list;
        if (sep !== ',') fail();
      }
    }
    if (c === '"') return string();
    for (const [word, v] of [
      ['null', null],
      ['true', true],
      ['false', false],
      ['NaN', new PyFloat(NaN)],
      ['Infinity', new PyFloat(Infinity)],
      ['-Infinity', new PyFloat(-Infinity)],
    ] as const)
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    const m = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?/y;
    m.lastIndex = i;
    const n = m.exec(text);
    if (!n) return fail();
    i += n[0].length;
    if (n[1] === undefined && n[2] === undefined) {
      if (n[0].replace('-', '').length > MAX_INT_DIGITS) fail();
      return new PyInt(BigInt(n[0]));
    }
    return new PyFloat(Number(n[0]));
  };
  const string = (): string => {
    i++; // the opening quote
    let out = '';
    for (;;) {
      if (i >= text.length) fail();
      const c = text[i++];
      if (c === '"') return out;
      if (c < ' ') fail();
      if (c !== '\\') {
        out += c;
        continue;
      }
      const e = text[i++];
      const simple: Record<string, string> = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };
      if (e in simple) out += simple[e];
      else if (e === 'u' && /^[0-9a-fA-F]{4}$/.test(text.slice(i, i + 4))) {
        out += String.fromCharCode(parseInt(text.slice(i, i + 4), 16));
        i += 4;
      } else fail();
    }
  };
  try {
    const v = value(0);
    ws();
    return i === text.length ? v : undefined;
  } catch {
    return undefined;
  }
}
