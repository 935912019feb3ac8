/** `*` any run of characters, `?` one character; everything else literal; whole-string match. */
export function globToRegExp(glob: string): RegExp {
  const body = glob
    .replace(/[.+^${}()|[\]\\]/g, '\\$&')
    .replace(/\*/g, '.*')
    .replace(/\?/g, '.');
  return new RegExp(`^${body}$`);
}

export function matchesAny(value: string | null, globs: readonly RegExp[]): boolean {
  return value !== null && globs.some((g) => g.test(value));
}
