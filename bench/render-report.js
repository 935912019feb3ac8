'use strict';
// The report of a run: results/latest.md and, beside it, the ratio charts results/ratios-*.svg,
// both from the same results object. run.js calls writeReport at the end of a run. Run alone,
// `node bench/render-report.js` writes both again from results/latest.json without running the
// bench (after a change to the report or the charts). The charts' code is TypeScript
// (bench/charts.ts), compiled into build/bench/charts.js by `npm run bench` or
// `npx tsc -p tsconfig.json`.
const fs = require('node:fs');
const path = require('node:path');
const { markdown, ratioRows } = require('./report');

const RESULTS = path.join(__dirname, 'results');
const CHARTS = path.join(__dirname, '../build/bench/charts.js');

/** The line under each chart's title: which run it is. */
function subtitle(r) {
  return `Run ${r.started_at}${r.quick ? ' (quick mode: indicative only)' : ''}: ${r.rounds} round(s) of ${r.duration_ms} ms per target; ${r.machine.cpu}, ${r.machine.cores} cores, Node ${r.machine.node}.`;
}

/**
 * Writes latest.md and the ratio charts of `results` into `dir`; returns the report's text. The
 * report is written first: a run's results are not lost to a chart, and without the compiled
 * charts module the report alone is written and `log` says why.
 */
function writeReport(results, dir = RESULTS, log = (m) => process.stderr.write(`${m}\n`)) {
  const md = markdown(results);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'latest.md'), md);
  if (!fs.existsSync(CHARTS)) {
    log(`charts not drawn: ${path.relative(process.cwd(), CHARTS)} is missing (npx tsc -p tsconfig.json compiles it)`);
    return md;
  }
  const files = require(CHARTS).writeRatioCharts(dir, ratioRows(results), subtitle(results));
  log(`charts: ${files.map((f) => path.relative(process.cwd(), path.join(dir, f))).join(', ')}`);
  return md;
}

if (require.main === module) writeReport(JSON.parse(fs.readFileSync(path.join(RESULTS, 'latest.json'), 'utf8')));

module.exports = { writeReport, subtitle };
