import path from 'node:path';

type Results = Record<string, unknown>;
interface Comparison {
  rows: string[][];
  notes: string[];
}
// The bench is plain JavaScript run by node; its report is loaded as it runs there.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const report = require(path.join(__dirname, '../../bench/report.js')) as {
  markdown: (r: Results) => string;
  portkeyComparison: (r: Results) => Comparison | null;
  sseSkipped: (r: Results) => string | null;
};

const one = (median: number) => ({ median, min: median, max: median });
/** A JSON scenario's entry for one target, as run.js writes it. */
const json = (rps: number, p50: number, p99: number, cpu: number, rss: number, requests: number) => ({
  rps: one(rps),
  p50_ms: one(p50),
  p99_ms: one(p99),
  cpu_us_per_req: one(cpu),
  rss_mib: one(rss),
  errors: 0,
  requests,
  upstream_requests: requests,
});
const sse = (ttfb: number, total: number, cpu: number, rss: number) => ({
  ttfb_p50_ms: one(ttfb),
  ttfb_p99_ms: one(ttfb * 2),
  total_p50_ms: one(total),
  cpu_us_per_chunk: one(cpu),
  rss_mib: one(rss),
  errors: 0,
  requests: 80,
  upstream_requests: 80,
});
const machine = { cpu: 'test', cores: 2, memory_gib: 1, node: 'v20', os: 'test' };

function results(portkey: Results | undefined, withSse: boolean): Results {
  const j = (pk: boolean) => ({
    direct: json(800, 1.2, 1.5, NaN, NaN, 960),
    'bare-pipe': json(600, 1.5, 2, 250, 55, 720),
    'bare-persist': json(590, 1.6, 2.1, 260, 56, 708),
    ...(pk ? { portkey: json(300, 3.2, 9, 2000, 130, 360) } : {}),
    sidecar: json(500, 1.7, 4, 500, 100, 600),
  });
  return {
    machine,
    quick: true,
    rounds: 1,
    duration_ms: 1200,
    started_at: 'now',
    ...(portkey ? { portkey } : {}),
    scenarios: {
      json_c1: j(Boolean(portkey?.json)),
      json_c16: j(Boolean(portkey?.json)),
      sse_c4: {
        direct: sse(1.5, 60, NaN, NaN),
        'bare-pipe': sse(1.8, 60, 35, 55),
        'bare-persist': sse(1.9, 60.5, 40, 56),
        ...(withSse ? { portkey: sse(27.5, 86, 70, 130) } : {}),
        sidecar: sse(1.9, 61, 60, 100),
      },
    },
  };
}

const served = { status: 200, identical: true, reached_upstream: 1 };
const failed = {
  status: 500,
  identical: false,
  reached_upstream: 1,
  answer: '{"status":"failure","message":"Something went wrong"}',
  log: 'tryTargetsRecursively error:  immutable undefined TypeError: immutable\n    at appendHeader (node:internal/deps/undici/undici:8874:15)',
};

describe('bench report: the sidecar against Portkey', () => {
  it('says nothing for results from before Portkey was in the bench', () => {
    const r = results(undefined, false);
    expect(report.portkeyComparison(r)).toBeNull();
    expect(report.sseSkipped(r)).toBeNull();
    expect(report.markdown(r)).not.toMatch(/Portkey|portkey/);
  });

  it('says why it was not measured when the package is missing', () => {
    const c = report.portkeyComparison(results({ measured: false, reason: 'not installed' }, false));
    expect(c).toEqual({ rows: [], notes: ["Portkey's gateway was not measured: not installed."] });
  });

  it('gives every measure with the sidecar over Portkey', () => {
    const pk = { version: '1.15.2', json: served, sse: served, logged_bytes_before_rounds: 0, logged_bytes_in_rounds: 0, refused_connections: 0 };
    const c = report.portkeyComparison(results(pk, true));
    if (!c) throw new Error('no comparison');
    const row = (measure: string) => c.rows.find((x) => x[0] === measure);
    // Added p50 is against direct: portkey 3.2 − 1.2, the sidecar 1.7 − 1.2.
    expect(row('JSON c=1: added p50 vs direct')).toEqual(['JSON c=1: added p50 vs direct', '2.000 ms', '0.500 ms', '0.25×']);
    expect(row('JSON c=1: p99')).toEqual(['JSON c=1: p99', '9.000 ms', '4.000 ms', '0.44×']);
    expect(row('JSON c=1: CPU per request')).toEqual(['JSON c=1: CPU per request', '2000 µs', '500 µs', '0.25×']);
    expect(row('JSON c=16: req/s')).toEqual(['JSON c=16: req/s', '300', '500', '1.67×']);
    expect(row('JSON c=16: RSS')).toEqual(['JSON c=16: RSS', '130 MiB', '100 MiB', '0.77×']);
    expect(row('SSE: added TTFB p50 vs direct')).toEqual(['SSE: added TTFB p50 vs direct', '26.000 ms', '0.400 ms', '0.02×']);
    expect(row('SSE: CPU per chunk')).toEqual(['SSE: CPU per chunk', '70.0 µs', '60.0 µs', '0.86×']);
    expect(c.notes).toContain(
      "Checked before its rounds: a JSON answer through it was byte for byte the model server's answer; a stream through it was byte for byte the model server's answer.",
    );
    expect(c.notes).toContain(
      'Its calls that reached the model server, of the requests it answered: JSON c=1: 360 of 360; JSON c=16: 360 of 360; SSE: 80 of 80.',
    );
    expect(c.notes.some((n) => n.includes('could not serve'))).toBe(false);
  });

  it('leaves no ratio where a figure is not above zero', () => {
    const r = results({ json: served, sse: served }, true);
    const j1 = (r.scenarios as Record<string, Record<string, { p50_ms: unknown }>>).json_c1;
    j1.portkey.p50_ms = one(1.1); // faster than direct: an added p50 below zero
    const c = report.portkeyComparison(r);
    expect(c?.rows.find((x) => x[0] === 'JSON c=1: added p50 vs direct')).toEqual(['JSON c=1: added p50 vs direct', '-0.100 ms', '0.500 ms', '–']);
  });

  it('says so when Portkey could not serve the SSE scenario, with its answer and log', () => {
    const pk = { version: '1.15.2', json: served, sse: failed, logged_bytes_before_rounds: 949, logged_bytes_in_rounds: 0, refused_connections: 0 };
    const r = results(pk, false);
    const c = report.portkeyComparison(r);
    if (!c) throw new Error('no comparison');
    expect(c.rows.some((x) => x[0].startsWith('SSE'))).toBe(false);
    expect(c.notes).toContain('**Portkey could not serve the SSE scenario** and was not measured on it.');
    expect(c.notes.join('\n')).toContain(
      'a stream through it answered 500 `{"status":"failure","message":"Something went wrong"}`, and logged `tryTargetsRecursively error:  immutable undefined TypeError: immutable`',
    );
    expect(report.sseSkipped(r)).toMatch(/^portkey is not in this table: it could not serve the stream\. A streamed call through it answered 500/);
    const md = report.markdown(r);
    expect(md).toContain('### The sidecar against Portkey');
    expect(md).toContain('| portkey | 300 (300–300) |');
  });
});
