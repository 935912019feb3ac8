import { promisify } from 'node:util';
import { constants, deflateRaw, gzip, unzip } from 'node:zlib';
import { crc32 } from '../../formats/crc32';

/** Input a piece of a gzip member holds: big enough that a piece's fixed cost is noise. */
export const PIECE_BYTES = 256 * 1024;
/** Pieces compressed at once: two of libuv's four pool threads, the others left to the journal's fsync and file reads. */
export const PIECES_AT_ONCE = 2;
/** Deflate's window: each piece is compressed with the input before it as its dictionary. */
const WINDOW = 32 * 1024;
/**
 * zlib's output buffer: Node goes back to the main thread each time one fills (16 KiB by
 * default). A piece of text and ids fills two or so; each piece allocates one whatever its
 * output, so it is not made as big as a piece.
 */
const OUT_CHUNK = 64 * 1024;

/** gzip's member header (RFC 1952): deflate, no flags, no time, no extra flags, OS unknown. */
const HEADER = Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);

const gzipAsync = promisify(gzip);
const deflateRawAsync = promisify(deflateRaw);
const unzipAsync = promisify(unzip);

/**
 * Below this ratio (compressed to input) of its first piece, an input is compressed on one thread:
 * deflate finds long matches in such bytes and runs several times faster (records that repeat
 * each other, 69× in the bench's drain of 2 KB records), so the drain waits on the event loop, not
 * on compression, and a second thread only takes a core from it (the 2 KB drain fell ~20 % with it).
 */
export const ONE_THREAD_BELOW = 0.2;

/**
 * One gzip member (RFC 1952) of `input`, compressed in pieces of `pieceBytes` on libuv's pool, as
 * pigz does: piece i is raw deflate with the 32 KiB of input before it as its dictionary, ended
 * with a sync flush (an empty stored block, so the next piece starts on a byte), the last one
 * ended as deflate ends a stream. The member is what one deflate of the whole input could have
 * written: any gzip reader reads it, and it compresses as well but for a few bytes a piece. The
 * first piece is compressed alone; when it compresses below `oneThreadBelow`, the input is
 * compressed again whole, by one `zlib.gzip` (the first piece costs little then), else the rest
 * goes `atOnce` pieces at a time. Input up to 1.5 pieces is one `zlib.gzip`.
 */
export async function gzipInPieces(
  input: Buffer,
  level: number = constants.Z_DEFAULT_COMPRESSION,
  pieceBytes = PIECE_BYTES,
  atOnce = PIECES_AT_ONCE,
  oneThreadBelow = ONE_THREAD_BELOW,
): Promise<Buffer> {
  if (input.length <= pieceBytes * 1.5) return gzipAsync(input, { level });
  const starts: number[] = [];
  for (let at = 0; at < input.length; at += pieceBytes) starts.push(at);
  // A short tail goes with the piece before it.
  if (input.length - starts[starts.length - 1] < pieceBytes / 2) starts.pop();
  const piece = (i: number): Promise<Buffer> => {
    const from = starts[i];
    const last = i === starts.length - 1;
    return deflateRawAsync(input.subarray(from, last ? input.length : starts[i + 1]), {
      level,
      chunkSize: OUT_CHUNK,
      dictionary: from === 0 ? undefined : input.subarray(Math.max(0, from - WINDOW), from),
      finishFlush: last ? constants.Z_FINISH : constants.Z_SYNC_FLUSH,
    });
  };
  const first = await piece(0);
  if (first.length < oneThreadBelow * starts[1]) return gzipAsync(input, { level });
  const out: Buffer[] = new Array<Buffer>(starts.length);
  out[0] = first;
  let next = 1;
  const worker = async (): Promise<void> => {
    while (next < starts.length) {
      const i = next++;
      out[i] = await piece(i);
    }
  };
  const workers: Promise<void>[] = [];
  for (let w = 0; w < Math.min(atOnce, starts.length - 1); w++) workers.push(worker());
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
  decompress: (buffer) => unzipAsync(buffer),
};
