import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

type Results = Record<string, unknown>;
interface Screen {
  png: Buffer;
  url: string;
  sha256: string;
}
interface TrajectoryCheck {
  trajectories: number;
  complete: number;
  images: number;
  spans_ok: number;
  line_bytes: number;
  problems: string[];
}
interface StoreCheck {
  stored_files: number;
  added_files: number;
  added_bytes: number;
  sent_distinct: number;
  sent_png_bytes: number;
  problems: string[];
}
// The bench is plain JavaScript run by node; its modules are loaded as they run there. The checks
// need nothing compiled (the scenario's screenshots do; they are not made here).
/* eslint-disable @typescript-eslint/no-require-imports */
const report = require(path.join(__dirname, '../../bench/report.js')) as { markdown: (r: Results) => string };
const { mergeResults } = require(path.join(__dirname, '../../bench/merge-results.js')) as {
  mergeResults: (full: Results, partial: Results, command: string, note?: string) => Results;
};
const screenshots = require(path.join(__dirname, '../../bench/screenshots.js')) as {
  sidecarConfig: () => string;
  checkTrajectories: (dir: string, before: Map<string, number>, prefix: string, set: Screen[][], pads: number) => TrajectoryCheck;
  checkStore: (dataDir: string, before: Map<string, number>, set: Screen[][]) => StoreCheck;
  storedImages: (dataDir: string) => Map<string, number>;
  PROCESSOR: { factor: number; min_pixels: number; max_pixels: number };
  IMAGE_PAD: number;
};
/* eslint-enable @typescript-eslint/no-require-imports */

const machine = { cpu: 'test', cores: 2, memory_gib: 1, node: 'v20', os: 'test' };

/** A round of a target as screenshots.js writes it; a sidecar's has the capture's figures too. */
function round(p50: number, cpu: number | null, capture = false): Results {
  return {
    calls: 32,
    errors: 0,
    p50_ms: p50,
    p99_ms: p50 * 2,
    request_bytes_per_call: 254_000,
    upstream_requests: 32,
    upstream_images: 272,
    upstream_pad_counts: [1334],
    model_server_cpu_us_per_call: 9000,
    ...(cpu === null ? {} : { cpu_us_per_call_load: cpu / 2, cpu_us_per_call: cpu, peak_rss_mib: 90 }),
    ...(capture
      ? {
          export_s: 0.4,
          journal_bytes_per_call: 44_400,
          trajectory_bytes: 507_000,
          trajectory_bytes_per_call: 15_800,
          trajectories: 2,
          images_complete: 2,
          images: 32,
          spans_ok: 32,
          stored_files: 96,
          stored_added: 32,
          stored_bytes: 712_000,
          sent_distinct: 32,
          sent_png_bytes: 712_000,
        }
      : {}),
  };
}
const target = (r: Results): Results => ({ rounds: [r], median: Object.fromEntries(Object.entries(r).filter(([, v]) => typeof v === 'number')) });

function scenario(error: string | null = null): Results {
  return {
    agents: 2,
    turns: 16,
    width: 1280,
    height: 800,
    processor: { factor: 28, min_pixels: 3136, max_pixels: 12845056 },
    pads_per_image: 1334,
    png_bytes: { median: 21_750, min: 19_005, max: 26_967 },
    warmup_rounds: 2,
    rounds: 1,
    targets: {
      direct: target(round(11, null)),
      'bare-pipe': target(round(12, 1000)),
      'bare-persist': target(round(12.5, 2000)),
      sidecar: target(round(18, 14_000, true)),
    },
    images: {
      sent_distinct: 32,
      stored_added: 32,
      stored_files: 96,
      stored_bytes: 712_000,
      sent_png_bytes: 712_000,
      trajectories: 2,
      images_complete: 2,
      images: 32,
      spans_ok: 32,
    },
    ratios: {
      cpu_per_call_vs_persist: 7,
      cpu_per_call_vs_persist_paired: 6.9,
      cpu_per_call_load_vs_persist: 3.5,
      cpu_per_call_vs_bare: 14,
      persist_vs_bare: 2,
    },
    error,
  };
}

const results = (started: string, scenarios: Results): Results => ({ machine, quick: false, rounds: 3, duration_ms: 4000, started_at: started, scenarios });

describe('bench report: the screenshot agent', () => {
  it('renders its section with every figure, per target', () => {
    const md = report.markdown(results('now', { screenshots: scenario() }));
    expect(md).toContain('## Screenshot agent: 2 agents × 16 turns, a new 1280×800 PNG screenshot every turn (not a bar)');
    expect(md).toContain('PNGs of 19.0–27.0 KB, median 21.8');
    expect(md).toContain("each image expanded to the processor's 1334 pads");
    expect(md).toContain('`processors.images.processor` {"factor":28,"min_pixels":3136,"max_pixels":12845056}');
    expect(md).toContain("CPU is the target process's, from `/proc`, in 10 ms ticks (over a round's 32 calls, one tick is 313 µs a call).");
    expect(md).toContain(
      '| target | p50 ms/call | added p50 ms | CPU µs/call (calls) | CPU µs/call (+ export) | vs persisting pipe (+ export) | request KB/call | journal KB/call | stored KB/round | trajectory KB/call | peak RSS MiB | model server CPU µs/call | errors |',
    );
    expect(md).toContain('| direct | 11.0 (11.0–11.0) | – | – | – | – | 254.0 | – | – | – | – | 9000 | 0 |');
    expect(md).toContain('| bare-persist | 12.5 (12.5–12.5) | 1.5 | 1000 (1000–1000) | – | – | 254.0 | – | – | – | 90 | 9000 | 0 |');
    expect(md).toContain('| sidecar | 18.0 (18.0–18.0) | 7.0 | 7000 (7000–7000) | 14000 (14000–14000) | 7.00× | 254.0 | 44.4 | 712.0 | 15.8 | 90 | 9000 | 0 |');
    expect(md).toContain(
      "The sidecar's CPU per call, export included, is 7.00× the persisting pipe's (6.90× as the median of each round's own ratio; 3.50× during the calls alone) and 14.00× the bare pipe's; the persisting pipe's is 2.00× the bare pipe's.",
    );
    expect(md).toContain(
      'Images: 32 stored in `images/` for 32 distinct screenshots sent to the sidecar in the measured rounds (96 files at the end, warm-up included), 0.71 MB for 0.71 MB of distinct PNGs (1.000×)',
    );
    expect(md).toContain(
      'Checked: 2 trajectories, 2 `images_complete`, 32 of 32 images in the order sent with spans of 1334 image pads, masked out. No errors.',
    );
  });

  it('adds an informational row to the bars table and a row to the persisting pipe’s table', () => {
    const md = report.markdown(results('now', { screenshots: scenario() }));
    expect(md).toContain(
      '| Screenshot agent (2×16, a new 1280×800 PNG a turn; for information, no bar): CPU per call and what is kept | 14000 µs a call with export (7.00× the persisting pipe); 44.4 KB journaled and 15.8 KB of trajectory a call; 32 images stored for 32 distinct screenshots; 2 of 2 trajectories `images_complete` | – |',
    );
    expect(md).toContain('| Screenshot agent: CPU per call (export included) | 2000 µs | 2.00× | – | 7.00× | – | – | – |');
  });

  it('shows its error in the section and points at it from the bars table', () => {
    const md = report.markdown(results('now', { screenshots: scenario('sidecar round 0: 1 trajectories for 2 rollouts') }));
    expect(md).toContain('**Error:** sidecar round 0: 1 trajectories for 2 rollouts');
    expect(md).toContain('`images_complete`; **errors** (see its section) | – |');
  });

  it('is merged into a full run’s results like any scenario run alone', () => {
    const full = results('2026-01-01T00:00:00Z', { other: { from: 'the full run' } });
    const later = results('2026-01-02T00:00:00Z', { screenshots: scenario() });
    const merged = mergeResults(full, later, 'node bench/run.js --only screenshots');
    expect(Object.keys(merged.scenarios as Results).sort()).toEqual(['other', 'screenshots']);
    expect(report.markdown(merged)).toContain('**Not all from that run.** `screenshots` comes from a later run of those scenarios alone');
  });
});

describe('bench screenshots: the checks', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'bench-screens-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  const screen = (seed: number): Screen => {
    const png = Buffer.from(`not really a png ${seed}`);
    return { png, url: '', sha256: createHash('sha256').update(png).digest('hex') };
  };
  const PAD = screenshots.IMAGE_PAD;
  const processor = { image_token_id: PAD, ...screenshots.PROCESSOR };

  /** A trajectory of `screens` as the sidecar writes it: each image a run of `pads` pads after one text id. */
  function trajectory(rollout: string, screens: Screen[], pads: number): Results {
    const tokenIds: number[] = [];
    const images = screens.map((s, k) => {
      tokenIds.push(7);
      const start = tokenIds.length;
      for (let i = 0; i < pads; i++) tokenIds.push(PAD);
      return { order: k, sha256: s.sha256, mime: 'image/png', bytes: s.png.length, width: 1280, height: 800, url: null, start, length: pads };
    });
    tokenIds.push(8, 9);
    const mask = tokenIds.map((_, i) => (i >= tokenIds.length - 2 ? 1 : 0));
    return { rollout_id: rollout, token_ids: tokenIds, loss_mask: mask, images, images_complete: true, images_error: null, image_processor: processor };
  }

  it('passes trajectories whose images are the screenshots sent, in order, with full spans of pads', () => {
    const set = [
      [screen(1), screen(2)],
      [screen(3), screen(4)],
    ];
    const lines = [trajectory('ss0-sidecar-0', set[0], 3), trajectory('ss0-sidecar-1', set[1], 3), { ...trajectory('other-0', set[0], 3) }];
    writeFileSync(path.join(dir, 'a.ndjson'), lines.map((x) => JSON.stringify(x)).join('\n') + '\n');
    const c = screenshots.checkTrajectories(dir, new Map(), 'ss0-sidecar', set, 3);
    expect(c).toMatchObject({ trajectories: 2, complete: 2, images: 4, spans_ok: 4, problems: [] });
  });

  it('finds an incomplete trajectory, images out of order, a short span and a missing rollout', () => {
    const set = [
      [screen(1), screen(2)],
      [screen(3), screen(4)],
      [screen(5), screen(6)],
    ];
    const incomplete = { ...trajectory('ss1-sidecar-0', set[0], 3), images_complete: false, images_error: 'placeholder_length: image 1' };
    const swapped = trajectory('ss1-sidecar-1', [set[1][1], set[1][0]], 2);
    writeFileSync(path.join(dir, 'a.ndjson'), [incomplete, swapped].map((x) => JSON.stringify(x)).join('\n') + '\n');
    const c = screenshots.checkTrajectories(dir, new Map(), 'ss1-sidecar', set, 3);
    expect(c.trajectories).toBe(2);
    expect(c.complete).toBe(1);
    expect(c.spans_ok).toBe(2);
    expect(c.problems).toEqual([
      'ss1-sidecar-0: images_complete false, placeholder_length: image 1',
      'ss1-sidecar-1 image 0: not the screenshot sent there',
      'ss1-sidecar-1 image 1: not the screenshot sent there',
      'ss1-sidecar-2: 0 trajectories',
    ]);
    // Only what was written since `before` counts.
    const before = new Map([['a.ndjson', 1e9]]);
    expect(screenshots.checkTrajectories(dir, before, 'ss1-sidecar', set, 3).trajectories).toBe(0);
  });

  it('checks the image store: each screenshot once, by its hash, with the bytes sent', () => {
    const set = [[screen(1), screen(2)], [screen(3)]];
    const store = (s: Screen, bytes = s.png) => {
      mkdirSync(path.join(dir, 'images', s.sha256.slice(0, 2)), { recursive: true });
      writeFileSync(path.join(dir, 'images', s.sha256.slice(0, 2), `${s.sha256}.png`), bytes);
    };
    const earlier = screen(0);
    store(earlier);
    const before = screenshots.storedImages(dir);
    for (const s of set.flat()) store(s);
    const ok = screenshots.checkStore(dir, before, set);
    expect(ok).toEqual({
      stored_files: 4,
      added_files: 3,
      added_bytes: set.flat().reduce((n, s) => n + s.png.length, 0),
      sent_distinct: 3,
      sent_png_bytes: set.flat().reduce((n, s) => n + s.png.length, 0),
      problems: [],
    });
    store(set[0][1], Buffer.from('other bytes'));
    rmSync(path.join(dir, 'images', set[1][0].sha256.slice(0, 2), `${set[1][0].sha256}.png`));
    const bad = screenshots.checkStore(dir, before, set);
    expect(bad.added_files).toBe(2);
    expect(bad.problems).toEqual([
      `screenshot ${set[0][1].sha256.slice(0, 12)} stored with other bytes`,
      `screenshot ${set[1][0].sha256.slice(0, 12)} not stored`,
    ]);
  });

  it('configures the sidecar with Qwen2.5-VL’s processor settings', () => {
    expect(screenshots.sidecarConfig()).toBe('processors:\n  images:\n    processor:\n      factor: 28\n      min_pixels: 3136\n      max_pixels: 12845056\n');
  });
});
