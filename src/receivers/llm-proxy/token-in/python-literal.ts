// ---------------------------------------------------------------------------------------------
// Values as Python holds them, so that they are written back as json.dumps writes them.

/** A Python int, exact. */
export class PyInt {
  constructor(readonly value: bigint) {}
}
/** A Python float. */
export class PyFloat {
  constructor(readonly value: number) {}
}
/** A value json.dumps cannot write: a set, bytes, a complex number, `...`. */
export class Unwritable {}

/** A Python dict: insertion-ordered; a key equal to an earlier one (1 == 1.0 == True) replaces its value, not its place. */
export class PyDict {
  readonly entries: [Py, Py][] = [];
  private readonly at = new Map<string, number>();

  /** False when the key is not one a dict takes (a list, dict or set). */
  set(key: Py, value: Py): boolean {
    const id = keyId(key);
    if (id === null) return false;
    const i = this.at.get(id);
    if (i === undefined) {
      this.at.set(id, this.entries.length);
      this.entries.push([key, value]);
    } else this.entries[i][1] = value;
    return true;
  }
}

/** Python's tuple, kept apart from lists only because a tuple may be a dict key. */
export class PyTuple {
  constructor(readonly items: Py[]) {}
}

export type Py = null | boolean | string | PyInt | PyFloat | Py[] | PyTuple | PyDict | Unwritable;

/** Python's dict-key equality as a string; null for an unhashable key. */
function keyId(k: Py): string | null {
  if (k === null) return 'None';
  if (typeof k === 'string') return `s${k}`;
  if (typeof k === 'boolean') return k ? 'n1' : 'n0';
  if (k instanceof PyInt) return `n${k.value}`;
  if (k instanceof PyFloat) return Number.isInteger(k.value) ? `n${BigInt(k.value)}` : `f${k.value}`;
  if (k instanceof PyTuple) {
    const ids = k.items.map(keyId);
    return ids.some((i) => i === null) ? null : `t${JSON.stringify(ids)}`;
  }
  // Hashable but not writable (bytes, complex): the dict is given up on anyway.
  if (k instanceof Unwritable) return 'u';
  return null;
}

export const MAX_INT_DIGITS = 4300; // Python's limit on int() of a string

/** How deep brackets may nest before a reader gives up. */
export const MAX_DEPTH = 200;

// ---------------------------------------------------------------------------------------------
// Python's ast.literal_eval of a string: strings, bytes, numbers, tuples, lists, dicts, sets,
// True/False/None, a sign on a number, and a number plus or minus an imaginary number.

/** The value, or undefined where literal_eval raises. */
export function literalEval(source: string): Py | undefined {
  return new PythonLiteral(source.replace(/^[ \t]+/, '')).parse();
}

type Item = { v: Py; num?: 'real' | 'imag' };

function fail(): never {
  throw new SyntaxError('literal');
}

function isIdent(c: string | undefined): boolean {
  return c !== undefined && /[\p{L}\p{N}_]/u.test(c);
}

function negate(v: Py): Py {
  if (v instanceof PyInt) return new PyInt(-v.value);
  if (v instanceof PyFloat) return new PyFloat(-v.value);
  return v;
}

/** One reading of `text`: `i` is the position, `depth` the brackets open. */
class PythonLiteral {
  private i = 0;
  private depth = 0;

  constructor(private readonly text: string) {}

  /** The value, or undefined where literal_eval raises. */
  parse(): Py | undefined {
    const text = this.text;
    try {
      while (text[this.i] === '\n' || text[this.i] === '\r' || text[this.i] === '#') {
        if (text[this.i] === '#') while (this.i < text.length && text[this.i] !== '\n' && text[this.i] !== '\r') this.i++;
        else this.i++;
        if (text[this.i] === ' ' || text[this.i] === '\t') fail(); // an indented first line
      }
      const first = this.expr();
      this.ws();
      let result: Py = first.v;
      if (text[this.i] === ',') {
        // A bare tuple: `1, 2`.
        const list = [first.v];
        for (;;) {
          this.i++;
          this.ws();
          if (this.i >= text.length || text[this.i] === '\n' || text[this.i] === '\r' || text[this.i] === '#') break;
          list.push(this.expr().v);
          this.ws();
          if (text[this.i] !== ',') break;
        }
        result = new PyTuple(list);
      }
      return this.atEnd() ? result : undefined;
    } catch {
      return undefined;
    }
  }

  /** Skips spaces, comments and line joins; newlines only inside brackets. */
  private ws(): void {
    const text = this.text;
    for (;;) {
      const c = text[this.i];
      if (c === ' ' || c === '\t' || c === '\f') this.i++;
      else if (c === '\\' && (text[this.i + 1] === '\n' || text[this.i + 1] === '\r')) this.i += text.startsWith('\r\n', this.i + 1) ? 3 : 2;
      else if (c === '#') while (this.i < text.length && text[this.i] !== '\n' && text[this.i] !== '\r') this.i++;
      else if ((c === '\n' || c === '\r') && this.depth > 0) this.i++;
      else return;
    }
  }

  /** The rest after the expression: blank lines and comments only. */
  private atEnd(): boolean {
    for (;;) {
      this.ws();
      if (this.text[this.i] === '\n' || this.text[this.i] === '\r') this.i++;
      else return this.i >= this.text.length;
    }
  }

  private number(): Item {
    const text = this.text;
    const d = String.raw`\d(?:_?\d)*`;
    const re = new RegExp(
      String.raw`0[xX](?:_?[0-9a-fA-F])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+|(?:${d}\.(?:${d})?|\.${d})(?:[eE][+-]?${d})?|${d}(?:[eE][+-]?${d})?`,
      'y',
    );
    re.lastIndex = this.i;
    const m = re.exec(text);
    if (!m) return fail();
    let s = m[0];
    this.i += s.length;
    const imag = text[this.i] === 'j' || text[this.i] === 'J';
    if (imag) this.i++;
    if (isIdent(text[this.i])) fail();
    s = s.replace(/_/g, '');
    if (imag) return { v: new Unwritable(), num: 'imag' };
    if (/^0[xXoObB]/.test(s)) {
      const prefix = s[1].toLowerCase() === 'x' ? '0x' : s[1].toLowerCase() === 'o' ? '0o' : '0b';
      return { v: new PyInt(BigInt(prefix + s.slice(2))), num: 'real' };
    }
    if (/^\d+$/.test(s)) {
      if (s.length > 1 && s[0] === '0' && /[1-9]/.test(s)) fail();
      if (s.length > MAX_INT_DIGITS) fail();
      return { v: new PyInt(BigInt(s)), num: 'real' };
    }
    return { v: new PyFloat(Number(s)), num: 'real' };
  }

  /** One string or bytes literal (prefix and quotes). */
  private stringLiteral(): { bytes: boolean; text: string } {
    const text = this.text;
    const pm = /[rRbBuUfF]{0,2}/y;
    pm.lastIndex = this.i;
    const prefix = (pm.exec(text)?.[0] ?? '').toLowerCase();
    if (!['', 'r', 'u', 'b', 'br', 'rb', 'f', 'fr', 'rf'].includes(prefix)) fail();
    if (prefix.includes('f')) fail(); // an f-string is not a literal
    this.i += prefix.length;
    const raw = prefix.includes('r');
    const bytes = prefix.includes('b');
    const q = text[this.i];
    if (q !== '"' && q !== "'") fail();
    const triple = text.startsWith(q.repeat(3), this.i);
    const close = triple ? q.repeat(3) : q;
    this.i += close.length;
    let out = '';
    for (;;) {
      if (this.i >= text.length) fail();
      if (text.startsWith(close, this.i)) {
        this.i += close.length;
        return { bytes, text: out };
      }
      const c = text[this.i++];
      if (!triple && (c === '\n' || c === '\r')) fail();
      if (c !== '\\') {
        out += c;
        continue;
      }
      const e = text[this.i++];
      if (e === undefined) fail();
      if (raw) {
        out += `\\${e}`;
        continue;
      }
      const simple: Record<string, string> = { '\\': '\\', "'": "'", '"': '"', a: '\x07', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t', v: '\v' };
      if (e === '\n') continue;
      if (e === '\r') {
        if (text[this.i] === '\n') this.i++;
        continue;
      }
      if (e in simple) out += simple[e];
      else if (/[0-7]/.test(e)) {
        let oct = e;
        while (oct.length < 3 && /[0-7]/.test(text[this.i] ?? '')) oct += text[this.i++];
        out += String.fromCodePoint(parseInt(oct, 8));
      } else if (e === 'x') {
        if (!/^[0-9a-fA-F]{2}$/.test(text.slice(this.i, this.i + 2))) fail();
        out += String.fromCodePoint(parseInt(text.slice(this.i, this.i + 2), 16));
        this.i += 2;
      } else if (!bytes && (e === 'u' || e === 'U')) {
        const n = e === 'u' ? 4 : 8;
        const hex = text.slice(this.i, this.i + n);
        if (!new RegExp(`^[0-9a-fA-F]{${n}}$`).test(hex) || parseInt(hex, 16) > 0x10ffff) fail();
        out += String.fromCodePoint(parseInt(hex, 16));
        this.i += n;
      } else if (!bytes && e === 'N')
        fail(); // named escapes are not read here
      else out += `\\${e}`;
    }
  }

  private startsString(): boolean {
    return /^(?:[rRbBuUfF]{0,2})['"]/.test(this.text.slice(this.i, this.i + 3));
  }

  /** Adjacent literals are one (str with str, bytes with bytes). */
  private strings(): Item {
    let bytes: boolean | null = null;
    let out = '';
    while (this.startsString()) {
      const s = this.stringLiteral();
      if (bytes !== null && bytes !== s.bytes) fail();
      bytes = s.bytes;
      out += s.text;
      this.ws();
    }
    return { v: bytes ? new Unwritable() : out };
  }

  /** Items up to `close`, comma-separated, a trailing comma allowed; whether a comma was seen. */
  private items(close: string, one: () => Item): { list: Item[]; comma: boolean } {
    const text = this.text;
    const list: Item[] = [];
    let comma = false;
    for (;;) {
      this.ws();
      if (text[this.i] === close) {
        this.i++;
        return { list, comma };
      }
      list.push(one());
      this.ws();
      if (text[this.i] === ',') {
        this.i++;
        comma = true;
      } else if (text[this.i] === close) {
        this.i++;
        return { list, comma };
      } else fail();
    }
  }

  private atom(): Item {
    const text = this.text;
    this.ws();
    const c = text[this.i];
    if (c === undefined) return fail();
    if (this.startsString()) return this.strings();
    if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(text[this.i + 1] ?? ''))) return this.number();
    if (text.startsWith('...', this.i)) {
      this.i += 3;
      return { v: new Unwritable() };
    }
    if (c === '(' || c === '[' || c === '{') {
      if (++this.depth > MAX_DEPTH) fail();
      this.i++;
      const expr = () => this.expr();
      let result: Item;
      if (c === '(') {
        const { list, comma } = this.items(')', expr);
        if (list.length === 1 && !comma) result = list[0];
        else result = { v: new PyTuple(list.map((x) => x.v)) };
      } else if (c === '[') result = { v: this.items(']', expr).list.map((x) => x.v) };
      else result = this.braces();
      this.depth--;
      return result;
    }
    const id = /[\p{L}_][\p{L}\p{N}_]*/uy;
    id.lastIndex = this.i;
    const name = id.exec(text)?.[0];
    if (name === 'True' || name === 'False' || name === 'None') {
      this.i += name.length;
      return { v: name === 'None' ? null : name === 'True' };
    }
    if (name === 'set') {
      // set() is the one call literal_eval reads.
      this.i += 3;
      this.ws();
      if (text[this.i] !== '(') fail();
      this.i++;
      this.ws();
      if (text[this.i] !== ')') fail();
      this.i++;
      return { v: new Unwritable() };
    }
    return fail();
  }

  /** After `{`: a dict, or a set. */
  private braces(): Item {
    const text = this.text;
    this.ws();
    if (text[this.i] === '}') {
      this.i++;
      return { v: new PyDict() };
    }
    const first = this.expr();
    this.ws();
    if (text[this.i] !== ':') {
      // A set: its items must be hashable; json.dumps cannot write it.
      const sep = text[this.i++];
      const rest = sep === ',' ? this.items('}', () => this.expr()).list : sep === '}' ? [] : fail();
      for (const x of [first, ...rest]) if (keyId(x.v) === null) fail();
      return { v: new Unwritable() };
    }
    this.i++;
    const dict = new PyDict();
    if (!dict.set(first.v, this.expr().v)) fail();
    this.ws();
    if (text[this.i] === '}') {
      this.i++;
      return { v: dict };
    }
    if (text[this.i] !== ',') fail();
    this.i++;
    for (;;) {
      this.ws();
      if (text[this.i] === '}') {
        this.i++;
        return { v: dict };
      }
      const k = this.expr();
      this.ws();
      if (text[this.i++] !== ':') fail();
      if (!dict.set(k.v, this.expr().v)) fail();
      this.ws();
      if (text[this.i] === ',') this.i++;
      else if (text[this.i] === '}') {
        this.i++;
        return { v: dict };
      } else fail();
    }
  }

  /** A sign before a number, and a number plus or minus an imaginary one. */
  private expr(): Item {
    const text = this.text;
    this.ws();
    let left: Item;
    const sign = text[this.i];
    if (sign === '+' || sign === '-') {
      this.i++;
      const operand = this.atom();
      if (operand.num === undefined) fail();
      left = { v: sign === '-' ? negate(operand.v) : operand.v, num: operand.num };
    } else left = this.atom();
    this.ws();
    const op = text[this.i];
    if ((op === '+' || op === '-') && left.num === 'real') {
      this.i++;
      this.ws();
      const right = this.atom();
      if (right.num !== 'imag') fail();
      return { v: new Unwritable() };
    }
    return left;
  }
}
