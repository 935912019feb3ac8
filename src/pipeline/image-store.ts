import { existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { imagePath } from '../formats/images';
import type { ClosedEpisode, TrajectoryImages } from '../model/records';
import type { Metrics } from '../telemetry/metrics';

/**
 * The images of trajectories, stored once each by content (docs/images.md): `{data_dir}/images/
 * <first two hex digits>/<sha256>.<ext>`, the bytes exactly as the agent sent them. Stored when an
 * episode's records are built, before any of them is exported; an image that cannot be stored
 * makes its trajectory `images_complete: false` (`store_failed`), never a record that looks whole.
 * A file is written under a temporary name and renamed, so a reader never sees half an image.
 */
export class ImageStore {
  /** Hashes known to be on disk (bounded: past it, the disk is asked). */
  private readonly known = new Set<string>();

  constructor(
    readonly dir: string,
    private readonly m: Metrics,
  ) {}

  /** Stores every trajectory's images and counts how each trajectory's images came out. */
  storeEpisode(c: ClosedEpisode): void {
    for (const t of c.trajectories) {
      if (t.images === null) continue;
      this.store(t.images);
      this.m.trajectoryImages.inc({ outcome: t.images.complete ? 'complete' : (t.images.error ?? 'unknown').split(':')[0] });
    }
  }

  private store(images: TrajectoryImages): void {
    const pending = images.pending ?? [];
    // The bytes are not kept past this: the episode may wait in memory for its exporter.
    delete images.pending;
    images.images.forEach((image, i) => {
      const bytes = pending[i];
      if (!bytes || image.sha256 === null) return;
      try {
        this.m.imagesStored.inc({ result: this.write(image.sha256, image.mime, bytes) });
      } catch (err) {
        this.m.imagesStored.inc({ result: 'failed' });
        if (images.complete) [images.complete, images.error] = [false, `store_failed: image ${image.order}: ${(err as Error).message}`];
      }
    });
  }

  private write(sha256: string, mime: string | null, bytes: Buffer): 'written' | 'already_stored' {
    const file = imagePath(this.dir, sha256, mime);
    if (this.known.has(file) || existsSync(file)) {
      this.remember(file);
      return 'already_stored';
    }
    mkdirSync(path.dirname(file), { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    writeFileSync(tmp, bytes);
    renameSync(tmp, file);
    this.remember(file);
    return 'written';
  }

  private remember(file: string): void {
    if (this.known.size >= 100_000) this.known.clear();
    this.known.add(file);
  }
}
