import { constants, crc32, deflateRaw, gzip, unzip, type ZlibOptions } from 'node:zlib';

/** Input a piece of a gzip member holds: big enough that a piece's fixed cost is noise. */
export const PIECE_BYTES = 256 * 1024;
/** Pieces compressed at once: two of libuv's four pool threads, the others left to the journal's fsync and file reads. */
export const PIECES_AT_ONCE = 2;
/** Deflate's window: each piece is compressed with the input before it as its dictionary. */
const WINDOW = 32 * 1024;
/**
 * zlib's output buffer: Node goes back to the main thread each time one fills (16 KiB by
 * default), so a piece's output fits in one.
 */
const OUT_CHUNK = 512 * 1024;

/** gzip's member header (RFC 1952): deflate, no flags, no time, no extra flags, OS unknown. */
const HEADER = Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);

function deflatePiece(piece: Buffer, options: ZlibOptions): Promise<Buffer> {
  return new Promise((resolve, reject) => deflateRaw(piece, options, (err, out) => (err ? reject(err) : resolve(out))));
}

/**
 * One gzip member (RFC 1952) of `input`, the pieces of `pieceBytes` each compressed on libuv's
 * pool, `atOnce` at a time, as pigz does: piece i is raw deflate with the 32 KiB of input before
 * it as its dictionary, ended with a sync flush (an empty stored block, so the next piece starts
 * on a byte), the last one ended as deflate ends a stream. The member is what one deflate of the
 * whole input could have written: any gzip reader reads it, and it compresses as well but for a
 * few bytes a piece. Input up to 1.5 pieces is one `zlib.gzip`.
 */
export async function gzipInPieces(
  input: Buffer,
  level: number = constants.Z_DEFAULT_COMPRESSION,
  pieceBytes = PIECE_BYTES,
  atOnce = PIECES_AT_ONCE,
): Promise<Buffer> {
  if (input.length <= pieceBytes * 1.5)
    return new Promise((resolve, reject) => gzip(input, { level, chunkSize: OUT_CHUNK }, (err, out) => (err ? reject(err) : resolve(out))));
  const starts: number[] = [];
  for (let at = 0; at < input.length; at += pieceBytes) starts.push(at);
  // A short tail goes with the piece before it.
  if (input.length - starts[starts.length - 1] < pieceBytes / 2) starts.pop();
  const out: Buffer[] = new Array<Buffer>(starts.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < starts.length) {
      const i = next++;
      const from = starts[i];
      const last = i === starts.length - 1;
      const to = last ? input.length : starts[i + 1];
      out[i] = await deflatePiece(input.subarray(from, to), {
        level,
        chunkSize: OUT_CHUNK,
        dictionary: from === 0 ? undefined : input.subarray(Math.max(0, from - WINDOW), from),
        finishFlush: last ? constants.Z_FINISH : constants.Z_SYNC_FLUSH,
      });
    }
  };
  const workers: Promise<void>[] = [];
  for (let w = 0; w < Math.min(atOnce, starts.length); w++) workers.push(worker());
  await Promise.all(workers);
  const trailer = Buffer.allocUnsafe(8);
  trailer.writeUInt32LE(crc32(input), 0);
  trailer.writeUInt32LE(input.length % 2 ** 32, 4);
  return Buffer.concat([HEADER, ...out, trailer]);
}

/** kafkajs' codec interface: `compress` gets its encoder (the records' bytes in `buffer`). */
export interface KafkajsCodec {
  compress(encoder: { buffer: Buffer }): Promise<Buffer>;
  decompress(buffer: Buffer): Promise<Buffer>;
}

/**
 * kafkajs' gzip codec with compression in pieces: kafkajs compresses a whole produce request's
 * records with one `zlib.gzip`, one pool thread, while the main thread waits; a drain after an
 * outage is bound by it. Reading is kafkajs' own (`zlib.unzip`).
 */
export const PIECEWISE_GZIP: KafkajsCodec = {
  compress: (encoder) => gzipInPieces(encoder.buffer),
  decompress: (buffer) => new Promise((resolve, reject) => unzip(buffer, (err, out) => (err ? reject(err) : resolve(out)))),
};
