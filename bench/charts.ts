// SVG bar charts of the sidecar's figures over the bench's references (the bare pipe, the
// persisting pipe, Portkey's gateway), one file per scenario, drawn from the rows report.js's
// ratioRows builds out of the same medians latest.md is written from. The SVG is written by hand:
// a generic font family, no scripts, no styles or fonts from elsewhere, and every piece of text
// XML-escaped. npm run bench compiles this file into build/bench/charts.js for run.js.
import fs from 'node:fs';
import path from 'node:path';

/** One bar: the sidecar's figure over one reference's, for one measure of one scenario. */
export interface RatioRow {
  /** The scenario's part of the file name, e.g. `json-c1`: one chart per family. */
  family: string;
  /** The scenario's title, the chart's heading. */
  scenario: string;
  measure: string;
  /** Whether a lower or a higher figure is the better one for the sidecar. */
  better: 'lower' | 'higher';
  /** The reference's label, e.g. `bare pipe`. */
  reference: string;
  /** The sidecar's figure and the reference's, in `unit`, shown with `digits` decimals. */
  sidecar: number | null;
  value: number | null;
  digits: number;
  unit: string;
  /** sidecar ÷ value; null where the reference was not measured or a figure is not above zero. */
  ratio: number | null;
  /** Why there is no ratio. */
  note?: string;
  /** The quality bar as a ratio, where the report holds this row to one. */
  bar?: { limit: number; text: string } | null;
}

/** A chart ready to be written: its file name (`ratios-<family>.svg`) and its SVG text. */
export interface Chart {
  file: string;
  svg: string;
}

const WIDTH = 980;
const LABEL_X = 28;
const PLOT_X = 200;
const PLOT_W = 440;
const ROW_H = 20;
const BAR_H = 12;
const GROUP_H = 24;
const TOP = 70;
const AXIS_H = 26;
const LEGEND_H = 44;
const COLORS = ['#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2'];
const LIMIT_COLOR = '#c0392b';

/** Text made safe for an XML text node or a double- or single-quoted attribute. */
export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c] ?? c);
}

const finite = (x: number | null | undefined): x is number => typeof x === 'number' && Number.isFinite(x);
/** A coordinate for an attribute: two decimals at most. */
const n = (x: number): string => String(Number(x.toFixed(2)));
const text = (x: number, y: number, content: string, attrs = ''): string => `<text x="${n(x)}" y="${n(y)}"${attrs}>${escapeXml(content)}</text>`;

/** The x axis: from 0 to `max` in steps of `step`, `px` pixels a unit of ratio. */
interface Axis {
  max: number;
  step: number;
  px: number;
}

/** A round step (1, 2, 2.5 or 5 times a power of ten) that splits `max` into at most about six. */
function niceStep(max: number): number {
  const raw = max / 6;
  const power = 10 ** Math.floor(Math.log10(raw));
  return ([1, 2, 2.5, 5, 10].find((k) => k * power >= raw) ?? 10) * power;
}

/** An axis wide enough for every ratio and every bar's line, and for parity (1×). */
export function axisOf(rows: RatioRow[]): Axis {
  const values = [1, ...rows.map((r) => r.ratio), ...rows.map((r) => r.bar?.limit)].filter(finite);
  const top = Math.max(...values);
  const step = niceStep(top);
  const max = Math.ceil(top / step - 1e-9) * step;
  return { max, step, px: PLOT_W / max };
}

/** What is printed at a bar's end: the ratio, the two figures, and the bar where there is one. */
export function valueText(row: RatioRow): string {
  const fig = (x: number | null): string => (finite(x) ? x.toFixed(row.digits) : '–');
  const figures = finite(row.sidecar) || finite(row.value) ? ` (${fig(row.sidecar)} vs ${fig(row.value)}${row.unit})` : '';
  if (!finite(row.ratio)) return `– ${row.note ?? 'no ratio'}${figures}`;
  const bar = row.bar && finite(row.bar.limit) ? `; bar ${row.bar.text}` : '';
  return `${row.ratio.toFixed(2)}×${figures}${bar}`;
}

/** The rows of one chart by measure, in the order the measures first appear. */
function groupsOf(rows: RatioRow[]): [string, RatioRow[]][] {
  const groups = new Map<string, RatioRow[]>();
  for (const row of rows) groups.set(row.measure, [...(groups.get(row.measure) ?? []), row]);
  return [...groups];
}

/** One row: its reference's label, its bar (none without a ratio), the bar's line and its value. */
function rowSvg(row: RatioRow, top: number, axis: Axis, color: string): string[] {
  const out = [text(LABEL_X, top + ROW_H / 2 + 4, `vs ${row.reference}`)];
  let end = PLOT_X;
  if (finite(row.ratio)) {
    const width = row.ratio * axis.px;
    out.push(`<rect class="bar" x="${n(PLOT_X)}" y="${n(top + (ROW_H - BAR_H) / 2)}" width="${n(width)}" height="${BAR_H}" fill="${color}"/>`);
    end = PLOT_X + width;
  }
  if (row.bar && finite(row.bar.limit)) {
    const x = PLOT_X + row.bar.limit * axis.px;
    out.push(`<line class="limit" x1="${n(x)}" y1="${n(top + 1)}" x2="${n(x)}" y2="${n(top + ROW_H - 1)}" stroke="${LIMIT_COLOR}" stroke-width="2"/>`);
    end = Math.max(end, x);
  }
  // A white outline keeps the figures legible where they cross the grid or the parity line.
  out.push(text(end + 6, top + ROW_H / 2 + 4, valueText(row), ' class="value" stroke="#fff" stroke-width="3" paint-order="stroke"'));
  return out;
}

/** The grid: a line at every step with its label under the plot, and a dashed line at parity (1×). */
function gridSvg(axis: Axis, top: number, bottom: number): string[] {
  const out: string[] = [];
  for (let i = 0; i * axis.step <= axis.max + 1e-9; i++) {
    const v = i * axis.step;
    const x = PLOT_X + v * axis.px;
    out.push(`<line x1="${n(x)}" y1="${n(top)}" x2="${n(x)}" y2="${n(bottom)}" stroke="#e3e3e3"/>`);
    out.push(text(x, bottom + 16, `${Number(v.toFixed(3))}×`, ' text-anchor="middle" fill="#555"'));
  }
  const one = PLOT_X + axis.px;
  out.push(`<line class="parity" x1="${n(one)}" y1="${n(top)}" x2="${n(one)}" y2="${n(bottom)}" stroke="#555" stroke-dasharray="4 3"/>`);
  return out;
}

/** The legend: a swatch for every reference, then the bar's line and parity. */
function legendSvg(references: string[], colors: Map<string, string>, y: number): string[] {
  const out: string[] = [];
  let x = LABEL_X;
  for (const ref of references) {
    out.push(`<rect x="${n(x)}" y="${n(y - 10)}" width="12" height="12" fill="${colors.get(ref) ?? COLORS[0]}"/>`, text(x + 16, y, `sidecar ÷ ${ref}`));
    x += 36 + 7 * `sidecar ÷ ${ref}`.length;
  }
  out.push(`<line x1="${n(x)}" y1="${n(y - 11)}" x2="${n(x)}" y2="${n(y + 3)}" stroke="${LIMIT_COLOR}" stroke-width="2"/>`, text(x + 8, y, 'the quality bar'));
  x += 130;
  out.push(`<line x1="${n(x)}" y1="${n(y - 11)}" x2="${n(x)}" y2="${n(y + 3)}" stroke="#555" stroke-dasharray="4 3"/>`, text(x + 8, y, 'parity (1×)'));
  const note = 'The bar is the sidecar’s figure over the reference’s, medians over rounds; “added” figures are over direct. A row with no ratio has no bar.';
  out.push(text(LABEL_X, y + 22, note, ' fill="#555"'));
  return out;
}

/**
 * One chart of `rows` (one scenario): a group per measure, a horizontal bar per reference whose
 * length is the ratio on one scale for the whole chart, the ratio and both figures at its end, and
 * the quality bar as a vertical line on the rows that have one. `subtitle` says which run it is.
 */
export function ratioChart(rows: RatioRow[], subtitle = ''): string {
  const title = rows[0]?.scenario ?? 'No ratios';
  const axis = axisOf(rows);
  const groups = groupsOf(rows);
  const references = [...new Set(rows.map((r) => r.reference))];
  const colors = new Map(references.map((ref, i) => [ref, COLORS[i % COLORS.length]]));
  const body: string[] = [];
  let y = TOP;
  for (const [measure, members] of groups) {
    body.push(text(12, y + 16, `${measure} (${members[0].better} is better)`, ' font-weight="bold"'));
    y += GROUP_H;
    for (const row of members) {
      body.push(...rowSvg(row, y, axis, colors.get(row.reference) ?? COLORS[0]));
      y += ROW_H;
    }
  }
  const height = y + AXIS_H + LEGEND_H;
  const heading = `${title}: the sidecar over each reference`;
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${n(height)}" viewBox="0 0 ${WIDTH} ${n(height)}" role="img" aria-labelledby="title desc" font-family="sans-serif" font-size="12" fill="#222">`,
    `<title id="title">${escapeXml(heading)}</title>`,
    `<desc id="desc">${escapeXml(`Horizontal bars, one per measure and reference: the sidecar's figure over the reference's. ${subtitle}`.trim())}</desc>`,
    `<rect width="100%" height="100%" fill="#fff"/>`,
    text(12, 24, heading, ' font-size="16" font-weight="bold"'),
    text(12, 44, subtitle, ' fill="#555"'),
    ...gridSvg(axis, TOP, y),
    ...body,
    ...legendSvg(references, colors, y + AXIS_H + 14),
    '</svg>',
    '',
  ].join('\n');
}

/**
 * What a chart's subtitle says: one line for every chart, or a family's own (results merged from
 * two runs say which run each scenario is from).
 */
export type Subtitle = string | ((family: string) => string);

/** One chart per family of `rows`, in the order the families first appear. */
export function ratioCharts(rows: RatioRow[], subtitle: Subtitle = ''): Chart[] {
  const families = new Map<string, RatioRow[]>();
  for (const row of rows) families.set(row.family, [...(families.get(row.family) ?? []), row]);
  return [...families].map(([family, members]) => ({
    file: `ratios-${family.toLowerCase().replace(/[^a-z0-9-]+/g, '-')}.svg`,
    svg: ratioChart(members, typeof subtitle === 'function' ? subtitle(family) : subtitle),
  }));
}

/**
 * Writes the charts of `rows` into `dir` and returns their file names. The charts of an earlier
 * run are removed first, so that a scenario this run did not measure leaves no stale picture.
 */
export function writeRatioCharts(dir: string, rows: RatioRow[], subtitle: Subtitle = ''): string[] {
  fs.mkdirSync(dir, { recursive: true });
  for (const f of fs.readdirSync(dir)) if (/^ratios-.*\.svg$/.test(f)) fs.rmSync(path.join(dir, f));
  const charts = ratioCharts(rows, subtitle);
  for (const c of charts) fs.writeFileSync(path.join(dir, c.file), c.svg);
  return charts.map((c) => c.file);
}
