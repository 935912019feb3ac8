import { spawnSync } from 'node:child_process';
import {
  base64Range,
  decodeNpy,
  narrow,
  RoutingFormatError,
  sglangRoutedExperts,
  trajectoryRouting,
  vllmRoutedExperts,
  type RoutingRows,
} from '../../src/formats/routed-experts';
import { requirementsMet } from '../python/requirements';

// The engines' routed-experts wire forms, decoded; numpy itself writes the .npy files and the raw
// int32 bytes (np.save is what vLLM calls), so the decoder is checked against the real format.

/** A python3 with numpy (Debian's python3-numpy), or null. */
function numpyPython(): string | null {
  for (const exe of ['python3', '/usr/bin/python3']) if (spawnSync(exe, ['-c', 'import numpy'], { stdio: 'ignore' }).status === 0) return exe;
  return null;
}

const PY = numpyPython();

/** Runs numpy code that prints one JSON value. */
function py<T>(code: string): T {
  const r = spawnSync(PY!, ['-c', `import base64, io, json, numpy as np\n${code}`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout) as T;
}

if (
  requirementsMet('test/formats/routed-experts.test.ts', PY === null ? 'no python3 with numpy (Debian: python3-numpy)' : null, 'routed experts against numpy')
) {
  describe('routed experts against numpy', () => {
    it.each([
      ['uint8', 'np.uint8', 255],
      ['uint16', 'np.uint16', 1000],
      ['int16', 'np.int16', 300],
      ['int32', 'np.int32', 70000],
    ])('vLLM .npy of %s: the shape and every value as numpy wrote them', (dtype, npType, high) => {
      const { b64, values } = py<{ b64: string; values: number[] }>(
        `rng = np.random.default_rng(7)\n` +
          `a = rng.integers(0, ${high}, size=(5, 3, 2)).astype(${npType})\n` +
          (dtype === 'int16' ? 'a[1, 0, 0] = -1\n' : '') +
          `b = io.BytesIO(); np.save(b, a)\n` +
          `print(json.dumps({"b64": base64.b64encode(b.getvalue()).decode(), "values": a.reshape(-1).tolist()}))`,
      );
      const npy = decodeNpy(Buffer.from(b64, 'base64'));
      expect(npy.dtype).toBe(dtype);
      expect(npy.shape).toEqual([5, 3, 2]);
      expect(Array.from(npy.data)).toEqual(values);
      const rows = vllmRoutedExperts(b64, null, 4);
      expect(rows).toMatchObject({ start: 4, rows: 5, layers: 3, topK: 2 });
      expect(Array.from(rows.data)).toEqual(values);
    });

    it('a version 2 .npy header, and an empty array, decode too', () => {
      const { v2, empty } = py<{ v2: string; empty: string }>(
        `a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)\n` +
          `b = io.BytesIO(); np.lib.format.write_array(b, a, version=(2, 0))\n` +
          `e = io.BytesIO(); np.save(e, np.zeros((0, 48, 8), dtype=np.uint8))\n` +
          `print(json.dumps({"v2": base64.b64encode(b.getvalue()).decode(), "empty": base64.b64encode(e.getvalue()).decode()}))`,
      );
      const a = decodeNpy(Buffer.from(v2, 'base64'));
      expect(a.shape).toEqual([2, 3, 4]);
      expect(Array.from(a.data)).toEqual(Array.from({ length: 24 }, (_, i) => i));
      expect(vllmRoutedExperts(empty)).toMatchObject({ rows: 0, layers: 48, topK: 8 });
    });

    it('SGLang raw int32: rows from the byte count and the model config, values narrowed', () => {
      const { b64, values } = py<{ b64: string; values: number[] }>(
        `a = np.random.default_rng(3).integers(0, 128, size=(7, 4, 2)).astype('<i4')\n` +
          `print(json.dumps({"b64": base64.b64encode(a.tobytes()).decode(), "values": a.reshape(-1).tolist()}))`,
      );
      const rows = sglangRoutedExperts(b64, 4, 2, 10);
      expect(rows).toMatchObject({ start: 10, rows: 7, layers: 4, topK: 2 });
      expect(rows.data).toBeInstanceOf(Uint8Array);
      expect(Array.from(rows.data)).toEqual(values);
      expect(() => sglangRoutedExperts(b64, 3, 2)).toThrow(/not whole rows of 3 layers × 2 int32 experts/);
    });

    it('what numpy can write but the engines do not is refused with what it is', () => {
      const { floats, fortran, flat } = py<Record<string, string>>(
        `def enc(a, **kw):\n  b = io.BytesIO(); np.save(b, a, **kw); return base64.b64encode(b.getvalue()).decode()\n` +
          `print(json.dumps({"floats": enc(np.zeros((2, 2, 2), dtype=np.float32)), "fortran": enc(np.asfortranarray(np.zeros((2, 3, 2), dtype=np.uint8))), "flat": enc(np.zeros(6, dtype=np.uint8))}))`,
      );
      expect(() => vllmRoutedExperts(floats)).toThrow(/element type <f4 is not an expert id type/);
      expect(() => vllmRoutedExperts(fortran)).toThrow(/Fortran order/);
      expect(() => vllmRoutedExperts(flat)).toThrow(/is not \(rows, layers, top_k\)/);
    });
  });
}

describe('routed experts: the forms numpy is not needed for', () => {
  it("vLLM v0.21's nested lists, with the prompt's rows before the choice's; -1 kept", () => {
    const rows = vllmRoutedExperts(
      [
        [
          [3, 4],
          [5, 6],
        ],
      ],
      [
        [
          [-1, -1],
          [1, 2],
        ],
      ],
    );
    expect(rows).toMatchObject({ start: 0, rows: 2, layers: 2, topK: 2, rowPerToken: true });
    expect(rows.data).toBeInstanceOf(Int16Array);
    expect(Array.from(rows.data)).toEqual([-1, -1, 1, 2, 3, 4, 5, 6]);
    expect(() => vllmRoutedExperts([[[1, 2], [3]]])).toThrow(/row 0 layer 1 does not have 2 experts/);
    expect(() => vllmRoutedExperts(null)).toThrow(RoutingFormatError);
    expect(() => decodeNpy(Buffer.from('not numpy at all'))).toThrow(/no \\x93NUMPY magic/);
  });

  it('base64 in a JSON string decodes from the bytes, escaped slashes and all', () => {
    const values = Buffer.from(Array.from({ length: 3000 }, (_, i) => (i * 37) % 256));
    const b64 = values.toString('base64');
    expect(b64).toContain('/');
    const plain = Buffer.from(`{"routed_experts":${JSON.stringify(b64)}}`);
    expect(base64Range(plain, 18, plain.length - 1).equals(values)).toBe(true);
    const escaped = Buffer.from(`{"routed_experts":"${b64.replace(/\//g, '\\/')}"}`);
    expect(base64Range(escaped, 18, escaped.length - 1).equals(values)).toBe(true);
    expect(() => base64Range(plain, 17, plain.length - 1)).toThrow(/not a JSON string/);
  });

  it('narrows to the smallest type that holds the values', () => {
    expect(narrow(Int32Array.from([0, 255]))).toBeInstanceOf(Uint8Array);
    expect(narrow(Int32Array.from([-1, 255]))).toBeInstanceOf(Int16Array);
    expect(narrow(Int32Array.from([0, 40000]))).toBeInstanceOf(Uint16Array);
    expect(narrow(Int32Array.from([-1, 40000]))).toBeInstanceOf(Int32Array);
  });
});

describe('a trajectory of several calls: each row from the call that ran that position', () => {
  /** Rows whose every value is `mark * 1000 + position` (1 layer, top-1): who wrote each row shows. */
  const rowsOf = (mark: number, start: number, end: number): RoutingRows => ({
    start,
    rows: end - start,
    layers: 1,
    topK: 1,
    data: Int32Array.from({ length: end - start }, (_, i) => mark * 1000 + start + i),
  });

  it('two turns, each returning rows from position 0: prompt rows from the first call, each sampled token from the call that sampled it', () => {
    // Call 1: prompt [0, 5), sampled [5, 8). Call 2: prompt [0, 10) (the agent appended 2 tokens), sampled [10, 12).
    const r = trajectoryRouting(
      [
        { responseStart: 5, responseEnd: 8, routing: rowsOf(1, 0, 7) },
        { responseStart: 10, responseEnd: 12, routing: rowsOf(2, 0, 11) },
      ],
      12,
    )!;
    expect(r.complete).toBe(true);
    expect(r.coverage).toBe(1);
    expect(r.missing).toEqual([]);
    // Rows 0..6 from call 1 (row 6 decided the token at 7), rows 7..10 from call 2.
    expect(Array.from(r.data, (v) => v)).toEqual([1000, 1001, 1002, 1003, 1004, 1005, 1006, 2007, 2008, 2009, 2010]);
  });

  it('one call whose rows cover the whole trajectory: its rows as they are, complete', () => {
    const one = rowsOf(1, 0, 7);
    const r = trajectoryRouting([{ responseStart: 5, responseEnd: 8, routing: one }], 8)!;
    expect(r).toMatchObject({ rows: 7, layers: 1, topK: 1, missing: [], coverage: 1, complete: true, problems: [] });
    expect(Array.from(r.data)).toEqual([1000, 1001, 1002, 1003, 1004, 1005, 1006]);
    // Rows that stop short are not taken as a whole.
    expect(trajectoryRouting([{ responseStart: 5, responseEnd: 8, routing: rowsOf(1, 0, 6) }], 8)!.complete).toBe(false);
  });

  it("vLLM v0.21's row per token (prompt_len + gen_len rows): the last sampled token's row is not used", () => {
    const v021 = { ...rowsOf(1, 0, 8), rowPerToken: true };
    const r = trajectoryRouting([{ responseStart: 5, responseEnd: 8, routing: v021 }], 8)!;
    expect(r.complete).toBe(true);
    expect(Array.from(r.data)).toEqual([1000, 1001, 1002, 1003, 1004, 1005, 1006]);
    const short = trajectoryRouting([{ responseStart: 5, responseEnd: 8, routing: { ...rowsOf(1, 0, 7), rowPerToken: true } }], 8)!;
    expect(short.problems[0]).toMatch(/not up to its last token \(8\)/);
  });

  it('a call asked for new rows only (routed_experts_prompt_start) fits as well', () => {
    const r = trajectoryRouting(
      [
        { responseStart: 5, responseEnd: 8, routing: rowsOf(1, 0, 7) },
        { responseStart: 10, responseEnd: 12, routing: rowsOf(2, 7, 11) },
      ],
      12,
    )!;
    expect(r.complete).toBe(true);
    expect(Array.from(r.data).slice(6)).toEqual([1006, 2007, 2008, 2009, 2010]);
  });

  it('a call without routing, or with rows that do not end at its last token but one, is flagged and its positions marked missing', () => {
    const none = trajectoryRouting(
      [
        { responseStart: 5, responseEnd: 8, routing: rowsOf(1, 0, 7) },
        { responseStart: 10, responseEnd: 12, routing: null },
      ],
      12,
    )!;
    expect(none.complete).toBe(false);
    expect(none.missing).toEqual([[7, 11]]);
    expect(none.problems).toEqual(['a call returned no routing', 'positions without a row']);
    // Sampled positions 5, 6, 7 have rows 4, 5, 6; 10 and 11 need rows 9 and 10, missing.
    expect(none.coverage).toBeCloseTo(3 / 5, 12);
    const off = trajectoryRouting(
      [
        { responseStart: 5, responseEnd: 8, routing: rowsOf(1, 0, 8) },
        { responseStart: 10, responseEnd: 12, routing: rowsOf(2, 0, 11) },
      ],
      12,
    )!;
    expect(off.complete).toBe(false);
    expect(off.problems[0]).toMatch(/cover positions \[0, 8\), not up to its last token but one \(7\)/);
    expect(off.missing).toEqual([[0, 7]]);
    expect(trajectoryRouting([{ responseStart: 5, responseEnd: 8, routing: null }], 8)).toBeNull();
    // Routing that came but could not be read is flagged, not left out as if none came.
    const unread = trajectoryRouting([{ responseStart: 5, responseEnd: 8, routing: null, error: 'routed_experts: bad' }], 8)!;
    expect(unread).toMatchObject({ layers: 0, topK: 0, missing: [[0, 7]], coverage: 0, complete: false });
    expect(unread.problems[0]).toBe("a call's routing could not be read (routed_experts: bad)");
  });
});
