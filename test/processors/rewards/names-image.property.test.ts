import fc from 'fast-check';
import { namesImage } from '../../../src/formats/images';

/*
 * A request that names no image is not parsed when its trajectory is built: one pass finds both
 * names. It must say what the two searches it replaced said, for any bytes (names cut short,
 * repeated, back to back, at the end).
 */
describe('namesImage', () => {
  const pieces = ['"image', '"image"', '"image_url"', '"image_ur', '_url"', '"', 'image', 'url', 'x', '"images"', '"image_url_x"', '{"type":"text"}', 'é'];

  it('agrees with searching for "image_url" and "image" one after the other', () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom(...pieces), { maxLength: 12 }), (parts) => {
        const bytes = Buffer.from(parts.join(''));
        expect(namesImage(bytes)).toBe(bytes.includes('"image_url"') || bytes.includes('"image"'));
      }),
      { numRuns: 2000 },
    );
  });

  it('finds a name after many near misses, and at the very end of the bytes', () => {
    expect(namesImage(Buffer.from(`${'"image_ur'.repeat(1000)}"image"`))).toBe(true);
    expect(namesImage(Buffer.from(`${'"imagex'.repeat(1000)}"image_url"`))).toBe(true);
    expect(namesImage(Buffer.from('"image_url'))).toBe(false);
    expect(namesImage(Buffer.from('y'.repeat(1 << 20)))).toBe(false);
  });
});
