'use strict';
// Where a sidecar's main-thread time goes, from a V8 CPU profile (`node --cpu-prof`): the samples
// that fall inside given time windows, summed by the part of the sidecar they were in.
//
// A sample is attributed to the innermost frame that is the sidecar's own code (`dist/…`) or a
// library (`node_modules/…`): time in a Node.js built-in or a native function (a socket `writev`,
// `JSON.parse`, crc32) counts for the sidecar code that called it. Samples with neither on their
// stack are Node.js's own work (the HTTP server's parser callbacks, stream and timer machinery),
// garbage collection, or V8 not attributed to a function (`(program)`). `(idle)` is the event loop
// waiting and is not busy time.

/** [category, test on the path under dist/ or node_modules/] in the order they are tried. */
const SIDECAR_PARTS = [
  ['proxy: capture hooks (tee, ids asked for, stripped)', /^receivers\/llm-proxy\/(capture|inject|strip)\.js$/],
  ['proxy: forwarding', /^(receivers\/llm-proxy\/|formats\/http1-response\.js$|security\/)/],
  ['journal', /^journal\//],
  ['records and episodes', /^(service\/|processors\/(episodes|spans)\/|model\/)/],
  ['extraction (answers read for ids, logprobs, tool calls)', /^formats\//],
  ['transitions (AIR, credit)', /^processors\//],
  ['export (transition JSON, NDJSON or Kafka)', /^exporters\//],
  ['metrics and logs', /^telemetry\//],
];
const LIBRARY_PARTS = [
  ['metrics and logs', /^prom-client\//],
  ['Kafka client (kafkajs)', /^kafkajs\//],
];
/**
 * Helpers several parts call (the JSON byte scanner, the checksum): their time counts for the
 * part that called them (the strip's scan for the capture hooks, the checksum for the journal or
 * the Kafka codec), and for their own part only when no other sidecar frame is above them.
 */
const SHARED_HELPERS = /\/dist\/formats\/(json-scan|crc32)\.js$/;
const OTHER_SIDECAR = 'other sidecar code';
const OTHER_LIBRARY = 'other libraries';
const GC = 'garbage collection';
const NODE = 'Node.js outside the sidecar’s code (HTTP server, sockets, streams, timers)';
const PROGRAM = 'V8, not attributed to a function';

/** The category of a frame by its script URL, or null for a Node.js built-in or native frame. */
function partOf(url) {
  const lib = /\/node_modules\/(.*)$/.exec(url);
  if (lib) {
    for (const [name, re] of LIBRARY_PARTS) if (re.test(lib[1])) return name;
    return OTHER_LIBRARY;
  }
  const own = /\/dist\/(.*)$/.exec(url);
  if (own) {
    for (const [name, re] of SIDECAR_PARTS) if (re.test(own[1])) return name;
    return OTHER_SIDECAR;
  }
  return null;
}

function frameName(n) {
  const cf = n.callFrame;
  const where = /\/(?:dist|node_modules)\/(.*)$/.exec(cf.url)?.[1] ?? cf.url;
  return `${cf.functionName || '(anonymous)'}${where ? ` ${where}:${cf.lineNumber + 1}` : ''}`;
}

/**
 * `profile`: a parsed .cpuprofile. `windows`: [{name, startUs, endUs, units}] on the same clock as
 * the profile (CLOCK_MONOTONIC µs: `process.hrtime.bigint() / 1000n` in another process on the same
 * machine). Returns, per window, busy µs per unit (request, call) in total, by category and for
 * the `top` functions with the most self time.
 */
function analyzeProfile(profile, windows, top = 10) {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const categoryMemo = new Map();
  const categoryOf = (id) => {
    let c = categoryMemo.get(id);
    if (c !== undefined) return c;
    const leaf = byId.get(id);
    const special = leaf.callFrame.functionName;
    if (special === '(idle)') c = 'idle';
    else if (special === '(garbage collector)') c = GC;
    else if (special === '(program)') c = PROGRAM;
    else {
      c = NODE;
      let helper = null;
      for (let x = id; x !== undefined; x = parent.get(x)) {
        const url = byId.get(x).callFrame.url;
        const part = partOf(url);
        if (part === null) continue;
        if (SHARED_HELPERS.test(url)) {
          helper ??= part;
          continue;
        }
        c = part;
        break;
      }
      if (c === NODE && helper !== null) c = helper;
    }
    categoryMemo.set(id, c);
    return c;
  };
  const acc = windows.map(() => ({ busy: 0, idle: 0, parts: new Map(), fns: new Map() }));
  // Sample i lasts until sample i + 1.
  let t = profile.startTime;
  const times = profile.timeDeltas.map((d) => (t += d));
  for (let i = 0; i < profile.samples.length; i++) {
    const start = times[i];
    const end = i + 1 < times.length ? times[i + 1] : profile.endTime;
    const w = windows.findIndex((x) => start >= x.startUs && start < x.endUs);
    if (w < 0 || end <= start) continue;
    const us = end - start;
    const a = acc[w];
    const id = profile.samples[i];
    const c = categoryOf(id);
    if (c === 'idle') {
      a.idle += us;
      continue;
    }
    a.busy += us;
    a.parts.set(c, (a.parts.get(c) ?? 0) + us);
    const fn = frameName(byId.get(id));
    a.fns.set(fn, (a.fns.get(fn) ?? 0) + us);
  }
  return windows.map((w, k) => {
    const a = acc[k];
    const per = (us) => (w.units > 0 ? us / w.units : NaN);
    const sorted = (m) => [...m].sort((x, y) => y[1] - x[1]);
    return {
      name: w.name,
      units: w.units,
      window_ms: (w.endUs - w.startUs) / 1000,
      busy_us_per_unit: per(a.busy),
      idle_share: a.busy + a.idle > 0 ? a.idle / (a.busy + a.idle) : NaN,
      parts: Object.fromEntries(sorted(a.parts).map(([name, us]) => [name, per(us)])),
      top: sorted(a.fns)
        .slice(0, top)
        .map(([name, us]) => ({ name, us_per_unit: per(us) })),
    };
  });
}

/** CLOCK_MONOTONIC in µs, the clock of V8's profiles. */
function nowUs() {
  return Number(process.hrtime.bigint() / 1000n);
}

module.exports = { analyzeProfile, partOf, nowUs, GC, NODE, PROGRAM };
