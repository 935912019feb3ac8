import path from 'node:path';

type Results = Record<string, unknown>;
// The bench is plain JavaScript run by node; its report is loaded as it runs there.
/* eslint-disable @typescript-eslint/no-require-imports */
const report = require(path.join(__dirname, '../../bench/report.js')) as { markdown: (r: Results) => string };
const { mergeResults } = require(path.join(__dirname, '../../bench/merge-results.js')) as {
  mergeResults: (full: Results, partial: Results, command: string, note?: string) => Results & { reruns: Results[] };
};
const { subtitle } = require(path.join(__dirname, '../../bench/render-report.js')) as { subtitle: (r: Results, family?: string) => string };
/* eslint-enable @typescript-eslint/no-require-imports */

const machine = { cpu: 'test', cores: 2, memory_gib: 1, node: 'v20', os: 'test' };

/** A growing-context round of a target, as growing-context.js writes it. */
const round = (p50: number, cpu: number, peak: number, viewer?: Results) => ({
  calls: 192,
  errors: 0,
  p50,
  p99: p50 * 2,
  cpu_us_per_call_load: cpu / 2,
  cpu_us_per_call: cpu,
  cpu_us_per_call_main: cpu / 2,
  peak_rss_mib: peak,
  ...(viewer ? { viewer } : {}),
});
const polled = {
  polls: 2,
  now_bytes: 3000,
  max_now_bytes: 2000,
  max_open: 8,
  max_closed: 32,
  trajectories: 8,
  trajectory_bytes: 4e6,
  trajectories_missing: 0,
  trajectories_wrong: 0,
  errors: 0,
  last_ring: { episodes: 32, bytes: 31 * 2 ** 20, max_bytes: 32 * 2 ** 20 },
};

function results(started: string): Results {
  return {
    machine,
    quick: false,
    rounds: 3,
    duration_ms: 4000,
    started_at: started,
    scenarios: {
      growing_context: {
        agents: 8,
        turns: 24,
        turn_bytes: 8192,
        warmup_rounds: 8,
        targets: {
          direct: { rounds: [round(10, NaN, NaN)] },
          'bare-pipe': { rounds: [round(12, 800, 80)] },
          sidecar: {
            rounds: [round(14, 2000, 150)],
            verify: [{ rollouts: 8, trajectories: 8, calls: 192, wrong: 0, bytes_per_episode: 5e5, max_record_to_arrays: 1.01 }],
          },
          'sidecar+viewer': { rounds: [round(14.5, 2100, 180, polled)], verify: [{ rollouts: 8, trajectories: 8, calls: 192, wrong: 0 }] },
        },
      },
      memory: {
        episodes: 1000,
        calls_per_episode: 20,
        open_episodes: 1000,
        rss_before_mib: 70,
        rss_mib: 130,
        peak_rss_mib: 135,
        cpu_us_per_call: 400,
        viewer: {
          episodes: 1000,
          calls_per_episode: 20,
          open_episodes: 1000,
          rss_before_mib: 70,
          rss_mib: 160,
          peak_rss_mib: 170,
          cpu_us_per_call: 450,
          poller: { ...polled, polls: 20, max_open: 1000, max_now_bytes: 400_000 },
        },
      },
      // A scenario the report does not draw, standing for every other one of a full run.
      other: { from: 'the full run' },
    },
  };
}

describe('bench report: the viewer polled', () => {
  it('holds the memory bars against sidecar+viewer too, and sets its figures beside the sidecar’s', () => {
    const md = report.markdown(results('then'));
    expect(md).toContain(
      '| Growing context: peak RSS ≤ 200 MiB with every episode open, with the viewer polled | 180 MiB (sidecar+viewer; the sidecar 150 MiB); CPU per call 2100 µs with export against 2000 | yes |',
    );
    expect(md).toContain(
      "| Memory: RSS ≤ 150 MiB with 1,000 open episodes × 20 calls, with the viewer polled | 160 MiB with 1000 open episodes × 20 (sidecar+viewer; peak 170 MiB, the sidecar's 135) | **no** |",
    );
    expect(md).toContain('| sidecar+viewer | 4.50 |');
    expect(md).toMatch(
      /peak RSS 180 MiB at most over rounds \(median 180\) against `sidecar`'s 150 \(median 150\); CPU per call 2100 µs with export against 2000 \(1\.05×\)/,
    );
    expect(md).toContain('loaded 8 trajectories (4.0 MB of JSON); 0 listed but gone when asked, 0 wrong or failed.');
    expect(md).toContain("RSS 160 MiB (70 MiB before), peak 170 MiB, against the sidecar's 130 MiB and peak 135 MiB; CPU per call 450 µs against 400.");
  });

  it('merges a later run of some scenarios and says which scenarios come from it', () => {
    const full = results('2026-01-01T00:00:00Z');
    const run = results('2026-01-02T00:00:00Z');
    const later = { ...run, scenarios: { memory: (run.scenarios as Results).memory } };
    const merged = mergeResults(full, later, 'node bench/run.js --only memory', 'The machine was busy.');
    expect(Object.keys(merged.scenarios as Results).sort()).toEqual(['growing_context', 'memory', 'other']);
    expect(merged.started_at).toBe('2026-01-01T00:00:00Z');
    expect(merged.reruns).toEqual([
      expect.objectContaining({
        command: 'node bench/run.js --only memory',
        note: 'The machine was busy.',
        scenarios: ['memory'],
        started_at: '2026-01-02T00:00:00Z',
      }),
    ]);
    expect(report.markdown(merged)).toContain('every other scenario, and the fresh-memory figure below, is from the run above. The machine was busy.');
    expect(report.markdown(merged)).toContain(
      '**Not all from that run.** `memory` comes from a later run of those scenarios alone (`node bench/run.js --only memory`), started 2026-01-02T00:00:00Z',
    );
    // A chart names the run its scenario comes from.
    expect(subtitle(merged, 'growing-context')).toMatch(/^Run 2026-01-01T00:00:00Z: /);
    expect(subtitle(merged, 'memory')).toMatch(/^Run 2026-01-02T00:00:00Z \(node bench\/run\.js --only memory\): /);
    // Run again later still: the latest run names it, the earlier one no longer does.
    const again = mergeResults(merged, { ...later, started_at: '2026-01-03T00:00:00Z' }, 'again');
    expect(again.reruns.map((x) => x.started_at)).toEqual(['2026-01-03T00:00:00Z']);
  });
});
