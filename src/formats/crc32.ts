import { crc32 as zlibCrc32 } from 'node:zlib';

/**
 * CRC-32 (IEEE 802.3, as zlib and gzip compute it) of a buffer, continuing from `initial`.
 *
 * The journal checksums every byte it frames, on the event loop, and zlib's CRC-32 runs at about
 * 2.5 GB/s on the machines this is measured on (~430 µs a MiB of prompt). `@node-rs/crc32` computes
 * the same function with carry-less multiplication (PCLMULQDQ; ~7 GB/s there), but a call into it
 * costs more than zlib's for small buffers: buffers under `NATIVE_FROM` bytes go to zlib. Both give
 * the same value for the same bytes and initial value, so one checksum can be continued by either
 * (a frame's header with zlib, its body with the other). Where the package has no binary for the
 * platform it is not loaded, and zlib computes everything.
 */
export const NATIVE_FROM = 1024;

type Crc32 = (input: Uint8Array, initial?: number) => number;

function loadNative(): Crc32 | null {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const m = require('@node-rs/crc32') as { crc32: (input: Uint8Array, initialState?: number | null) => number };
    // Checked once: the same value as zlib's for a buffer that crosses the size at which it is used.
    const probe = Buffer.alloc(NATIVE_FROM + 13, 0xa5);
    return m.crc32(probe, 7) === zlibCrc32(probe, 7) ? m.crc32 : null;
  } catch {
    return null;
  }
}

const native = loadNative();

/** Which implementation computes CRC-32 of large buffers in this process. */
export const CRC32_IMPLEMENTATION: 'node-rs' | 'zlib' = native ? 'node-rs' : 'zlib';

export function crc32(input: Uint8Array, initial = 0): number {
  return native !== null && input.length >= NATIVE_FROM ? native(input, initial) : zlibCrc32(input, initial);
}
