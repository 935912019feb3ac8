/** `buf` cut at the given offsets (in order): the chunks a stream might deliver it in. */
export function splitAt(buf: Buffer, cuts: readonly number[]): Buffer[] {
  const chunks: Buffer[] = [];
  let at = 0;
  for (const c of cuts) {
    chunks.push(buf.subarray(at, c));
    at = c;
  }
  chunks.push(buf.subarray(at));
  return chunks;
}
