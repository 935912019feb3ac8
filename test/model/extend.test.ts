import fc from 'fast-check';
import { extend } from '../../src/model/extend';

describe('extend', () => {
  it('gives what a spread gives: the same members, values and order, for any two objects', () => {
    const key = fc.oneof(fc.string({ maxLength: 4 }), fc.constantFrom('a', 'b', 'constructor', 'toString', '0', '10'));
    const obj = fc.dictionary(key, fc.jsonValue(), { maxKeys: 8 });
    fc.assert(
      fc.property(obj, obj, (a, b) => {
        const got = extend(a, b);
        const want = { ...a, ...b };
        expect(Object.keys(got)).toEqual(Object.keys(want));
        expect(got).toStrictEqual(want);
        expect(Object.getPrototypeOf(got)).toBe(Object.prototype);
      }),
      { seed: 20261129, numRuns: 300 },
    );
  });

  it('keeps a `__proto__` key a member, as a spread does, from either side', () => {
    const hostile = JSON.parse('{"__proto__": {"polluted": true}, "a": 1}') as Record<string, unknown>;
    for (const got of [extend(hostile, { b: 2 }), extend({ b: 2 }, hostile)]) {
      expect(Object.getPrototypeOf(got)).toBe(Object.prototype);
      expect((got as { polluted?: boolean }).polluted).toBeUndefined();
      expect(Object.hasOwn(got, '__proto__')).toBe(true);
    }
  });

  it('leaves both objects as they were', () => {
    const a = { x: 1, y: { z: 2 } };
    const b = { x: 3 };
    const got = extend(a, b);
    expect(a).toEqual({ x: 1, y: { z: 2 } });
    expect(b).toEqual({ x: 3 });
    expect(got).toEqual({ x: 3, y: { z: 2 } });
    expect(got.y).toBe(a.y);
  });
});
