'use strict';
// node bench/merge-results.js FULL.json PARTIAL.json "COMMAND" ["NOTE"]: results/latest.json becomes FULL (a
// full run's results) with the scenarios of PARTIAL (a later run of some scenarios alone, e.g.
// `node bench/run.js --only growing,memory`) in place of its own, then latest.md and the charts
// are written again from it. The later run is listed in `reruns` (when it started, how, which
// scenarios, and NOTE: what the reader should know about it, e.g. what else ran on the machine),
// which the report's header and those scenarios' charts name; everything else in the results, the
// fresh-memory figure included, stays the full run's.
const fs = require('node:fs');
const path = require('node:path');
const { writeReport } = require('./render-report');

/** FULL with PARTIAL's scenarios in place of its own, and PARTIAL named in `reruns`. */
function mergeResults(full, partial, command, note) {
  const scenarios = Object.keys(partial.scenarios);
  if (scenarios.length === 0) throw new Error('the later run has no scenarios');
  if (partial.quick && !full.quick) throw new Error('the later run is a quick one; the full run is not');
  return {
    ...full,
    scenarios: { ...full.scenarios, ...partial.scenarios },
    reruns: [
      // A scenario run again twice is named by the latest run only.
      ...(full.reruns ?? []).map((x) => ({ ...x, scenarios: x.scenarios.filter((k) => !scenarios.includes(k)) })).filter((x) => x.scenarios.length > 0),
      {
        command,
        ...(note ? { note } : {}),
        scenarios,
        started_at: partial.started_at,
        finished_at: partial.finished_at,
        quick: partial.quick,
        rounds: partial.rounds,
        duration_ms: partial.duration_ms,
        machine: partial.machine,
        memory_touch: partial.memory_touch,
      },
    ],
  };
}

if (require.main === module) {
  const [fullFile, partialFile, command, note] = process.argv.slice(2);
  if (!fullFile || !partialFile || !command) {
    process.stderr.write('usage: node bench/merge-results.js FULL.json PARTIAL.json "COMMAND" ["NOTE"]\n');
    process.exit(2);
  }
  const read = (f) => JSON.parse(fs.readFileSync(f, 'utf8'));
  const merged = mergeResults(read(fullFile), read(partialFile), command, note);
  const dir = path.join(__dirname, 'results');
  fs.writeFileSync(path.join(dir, 'latest.json'), JSON.stringify(merged, null, 2) + '\n');
  writeReport(merged, dir);
}

module.exports = { mergeResults };
