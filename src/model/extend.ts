/**
 * `{ ...base, ...fields }`, built as `Object.assign` builds it: the same members in the same order.
 *
 * In Node 20's V8, an object literal that starts with a spread and then adds members (`{ ...call,
 * status }`) takes a slow path: each such object gets a map of its own, ~3 µs an object for a
 * small one and ~20 µs for a call record of ~25 members (a micro-benchmark; 3-4 µs this way). A
 * spread alone (`{ ...call }`) or after other members stays fast. `Object.assign` sets members
 * where a spread defines them, and the two differ only for a key `__proto__` (a setter on `{}`):
 * an object that has one as its own key is spread instead.
 */
export function extend<T extends object, U extends object>(base: T, fields: U): Omit<T, keyof U> & U {
  if (Object.hasOwn(base, '__proto__') || Object.hasOwn(fields, '__proto__')) return { ...base, ...fields };
  return Object.assign(Object.assign({}, base), fields);
}
