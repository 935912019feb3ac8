import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { escapeXml, ratioChart, ratioCharts, writeRatioCharts, type RatioRow } from '../../bench/charts';

// The bench's report is plain JavaScript run by node; it is loaded as it runs there.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const report = require(path.join(__dirname, '../../bench/report.js')) as {
  markdown: (r: Record<string, unknown>) => string;
  ratioRows: (r: Record<string, unknown>) => RatioRow[];
};

/**
 * Throws unless `xml` is well-formed as far as the charts go: one XML declaration, then elements
 * whose tags balance under one root, attributes that are all quoted, and text and attribute values
 * with no bare `<` or `&` (only the five named entities and numeric ones). Returns the element
 * names in document order.
 */
function wellFormed(xml: string): string[] {
  const body = xml.replace(/^<\?xml version="1\.0" encoding="UTF-8"\?>\n/, '');
  const entity = /&(?:amp|lt|gt|quot|apos|#\d+|#x[0-9a-fA-F]+);/g;
  const cleanText = (s: string, where: string) => {
    if (/[<&]/.test(s.replace(entity, ''))) throw new Error(`bare < or & in ${where}: ${s}`);
  };
  const attribute = /\s+([A-Za-z_:][\w:.-]*)="([^"]*)"/g;
  const stack: string[] = [];
  const names: string[] = [];
  let roots = 0;
  let at = 0;
  for (const m of body.matchAll(/<[^>]*>/g)) {
    cleanText(body.slice(at, m.index), 'text');
    at = m.index + m[0].length;
    const tag = m[0];
    const close = /^<\/([A-Za-z][\w:.-]*)\s*>$/.exec(tag);
    if (close) {
      if (stack.pop() !== close[1]) throw new Error(`unbalanced </${close[1]}>`);
      continue;
    }
    const open = /^<([A-Za-z][\w:.-]*)((?:\s+[A-Za-z_:][\w:.-]*="[^"]*")*)\s*(\/?)>$/.exec(tag);
    if (!open) throw new Error(`not a well-formed tag: ${tag}`);
    for (const a of open[2].matchAll(attribute)) cleanText(a[2], `attribute ${a[1]}`);
    if (stack.length === 0 && ++roots > 1) throw new Error('more than one root element');
    names.push(open[1]);
    if (open[3] !== '/') stack.push(open[1]);
  }
  cleanText(body.slice(at), 'text');
  if (stack.length > 0) throw new Error(`unclosed <${stack.join('>, <')}>`);
  if (roots !== 1) throw new Error('no root element');
  return names;
}

/** The attributes of every element with `class="<cls>"`, in document order. */
const elements = (svg: string, cls: string): Record<string, string>[] =>
  [...svg.matchAll(new RegExp(`<\\w+((?:\\s[^>]*)?\\sclass="${cls}"[^>]*)>`, 'g'))].map((m) =>
    Object.fromEntries([...m[1].matchAll(/([\w-]+)="([^"]*)"/g)].map((a) => [a[1], a[2]])),
  );

const row = (over: Partial<RatioRow>): RatioRow => ({
  family: 'json-c1',
  scenario: 'JSON, 1 connection',
  measure: 'CPU per request',
  better: 'lower',
  reference: 'bare pipe',
  sidecar: 600,
  value: 300,
  digits: 0,
  unit: ' µs',
  ratio: 2,
  bar: null,
  ...over,
});

const rows: RatioRow[] = [
  row({ bar: { limit: 1.3, text: '≤ 1.3×' } }),
  row({ reference: 'persisting pipe', value: 400, ratio: 1.5 }),
  row({ reference: "Portkey's gateway", value: 2400, ratio: 0.25 }),
  row({ measure: 'req/s', better: 'higher', reference: 'bare pipe', sidecar: 450, value: 500, unit: '', ratio: 0.9, bar: { limit: 0.9, text: '≥ 0.9×' } }),
];

describe('bench ratio charts', () => {
  it('draw well-formed SVG', () => {
    const svg = ratioChart(rows, 'Run now, 2 cores.');
    const names = wellFormed(svg);
    expect(names[0]).toBe('svg');
    expect(svg).toContain('xmlns="http://www.w3.org/2000/svg"');
    expect(names).not.toContain('script');
    expect(names).not.toContain('style');
    expect(svg).not.toMatch(/https?:\/\/(?!www\.w3\.org\/2000\/svg")/);
  });

  it('the well-formedness check can fail', () => {
    expect(() => wellFormed('<svg><g></svg>')).toThrow(/unbalanced/);
    expect(() => wellFormed('<svg><text>a & b</text></svg>')).toThrow(/bare/);
    expect(() => wellFormed('<svg><text x="a<b">a</text></svg>')).toThrow(/well-formed tag|bare/);
    expect(() => wellFormed('<svg><text x=1>a</text></svg>')).toThrow(/well-formed tag/);
    expect(() => wellFormed('<svg></svg><svg></svg>')).toThrow(/root/);
    expect(() => wellFormed('<svg><g>')).toThrow(/unclosed/);
  });

  it("print every row's measure, reference and value", () => {
    const svg = ratioChart(rows);
    expect(svg).toContain('CPU per request (lower is better)');
    expect(svg).toContain('req/s (higher is better)');
    for (const r of rows) {
      expect(svg).toContain(`>vs ${escapeXml(r.reference)}<`);
      expect(svg).toContain(`${r.ratio?.toFixed(2)}× (${r.sidecar} vs ${r.value}${r.unit})`);
    }
    expect(svg).toContain('2.00× (600 vs 300 µs); bar ≤ 1.3×');
    expect(elements(svg, 'value')).toHaveLength(rows.length);
  });

  it('draw bars in proportion to the ratios, on one scale', () => {
    const svg = ratioChart(rows);
    const bars = elements(svg, 'bar');
    expect(bars).toHaveLength(rows.length);
    const widths = bars.map((b) => Number(b.width));
    const x0 = Number(bars[0].x);
    expect(bars.every((b) => Number(b.x) === x0)).toBe(true);
    const perUnit = widths[0] / (rows[0].ratio ?? NaN);
    rows.forEach((r, i) => expect(widths[i]).toBeCloseTo((r.ratio ?? NaN) * perUnit, 1));
    // The bar's line sits where its ratio would end a bar, and only on the rows that have a bar.
    const limits = elements(svg, 'limit').map((l) => Number(l.x1) - x0);
    expect(limits).toHaveLength(2);
    expect(limits[0]).toBeCloseTo(1.3 * perUnit, 1);
    expect(limits[1]).toBeCloseTo(0.9 * perUnit, 1);
    // Parity (1×) is drawn on the same scale.
    expect(Number(elements(svg, 'parity')[0].x1) - x0).toBeCloseTo(perUnit, 1);
  });

  it('escape the text it places', () => {
    expect(escapeXml(`<a href="x">Tom & Jerry's</a>`)).toBe('&lt;a href=&quot;x&quot;&gt;Tom &amp; Jerry&apos;s&lt;/a&gt;');
    const hostile = row({
      scenario: 'A </text><script>alert(1)</script> & co',
      measure: 'p50 <ms> & "quoted"',
      reference: "O'Brien's <pipe>",
      unit: ' <µs>',
      bar: { limit: 1.5, text: '≤ 1.5× & <more>' },
    });
    const svg = ratioChart([hostile], 'Run <now> & "then"');
    const names = wellFormed(svg);
    expect(names).not.toContain('script');
    expect(svg).not.toContain('<script>');
    expect(svg).toContain('A &lt;/text&gt;&lt;script&gt;alert(1)&lt;/script&gt; &amp; co');
    expect(svg).toContain('p50 &lt;ms&gt; &amp; &quot;quoted&quot;');
    expect(svg).toContain('vs O&apos;Brien&apos;s &lt;pipe&gt;');
    expect(svg).toContain('(600 vs 300 &lt;µs&gt;); bar ≤ 1.5× &amp; &lt;more&gt;');
    expect(svg).toContain('Run &lt;now&gt; &amp; &quot;then&quot;');
  });

  it('give a row without a reference no bar, and no NaN anywhere', () => {
    const missing = row({ reference: "Portkey's gateway", value: null, ratio: null, note: 'not measured in this run' });
    const zero = row({ reference: 'persisting pipe', value: 0, ratio: NaN, note: 'a figure not above zero' });
    const svg = ratioChart([rows[0], missing, zero]);
    wellFormed(svg);
    expect(elements(svg, 'bar')).toHaveLength(1);
    expect(svg).not.toMatch(/NaN|Infinity|undefined|null/);
    expect(svg).toContain('– not measured in this run (600 vs – µs)');
    expect(svg).toContain('– a figure not above zero (600 vs 0 µs)');
    // A chart with no ratio at all still has an axis (to parity) and no bar.
    const none = ratioChart([missing]);
    wellFormed(none);
    expect(elements(none, 'bar')).toHaveLength(0);
    expect(none).not.toMatch(/NaN|Infinity/);
  });

  it('make one chart per scenario family', () => {
    const charts = ratioCharts([...rows, row({ family: 'sse-c4', scenario: 'SSE', measure: 'CPU per chunk' })]);
    expect(charts.map((c) => c.file)).toEqual(['ratios-json-c1.svg', 'ratios-sse-c4.svg']);
    expect(elements(charts[0].svg, 'bar')).toHaveLength(4);
    expect(elements(charts[1].svg, 'bar')).toHaveLength(1);
  });

  it('write the charts and remove those of an earlier run', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'charts-'));
    try {
      fs.writeFileSync(path.join(dir, 'ratios-gone.svg'), '<svg/>');
      fs.writeFileSync(path.join(dir, 'latest.md'), '# report');
      expect(writeRatioCharts(dir, rows)).toEqual(['ratios-json-c1.svg']);
      expect(fs.readdirSync(dir).sort()).toEqual(['latest.md', 'ratios-json-c1.svg']);
      wellFormed(fs.readFileSync(path.join(dir, 'ratios-json-c1.svg'), 'utf8'));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("bench ratio rows: the report's own figures", () => {
  const one = (median: number) => ({ median, min: median, max: median });
  const json = (rps: number, p50: number, cpu: number, rss: number) => ({
    rps: one(rps),
    p50_ms: one(p50),
    p99_ms: one(p50 * 2),
    cpu_us_per_req: one(cpu),
    rss_mib: one(rss),
  });
  const sse = (ttfb: number, cpu: number) => ({ ttfb_p50_ms: one(ttfb), total_p50_ms: one(60 + ttfb), cpu_us_per_chunk: one(cpu), rss_mib: one(100) });
  const results = {
    machine: { cpu: 'test', cores: 2, memory_gib: 1, node: 'v20', os: 'test' },
    quick: true,
    rounds: 1,
    duration_ms: 1000,
    started_at: 'now',
    portkey: { version: '1.15.2', json: { status: 200, identical: true }, sse: { status: 500, identical: false } },
    scenarios: {
      json_c1: {
        direct: json(800, 1.2, NaN, NaN),
        'bare-pipe': json(600, 1.5, 250, 55),
        'bare-persist': json(590, 1.6, 260, 56),
        portkey: json(300, 3.2, 2000, 130),
        sidecar: json(500, 1.7, 500, 100),
      },
      sse_c4: { direct: sse(1.5, NaN), 'bare-pipe': sse(1.8, 35), 'bare-persist': sse(1.9, 40), sidecar: sse(1.9, 60) },
    },
  };
  const rowsOf = report.ratioRows(results);
  const find = (family: string, measure: string, reference: string) =>
    rowsOf.find((r) => r.family === family && r.measure === measure && r.reference === reference);

  it("give the ratios latest.md prints, with the bars' lines", () => {
    const md = report.markdown(results);
    const cpu = find('json-c1', 'CPU per request', 'bare pipe');
    expect(cpu).toMatchObject({ sidecar: 500, value: 250, ratio: 2, bar: { limit: 1.3 } });
    expect(md).toContain('2.00× (500 vs 250 µs)');
    expect(find('json-c1', 'CPU per request', 'persisting pipe')?.ratio?.toFixed(2)).toBe('1.92');
    expect(md).toContain('| JSON c=1: CPU per request | 260 µs | 1.04× | – | 1.92× | ≤ 1.50× | ≤ 1.20× | **no** |');
    expect(find('json-c1', 'CPU per request', "Portkey's gateway")?.ratio).toBe(0.25);
    // Added p50 over direct: the sidecar 0.5 ms, the bare pipe 0.3 ms; the bar allows 0.3 + 0.1 ms.
    const added = find('json-c1', 'added p50 over direct', 'bare pipe');
    expect(added?.ratio).toBeCloseTo(0.5 / 0.3, 9);
    expect(added?.bar?.limit).toBeCloseTo(0.4 / 0.3, 9);
    expect(find('json-c1', 'p99', 'persisting pipe')?.bar).toBeNull();
  });

  it('leave no ratio where the reference was not measured or a figure is not above zero', () => {
    expect(find('sse-c4', 'CPU per chunk', "Portkey's gateway")).toMatchObject({ ratio: null, value: null, note: 'not measured in this run' });
    const r2 = structuredClone(results);
    r2.scenarios.sse_c4['bare-pipe'].ttfb_p50_ms = one(1.4); // faster than direct
    const ttfb = report.ratioRows(r2).find((r) => r.family === 'sse-c4' && r.measure.startsWith('added TTFB') && r.reference === 'bare pipe');
    expect(ttfb).toMatchObject({ ratio: null, note: 'a figure not above zero', bar: null });
    const svg = ratioChart(report.ratioRows(r2).filter((r) => r.family === 'sse-c4'));
    wellFormed(svg);
    expect(svg).not.toMatch(/NaN/);
  });

  it('have no Portkey rows for results from before it was in the bench, nor in scenarios it does not run', () => {
    const { portkey: _portkey, ...before } = results;
    expect(report.ratioRows(before).some((r) => r.reference === "Portkey's gateway")).toBe(false);
    expect(rowsOf.filter((r) => r.family === 'json-c1').map((r) => r.reference)).toContain("Portkey's gateway");
  });
});
