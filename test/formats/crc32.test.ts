import fc from 'fast-check';
import { crc32 as zlibCrc32 } from 'node:zlib';
import { CRC32_IMPLEMENTATION, NATIVE_FROM, crc32 } from '../../src/formats/crc32';
import { decodeFrame, frameHeader } from '../../src/journal/frame';

describe('journal CRC-32', () => {
  test('the native implementation is loaded where the package ships a binary (this machine and CI: Linux x64 glibc)', () => {
    if (process.platform === 'linux' && process.arch === 'x64') expect(CRC32_IMPLEMENTATION).toBe('node-rs');
    else expect(['node-rs', 'zlib']).toContain(CRC32_IMPLEMENTATION);
  });

  test('where the package cannot be loaded (no binary for the platform), zlib computes every CRC-32', () => {
    jest.isolateModules(() => {
      jest.doMock('@node-rs/crc32', () => {
        throw new Error('Cannot find native binding');
      });
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const fallback = require('../../src/formats/crc32') as typeof import('../../src/formats/crc32');
      expect(fallback.CRC32_IMPLEMENTATION).toBe('zlib');
      const big = Buffer.alloc(3 * NATIVE_FROM, 0x5a);
      expect(fallback.crc32(big, 99)).toBe(zlibCrc32(big, 99));
    });
    jest.dontMock('@node-rs/crc32');
  });

  test('a binding that gives another value than zlib is not used', () => {
    jest.isolateModules(() => {
      jest.doMock('@node-rs/crc32', () => ({ crc32: () => 0 }));
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const checked = require('../../src/formats/crc32') as typeof import('../../src/formats/crc32');
      expect(checked.CRC32_IMPLEMENTATION).toBe('zlib');
    });
    jest.dontMock('@node-rs/crc32');
  });

  test('equals zlib for any bytes and initial value, on both sides of the size where it switches', () => {
    const sizes = fc.oneof(fc.integer({ min: 0, max: 64 }), fc.integer({ min: NATIVE_FROM - 8, max: NATIVE_FROM + 8 }), fc.integer({ min: 0, max: 70_000 }));
    fc.assert(
      fc.property(sizes, fc.integer({ min: 0, max: 0xffffffff }), fc.integer(), (n, initial, seed) => {
        const b = Buffer.allocUnsafe(n);
        let x = seed | 0;
        for (let i = 0; i < n; i++) b[i] = (x = (Math.imul(x, 1103515245) + 12345) | 0) >>> 24;
        expect(crc32(b, initial)).toBe(zlibCrc32(b, initial));
        expect(crc32(b)).toBe(zlibCrc32(b));
      }),
      { numRuns: 400 },
    );
  });

  test('a checksum continued piece by piece equals the whole one, whichever implementation each piece takes', () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 3 * NATIVE_FROM }), { minLength: 1, maxLength: 8 }), (lengths) => {
        const parts = lengths.map((n, k) => Buffer.alloc(n, (k * 37 + 11) & 0xff));
        let c = 0;
        for (const p of parts) c = crc32(p, c);
        expect(c).toBe(zlibCrc32(Buffer.concat(parts)));
      }),
      { numRuns: 300 },
    );
  });

  test('a frame whose body is large is read back, and one flipped bit in it is found', () => {
    const body = Buffer.alloc(200_000);
    for (let i = 0; i < body.length; i++) body[i] = (i * 7919) & 0xff;
    const parts = [body.subarray(0, 3), body.subarray(3, 150_000), body.subarray(150_000)];
    const frame = Buffer.concat([frameHeader(42, parts, body.length), body]);
    const read = decodeFrame(frame, 0);
    expect(read.kind).toBe('frame');
    if (read.kind === 'frame') {
      expect(read.offset).toBe(42);
      expect(read.payload.equals(body)).toBe(true);
    }
    // The header's checksum is the one zlib gives over the offset and the payload (the format as documented).
    expect(frame.readUInt32BE(4)).toBe(zlibCrc32(Buffer.concat([frame.subarray(8, 16), body])));
    frame[16 + 123_456] ^= 0x10;
    expect(decodeFrame(frame, 0)).toEqual({ kind: 'corrupt', reason: 'checksum mismatch' });
  });
});
