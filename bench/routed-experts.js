'use strict';
// "Routed experts": what capturing MoE routing (routing replay) costs. The growing-context agents
// (growing-context.js's runAgents: every call resends the whole history) run against the same
// bench model server on two paths: `/v1`, answered as before, and `/routed/v1`, answered as vLLM
// started with `--enable-return-routed-experts` does (`choices[].routed_experts`: a base64 `.npy`
// of [prompt + output - 1, 48 layers, top-8] uint8). One sidecar calls each path; both export
// trajectories to files (the default). Per target: trajectory bytes written per token, sidecar CPU
// per call and per token with the export included, p50 per call; then the ratios with/without.
// Every routed trajectory is checked: routing_complete, a row per token but the last, and every
// row the server's (its values depend on the position only, so the rows are known here).
const fs = require('node:fs');
const path = require('node:path');
const { runAgents, exactTrajectory, dirBytes } = require('./growing-context');

// Qwen3-30B-A3B's shape: 48 MoE layers, 8 of 128 experts per token (uint8 holds them).
const LAYERS = 48;
const TOP_K = 8;
const EXPERTS = 128;
const ROW_BYTES = LAYERS * TOP_K;

/**
 * The expert the bench server reports at (position, layer, k): from the position only, so every
 * call of a conversation agrees on the rows they share and a row put at the wrong position shows;
 * k * 16 keeps a row's 8 experts distinct.
 */
function expertOf(position, layer, k) {
  return (position * 37 + layer * 11 + k * 16) % EXPERTS;
}

let rowCache = Buffer.alloc(0);

/** Rows [0, n) as uint8 in C order: a view of a cache grown (doubled) as needed. */
function expertRows(n) {
  const have = rowCache.length / ROW_BYTES;
  if (have < n) {
    const rows = Math.max(n, 2 * have, 1024);
    const b = Buffer.allocUnsafe(rows * ROW_BYTES);
    rowCache.copy(b);
    let i = have * ROW_BYTES;
    for (let p = have; p < rows; p++) for (let l = 0; l < LAYERS; l++) for (let k = 0; k < TOP_K; k++) b[i++] = expertOf(p, l, k);
    rowCache = b;
  }
  return rowCache.subarray(0, n * ROW_BYTES);
}

/** The `.npy` bytes (format version 1.0, as np.save writes) of C-order uint8 values of `shape`. */
function npyUint8(values, shape) {
  let header = `{'descr': '|u1', 'fortran_order': False, 'shape': (${shape.join(', ')}${shape.length === 1 ? ',' : ''}), }`;
  // Magic, version, header length, header, newline: padded with spaces to a multiple of 64 bytes.
  header += ' '.repeat((64 - ((10 + header.length + 1) % 64)) % 64) + '\n';
  const head = Buffer.alloc(10);
  Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0]).copy(head);
  head.writeUInt16LE(header.length, 8);
  return Buffer.concat([head, Buffer.from(header, 'latin1'), values]);
}

/**
 * vLLM's `routed_experts` for an answer of `length` ids (prompt + output): the rows of positions
 * [start, length - 1), `start` being the request's `routed_experts_prompt_start` (0 when unset).
 */
function routedExpertsField(length, promptStart) {
  const start = Number.isSafeInteger(promptStart) && promptStart > 0 ? Math.min(promptStart, length - 1) : 0;
  const rows = Math.max(0, length - 1 - start);
  return npyUint8(expertRows(start + rows).subarray(start * ROW_BYTES), [rows, LAYERS, TOP_K]).toString('base64');
}

/** Sizes of the files of a directory (none when it does not exist yet). */
function fileSizes(dir) {
  const out = new Map();
  for (const f of fs.existsSync(dir) ? fs.readdirSync(dir) : []) out.set(f, fs.statSync(path.join(dir, f)).size);
  return out;
}

/** Each NDJSON line written to `dir` since `before` (file sizes), as a Buffer. */
function newLines(dir, before, each) {
  for (const f of fs.existsSync(dir) ? fs.readdirSync(dir).sort() : []) {
    const from = before.get(f) ?? 0;
    const file = path.join(dir, f);
    const size = fs.statSync(file).size;
    if (size <= from) continue;
    const buf = Buffer.allocUnsafe(size - from);
    const fd = fs.openSync(file, 'r');
    try {
      let got = 0;
      while (got < buf.length) {
        const n = fs.readSync(fd, buf, got, buf.length - got, from + got);
        if (n === 0) break;
        got += n;
      }
    } finally {
      fs.closeSync(fd);
    }
    let start = 0;
    for (let nl = buf.indexOf(10); nl >= 0; start = nl + 1, nl = buf.indexOf(10, start)) if (nl > start) each(buf.subarray(start, nl));
  }
}

/**
 * Checks the trajectories a round wrote (the lines added to `dir` since `before`) against what
 * the agents sent (`conversations`): one per rollout, its ids and logprobs exact (growing-context's
 * check); with `routed`, `routing_complete: true`, `routed_experts` uint8 of [token_ids - 1, 48, 8]
 * with nothing missing and every row the server's; without, none of the routing keys.
 */
function checkRound(dir, before, prefix, conversations, routed) {
  const byRollout = new Map();
  let bytes = 0;
  let tokens = 0;
  let routingBytes = 0;
  let wrongRouting = 0;
  const problems = [];
  const problem = (text) => {
    if (problems.length < 3) problems.push(text);
  };
  newLines(dir, before, (line) => {
    const t = JSON.parse(line.toString('utf8'));
    if (!t.rollout_id.startsWith(prefix)) return;
    bytes += line.length + 1;
    tokens += t.token_ids.length;
    (byRollout.get(t.rollout_id) ?? byRollout.set(t.rollout_id, []).get(t.rollout_id)).push(t);
    const re = t.routed_experts;
    if (!routed) {
      if (re !== undefined || t.routing_complete !== undefined || t.routing_coverage !== undefined) {
        wrongRouting++;
        problem(`${t.trajectory_id}: routing keys without routing`);
      }
      return;
    }
    const rows = t.token_ids.length - 1;
    let why = null;
    if (!re) why = 'no routed_experts';
    else if (t.routing_complete !== true) why = `routing_complete ${t.routing_complete}`;
    else if (!Array.isArray(re.shape) || re.shape[0] !== rows || re.shape[1] !== LAYERS || re.shape[2] !== TOP_K)
      why = `shape ${JSON.stringify(re.shape)} for ${t.token_ids.length} tokens`;
    else if (re.dtype !== 'uint8') why = `dtype ${re.dtype}`;
    else if (!Array.isArray(re.missing) || re.missing.length > 0) why = `missing ${JSON.stringify(re.missing)}`;
    else if (t.routing_coverage !== 1) why = `routing_coverage ${t.routing_coverage}`;
    else if (!Buffer.from(re.data, 'base64').equals(expertRows(rows))) why = 'rows differ from the server’s';
    if (re && typeof re.data === 'string') routingBytes += re.data.length;
    if (why !== null) {
      wrongRouting++;
      problem(`${t.trajectory_id}: ${why}`);
    }
  });
  let wrongIds = 0;
  for (const c of conversations)
    if (!exactTrajectory(byRollout.get(c.rollout) ?? [], c)) {
      wrongIds++;
      problem(`${c.rollout}: not one trajectory with its ids and logprobs`);
    }
  const trajectories = [...byRollout.values()].reduce((n, rows) => n + rows.length, 0);
  return { trajectories, bytes, tokens, routing_data_bytes: routingBytes, wrong_routing: wrongRouting, wrong_ids: wrongIds, problems };
}

function median(xs) {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/**
 * `targets`: {name, port, pid, urlPath, routed, capture?}; a sidecar has `capture: {dataDir,
 * endRollouts(prefix, agents)}`: its episodes are closed and exported after each round (its CPU
 * counted) and the trajectories checked. Warm-up and measured rounds stop being started once
 * `budgetMs` has passed (each round is bounded: agents × turns calls).
 */
async function benchRoutedExperts({ targets, proc, agents, turns, rounds, warmup, budgetMs, tag = 're' }) {
  const until = Date.now() + budgetMs;
  const out = { agents, turns, layers: LAYERS, top_k: TOP_K, experts: EXPERTS, warmup_rounds: 0, rounds: 0, targets: {} };
  const workload = { agents, turns, ask: true, streamEvery: 0 };
  // Not measured: the sidecars' code compiled and their pools warm.
  for (let w = 0; w < warmup && Date.now() < until; w++, out.warmup_rounds++)
    for (const t of targets) {
      if (!t.pid) continue;
      await runAgents({ port: t.port, prefix: `${tag}w${w}-${t.name}`, urlPath: t.urlPath, ...workload });
      if (t.capture) await t.capture.endRollouts(`${tag}w${w}-${t.name}`, agents);
    }
  const problems = [];
  for (let r = 0; r < rounds && (r === 0 || Date.now() < until); r++, out.rounds++) {
    const order = r % 2 === 0 ? targets : [...targets].reverse();
    for (const t of order) {
      const prefix = `${tag}${r}-${t.name}`;
      const trajDir = t.capture ? path.join(t.capture.dataDir, 'trajectories') : null;
      const filesBefore = trajDir ? fileSizes(trajDir) : null;
      const journalBefore = t.capture ? dirBytes(path.join(t.capture.dataDir, 'journal')) : 0;
      const before = t.pid ? proc(t.pid) : null;
      let peak = before ? before.rss : NaN;
      const timer = t.pid ? setInterval(() => (peak = Math.max(peak, proc(t.pid).rss)), 25) : null;
      const res = await runAgents({ port: t.port, prefix, urlPath: t.urlPath, ...workload });
      const loadCpu = before ? proc(t.pid).cpu - before.cpu : NaN;
      // Every episode is still open: what the journal holds of this round's calls.
      const journalBytes = t.capture ? dirBytes(path.join(t.capture.dataDir, 'journal')) - journalBefore : null;
      // Then the sidecar closes every episode and exports its trajectory (capture work too),
      // waited for until every trajectory is written.
      const exportS = t.capture ? await t.capture.endRollouts(prefix, agents) : 0;
      const totalCpu = before ? proc(t.pid).cpu - before.cpu : NaN;
      if (timer) clearInterval(timer);
      if (t.pid) peak = Math.max(peak, proc(t.pid).rss);
      const x = (out.targets[t.name] ??= { routed: t.routed, rounds: [] });
      const round = {
        calls: res.calls,
        errors: res.errors,
        p50_ms: res.p50,
        p99_ms: res.p99,
        // What the agents sent and got (requests and answers, routing included where it comes).
        body_bytes: res.body_bytes,
      };
      if (t.pid) {
        round.cpu_us_per_call_load = (loadCpu / res.calls) * 1e6;
        round.cpu_us_per_call = (totalCpu / res.calls) * 1e6;
        round.peak_rss_mib = peak / 2 ** 20;
      }
      if (t.capture) {
        const check = checkRound(trajDir, filesBefore, prefix, res.conversations, t.routed);
        const written = [...fileSizes(trajDir)].reduce((n, [f, size]) => n + size - (filesBefore.get(f) ?? 0), 0);
        Object.assign(round, {
          export_s: exportS,
          journal_bytes_per_call: journalBytes / res.calls,
          trajectories: check.trajectories,
          tokens: check.tokens,
          trajectory_bytes: written,
          trajectory_line_bytes: check.bytes,
          bytes_per_token: written / check.tokens,
          routing_data_bytes_per_token: check.routing_data_bytes / check.tokens,
          cpu_ns_per_token: (totalCpu / check.tokens) * 1e9,
          wrong_routing: check.wrong_routing,
          wrong_ids: check.wrong_ids,
          problems: check.problems,
        });
        const missing = agents - check.trajectories;
        if (res.errors > 0) problems.push(`${t.name} round ${r}: ${res.errors} failed calls`);
        if (missing !== 0) problems.push(`${t.name} round ${r}: ${check.trajectories} trajectories for ${agents} rollouts`);
        if (check.wrong_routing + check.wrong_ids > 0)
          problems.push(
            `${t.name} round ${r}: ${check.wrong_routing} trajectories with wrong routing, ${check.wrong_ids} rollouts with wrong ids (${check.problems.join('; ')})`,
          );
      } else if (res.errors > 0) problems.push(`${t.name} round ${r}: ${res.errors} failed calls`);
      x.rounds.push(round);
    }
  }
  // Medians over rounds, then the ratios with routing over without.
  for (const x of Object.values(out.targets)) {
    const keys = new Set(x.rounds.flatMap((r) => Object.keys(r).filter((k) => typeof r[k] === 'number')));
    x.median = Object.fromEntries([...keys].map((k) => [k, median(x.rounds.map((r) => r[k]))]));
  }
  const ratio = (a, b, k) => (out.targets[a] && out.targets[b] ? out.targets[a].median[k] / out.targets[b].median[k] : NaN);
  out.ratios = {
    bytes_per_token: ratio('sidecar-routing', 'sidecar', 'bytes_per_token'),
    cpu_per_call: ratio('sidecar-routing', 'sidecar', 'cpu_us_per_call'),
    cpu_per_call_load: ratio('sidecar-routing', 'sidecar', 'cpu_us_per_call_load'),
    cpu_per_token: ratio('sidecar-routing', 'sidecar', 'cpu_ns_per_token'),
    p50: ratio('sidecar-routing', 'sidecar', 'p50_ms'),
    direct_p50: ratio('direct-routing', 'direct', 'p50_ms'),
  };
  out.error = problems.length > 0 ? problems.join(' | ') : null;
  return out;
}

module.exports = { benchRoutedExperts, routedExpertsField, expertRows, npyUint8, fileSizes, newLines, LAYERS, TOP_K };
