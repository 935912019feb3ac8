import { PerformanceObserver, constants, type PerformanceEntry } from 'node:perf_hooks';
import v8 from 'node:v8';
import vm from 'node:vm';

let gc: (() => void) | null = null;

/**
 * Runs a full garbage collection now, which also gives the pages it empties back. V8 exposes
 * `gc` only with `--expose-gc`: the flag is set once, for a new context that hands the function
 * out (the process itself keeps running without it). Used after journal replay, whose parsing
 * of every record leaves a heap the size of the backlog committed: replaying a 336 MB journal
 * left 269 MiB RSS without it, 167 MiB with it after each segment and at the end.
 */
export function collectGarbage(): void {
  if (!gc) {
    v8.setFlagsFromString('--expose-gc');
    gc = vm.runInNewContext('gc') as () => void;
  }
  gc();
}

/**
 * Room for V8's old generation to grow past what the last full collection left live, before the
 * next one starts (`service.heap_headroom_mib`).
 *
 * V8 sets the next limit from the live heap and a growing factor it picks itself, from how fast
 * its collector is next to the program's allocation in the old generation. A proxy allocates
 * little there, so the factor sits at its floor (1.1): the room is V8's minimum step, 8 MB. V8
 * also counts the memory of every `ArrayBuffer` allocated since the last full collection against
 * that room, and every socket read is one: with bodies of a few hundred KB the room is used up
 * after a few dozen calls, and a collection of the whole heap follows that finds little to free
 * (docs/capture-path.md, "Garbage collection").
 *
 * After each full collection the factor is set (V8's `--heap-growing-percent`, which V8 reads
 * each time it sets a limit) so that the room is about `headroom` bytes: a larger factor for a
 * small heap, V8's own choice once the live heap is so big that the room would be under a tenth
 * of it. The memory this may add is bounded by `headroom`, whatever the live heap.
 */
export class HeapHeadroom {
  /** The percent last set; 0 while V8 chooses. */
  percent = 0;
  private observer: PerformanceObserver | null = null;
  /** Under pressure the room is the least V8 gives (10 % of the live heap): none bought with memory. */
  private pressed = false;

  constructor(
    private readonly headroomBytes: number,
    private readonly setFlags: (flags: string) => void = v8.setFlagsFromString,
    private readonly liveBytes: () => number = () => v8.getHeapStatistics().used_heap_size,
  ) {}

  /** Sets the factor for the heap as it is, and again after every full collection. No-op for a headroom of 0. */
  start(): this {
    if (this.headroomBytes <= 0 || this.observer) return this;
    this.adjust();
    this.observer = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        if ((e as GcEntry).detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR) return this.adjust();
      }
    });
    this.observer.observe({ entryTypes: ['gc'] });
    return this;
  }

  /**
   * While the exporter is behind (closed episodes wait on disk) memory is what the outage costs
   * over time: the room for garbage is V8's least (10 % of the live heap) until it catches up.
   * Set explicitly: left to itself V8 may choose up to 4 times the live heap while the old
   * generation grows fast, as it does while a backlog builds (a 10-minute outage's soak went from
   * 205 to 284 MiB within 40 s when pressure meant V8's own choice).
   */
  pressure(on: boolean): void {
    if (on === this.pressed) return;
    this.pressed = on;
    if (this.observer) this.adjust();
  }

  stop(): void {
    this.observer?.disconnect();
    this.observer = null;
  }

  /** The factor for the live heap now: `headroom / live` in percent, within 10–300, or 0 (V8's own) below 10. */
  adjust(): number {
    const live = Math.max(1, this.liveBytes());
    let percent = this.pressed ? MIN_PERCENT : Math.min(MAX_PERCENT, Math.floor((this.headroomBytes / live) * 100));
    if (percent < MIN_PERCENT) percent = 0;
    if (percent !== this.percent) {
      this.setFlags(`--heap-growing-percent=${percent}`);
      this.percent = percent;
    }
    return percent;
  }
}

/** A `gc` performance entry (node adds what kind of collection it was). */
type GcEntry = PerformanceEntry & { detail?: { kind?: number } };

/** V8's own factor is at least 1.1 (below 10 % it gives as much room anyway) and at most 4 (300 %). */
const MIN_PERCENT = 10;
const MAX_PERCENT = 300;
