import { readFileSync } from 'node:fs';
import path from 'node:path';
import { TokenizerLoader } from '@lenml/tokenizers';

/**
 * Each token's text, for the viewer, from the model's tokenizer files (`tokenizer.json`,
 * `tokenizer_config.json`). A token is decoded alone (special tokens kept), so a character the
 * tokenizer spreads over several tokens shows as replacement characters on each; the ids are what
 * the trajectory holds. Pieces are remembered by id: a trajectory reuses few distinct ids.
 */
export class TokenDecoder {
  private readonly tok: ReturnType<typeof TokenizerLoader.fromPreTrained>;
  private readonly cache = new Map<number, string>();

  constructor(dir: string) {
    const read = (name: string) => JSON.parse(readFileSync(path.join(dir, name), 'utf8')) as Record<string, unknown>;
    this.tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: read('tokenizer.json'), tokenizerConfig: read('tokenizer_config.json') });
  }

  pieces(ids: ArrayLike<number>): string[] {
    const out = new Array<string>(ids.length);
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      let piece = this.cache.get(id);
      if (piece === undefined) {
        piece = this.tok.decode([id], { skip_special_tokens: false });
        if (this.cache.size < 200_000) this.cache.set(id, piece);
      }
      out[i] = piece;
    }
    return out;
  }
}
