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

/**
 * The line under each chart's title: which run it is. `family` is the chart's (`growing-context`,
 * the scenario's key with dashes): a scenario run again later and merged into the results
 * (`reruns`, see merge-results.js) names that later run.
 */
function subtitle(r, family = '') {
  const later = (r.reruns ?? []).findLast((x) => x.scenarios.includes(family.replace(/-/g, '_')));
  const run = later ?? r;
  return `Run ${run.started_at}${run.quick ? ' (quick mode: indicative only)' : ''}${later ? ` (${later.command})` : ''}: ${run.rounds} round(s) of ${run.duration_ms} ms per target; ${run.machine.cpu}, ${run.machine.cores} cores, Node ${run.machine.node}.`;
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
  const files = require(CHARTS).writeRatioCharts(dir, ratioRows(results), (family) => subtitle(results, family));
  log(`charts: ${files.map((f) => path.relative(process.cwd(), path.join(dir, f))).join(', ')}`);
  return md;
}

if (require.main === module) writeReport(JSON.parse(fs.readFileSync(path.join(RESULTS, 'latest.json'), 'utf8')));

module.exports = { writeReport, subtitle };
