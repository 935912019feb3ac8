'use strict';
// "Screenshot agent": R agents, each making T calls to a vision-model stand-in (vLLM serving
// Qwen2.5-VL: bench/qwen-vl-model-server.js), every call resending the whole history plus a new
// 1280×800 PNG screenshot as a base64 data URL, as computer-use agents do. The stand-in's policy
// clicks after each screenshot and answers after the last one. Every screenshot of the run is a
// different picture (its own seed), made before any clock starts, so the sidecar stores each one
// once. The same agents run directly, through the bare and the persisting pipe, and through the
// sidecar (`processors.images.processor` set, `upstream_flavor: vllm`), in alternating rounds.
// Per target and round: p50 per call, the target process's CPU per call (the calls alone and,
// for the sidecar, with the export), peak RSS; for the sidecar also the journal's growth per call
// while the episodes are open, what the image store grew by against the distinct PNGs sent, and
// the trajectory NDJSON written per call. Every trajectory is checked: one per rollout,
// `images_complete`, T images in the order sent, each span as long as the processor's resize gives
// and made of image pads; the store holds each screenshot once, byte for byte.
const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { dirBytes } = require('./growing-context');
const { fileSizes, newLines } = require('./routed-experts');

const WIDTH = 1280;
const HEIGHT = 800;
// Qwen2.5-VL's processor settings, as the model repository sets them (docs/images.md).
const PROCESSOR = { factor: 28, min_pixels: 3136, max_pixels: 12845056 };
// `<|image_pad|>`, the placeholder the stand-in expands and the sidecar's default
// `processors.images.image_token_id`: the checks below need nothing compiled.
const IMAGE_PAD = 151655;

/** The stand-in's module, compiled into build/ (`npx tsc -p tsconfig.json`). */
function vl() {
  return require('../build/test/support/qwen-vl-server.js');
}

/** The sidecar config (LIGHTNING_CONFIG) the scenario runs with: the processor's settings. */
function sidecarConfig() {
  return `processors:\n  images:\n    processor:\n      factor: ${PROCESSOR.factor}\n      min_pixels: ${PROCESSOR.min_pixels}\n      max_pixels: ${PROCESSOR.max_pixels}\n`;
}

/**
 * The screenshots of `sets` rounds: per round, per agent, per turn a different PNG (seed from all
 * three), with its data URL and SHA-256. Throws if two of them are the same picture.
 */
function makeScreens(sets, agents, turns) {
  const { pngScreenshot, dataUrl } = vl();
  const seen = new Set();
  const out = [];
  for (let s = 0; s < sets; s++) {
    const set = [];
    for (let a = 0; a < agents; a++) {
      const row = [];
      for (let t = 0; t < turns; t++) {
        const png = pngScreenshot(WIDTH, HEIGHT, 1 + s * 10_000 + a * 100 + t);
        const sha256 = crypto.createHash('sha256').update(png).digest('hex');
        if (seen.has(sha256)) throw new Error(`screenshot ${s}/${a}/${t} is the same picture as an earlier one`);
        seen.add(sha256);
        row.push({ png, url: dataUrl(png), sha256 });
      }
      set.push(row);
    }
    out.push(set);
  }
  return out;
}

function post(agent, port, body, headers) {
  return new Promise((resolve) => {
    const start = performance.now();
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        path: '/v1/chat/completions',
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': body.length, ...headers },
      },
      (res) => {
        const parts = [];
        res.on('data', (c) => parts.push(c));
        res.on('end', () => resolve({ status: res.statusCode, ms: performance.now() - start, body: Buffer.concat(parts) }));
        res.on('error', () => resolve({ status: 0, ms: performance.now() - start, body: null }));
      },
    );
    // No call waits more than a minute (the stand-in answers in tens of milliseconds).
    req.setTimeout(60_000, () => req.destroy(new Error('no answer within 60 s')));
    req.on('error', () => resolve({ status: 0, ms: performance.now() - start, body: null }));
    req.end(body);
  });
}

/**
 * One screenshot agent: the task and its first screenshot, then after each click the tool's result
 * and the next screenshot, the whole history each call (ids and logprobs asked for, as the growing
 * context's agents do, so every target moves the same bytes). Returns its latencies, what it sent,
 * and a problem when a call failed or the last answer is not the stand-in's answer after every
 * screenshot.
 */
async function runAgent({ port, rollout, screens, agent }) {
  const { CLICK_TOOLS, MODEL } = vl();
  const messages = [
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Open the settings.' },
        { type: 'image_url', image_url: { url: screens[0].url } },
      ],
    },
  ];
  const ms = [];
  let requestBytes = 0;
  for (let t = 0; t < screens.length; t++) {
    const body = Buffer.from(JSON.stringify({ model: MODEL, messages, tools: CLICK_TOOLS, return_token_ids: true, logprobs: true }));
    const r = await post(agent, port, body, { 'x-rollout-id': rollout });
    if (r.status !== 200)
      return { ms, requestBytes, problem: `${rollout} call ${t + 1}: answered ${r.status} ${r.body ? r.body.toString('utf8', 0, 200) : ''}` };
    ms.push(r.ms);
    requestBytes += body.length;
    const m = JSON.parse(r.body.toString('utf8')).choices[0].message;
    const calls = m.tool_calls ?? [];
    messages.push({ role: 'assistant', content: m.content, ...(calls.length > 0 ? { tool_calls: calls } : {}) });
    if (calls.length === 0) {
      const want = `Done after ${screens.length} screenshots.`;
      return { ms, requestBytes, problem: t === screens.length - 1 && m.content === want ? null : `${rollout}: answered "${m.content}" at call ${t + 1}` };
    }
    if (t === screens.length - 1) return { ms, requestBytes, problem: `${rollout}: still clicking after ${screens.length} screenshots` };
    for (const c of calls) messages.push({ role: 'tool', tool_call_id: c.id, content: 'clicked' });
    messages.push({ role: 'user', content: [{ type: 'image_url', image_url: { url: screens[t + 1].url } }] });
  }
  return { ms, requestBytes, problem: 'no call made' };
}

/** The agents of one round in parallel, each on its own keep-alive connection; `set[a]` is agent a's screenshots. */
async function runAgents({ port, prefix, set }) {
  const all = await Promise.all(
    set.map(async (screens, a) => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      try {
        return await runAgent({ port, rollout: `${prefix}-${a}`, screens, agent });
      } finally {
        agent.destroy();
      }
    }),
  );
  const ms = all.flatMap((x) => x.ms).sort((x, y) => x - y);
  return {
    calls: ms.length,
    errors: all.filter((x) => x.problem !== null).length,
    p50: ms[Math.floor(ms.length / 2)],
    p99: ms[Math.min(ms.length - 1, Math.floor(ms.length * 0.99))],
    request_bytes: all.reduce((n, x) => n + x.requestBytes, 0),
    problems: all.map((x) => x.problem).filter(Boolean),
  };
}

/** The image store's files (`images/<xx>/<sha256>.<ext>`), by name, with their sizes. */
function storedImages(dataDir) {
  const dir = path.join(dataDir, 'images');
  const out = new Map();
  if (!fs.existsSync(dir)) return out;
  for (const sub of fs.readdirSync(dir)) {
    const d = path.join(dir, sub);
    if (!fs.statSync(d).isDirectory()) continue;
    for (const f of fs.readdirSync(d)) out.set(f, fs.statSync(path.join(d, f)).size);
  }
  return out;
}

/**
 * Checks a round's trajectories (the lines added to `dir` since `before`) against the screenshots
 * the agents sent (`set`): one trajectory per rollout, `images_complete` with no error, one image
 * per screenshot in the order sent (sha256, bytes, size), each span `pads` long, inside token_ids,
 * made of the image pad and masked out; and the processor's settings on it.
 */
function checkTrajectories(dir, before, prefix, set, pads) {
  const byRollout = new Map();
  let bytes = 0;
  const problems = [];
  newLines(dir, before, (line) => {
    const t = JSON.parse(line.toString('utf8'));
    if (!t.rollout_id.startsWith(`${prefix}-`)) return;
    bytes += line.length + 1;
    (byRollout.get(t.rollout_id) ?? byRollout.set(t.rollout_id, []).get(t.rollout_id)).push(t);
  });
  let complete = 0;
  let images = 0;
  let spans = 0;
  set.forEach((screens, a) => {
    const rollout = `${prefix}-${a}`;
    const rows = byRollout.get(rollout) ?? [];
    if (rows.length !== 1) return problems.push(`${rollout}: ${rows.length} trajectories`);
    const [t] = rows;
    const list = Array.isArray(t.images) ? t.images : [];
    images += list.length;
    if (t.images_complete === true && t.images_error === null) complete++;
    else problems.push(`${rollout}: images_complete ${t.images_complete}, ${t.images_error}`);
    if (list.length !== screens.length) return problems.push(`${rollout}: ${list.length} images for ${screens.length} screenshots`);
    const p = t.image_processor ?? {};
    if (p.factor !== PROCESSOR.factor || p.min_pixels !== PROCESSOR.min_pixels || p.max_pixels !== PROCESSOR.max_pixels || p.image_token_id !== IMAGE_PAD)
      problems.push(`${rollout}: image_processor ${JSON.stringify(t.image_processor)}`);
    list.forEach((i, k) => {
      const s = screens[k];
      const why =
        i.order !== k
          ? `order ${i.order}`
          : i.sha256 !== s.sha256 || i.bytes !== s.png.length
            ? 'not the screenshot sent there'
            : i.width !== WIDTH || i.height !== HEIGHT
              ? `size ${i.width}×${i.height}`
              : i.length !== pads || !Number.isInteger(i.start) || i.start + i.length > t.token_ids.length
                ? `span ${i.start}+${i.length}`
                : !t.token_ids.slice(i.start, i.start + i.length).every((id) => id === IMAGE_PAD) ||
                    !t.loss_mask.slice(i.start, i.start + i.length).every((x) => x === 0)
                  ? 'span not all masked-out image pads'
                  : null;
      if (why === null) spans++;
      else if (problems.length < 5) problems.push(`${rollout} image ${k}: ${why}`);
    });
  });
  const trajectories = [...byRollout.values()].reduce((n, rows) => n + rows.length, 0);
  return { trajectories, complete, images, spans_ok: spans, line_bytes: bytes, problems };
}

/**
 * Checks the image store after a round: the files added are the round's screenshots, each once,
 * named by its SHA-256 and byte for byte what the agent sent.
 */
function checkStore(dataDir, before, set) {
  const after = storedImages(dataDir);
  const added = [...after.keys()].filter((f) => !before.has(f));
  const sent = set.flat();
  const problems = [];
  for (const s of sent) {
    const file = path.join(dataDir, 'images', s.sha256.slice(0, 2), `${s.sha256}.png`);
    if (!after.has(`${s.sha256}.png`)) problems.push(`screenshot ${s.sha256.slice(0, 12)} not stored`);
    else if (!fs.readFileSync(file).equals(s.png)) problems.push(`screenshot ${s.sha256.slice(0, 12)} stored with other bytes`);
  }
  return {
    stored_files: after.size,
    added_files: added.length,
    added_bytes: added.reduce((n, f) => n + after.get(f), 0),
    sent_distinct: new Set(sent.map((s) => s.sha256)).size,
    sent_png_bytes: sent.reduce((n, s) => n + s.png.length, 0),
    problems: problems.slice(0, 5),
  };
}

/** What the stand-in got since the last time it was asked (qwen-vl-model-server.js's stats port). */
async function modelWindow(model) {
  return (await fetch(`http://127.0.0.1:${model.stats}/bench/window`)).json();
}

function median(xs) {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/**
 * `targets`: {name, port, pid, capture?}; the sidecar has `capture: {dataDir, endRollouts(prefix,
 * agents)}`: its episodes are closed and exported after each round (CPU counted) and checked.
 * `model`: the stand-in ({port, stats, proc}). Warm-up rounds (proxies only) and measured rounds
 * in alternating order; none is started after `budgetMs` (each is bounded: agents × turns calls).
 */
async function benchScreenshots({ targets, model, proc, agents, turns, rounds, warmup, budgetMs, log = () => {}, tag = 'ss' }) {
  const until = Date.now() + budgetMs;
  const { imagePads } = vl();
  const pads = imagePads(HEIGHT, WIDTH, { factor: PROCESSOR.factor, minPixels: PROCESSOR.min_pixels, maxPixels: PROCESSOR.max_pixels });
  // Before any clock: every round's screenshots (a warm-up round's too), all different.
  const t0 = performance.now();
  const screens = makeScreens(warmup + rounds, agents, turns);
  const all = screens.flat(2);
  log(`screenshots: ${all.length} PNGs of ${WIDTH}×${HEIGHT} made in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  const out = {
    agents,
    turns,
    width: WIDTH,
    height: HEIGHT,
    processor: PROCESSOR,
    pads_per_image: pads,
    png_bytes: { median: median(all.map((s) => s.png.length)), min: Math.min(...all.map((s) => s.png.length)), max: Math.max(...all.map((s) => s.png.length)) },
    warmup_rounds: 0,
    rounds: 0,
    targets: {},
  };
  const problems = [];
  for (let w = 0; w < warmup && Date.now() < until; w++, out.warmup_rounds++)
    for (const t of targets) {
      if (!t.pid) continue;
      const res = await runAgents({ port: t.port, prefix: `${tag}w${w}-${t.name}`, set: screens[w] });
      if (t.capture) await t.capture.endRollouts(`${tag}w${w}-${t.name}`, agents);
      if (res.errors > 0) problems.push(`${t.name} warm-up ${w}: ${res.problems.slice(0, 2).join('; ')}`);
    }
  await modelWindow(model); // forgets the warm-up's requests
  for (let r = 0; r < rounds && (r === 0 || Date.now() < until); r++, out.rounds++) {
    const set = screens[warmup + r];
    for (const t of r % 2 === 0 ? targets : [...targets].reverse()) {
      const prefix = `${tag}${r}-${t.name}`;
      const trajDir = t.capture ? path.join(t.capture.dataDir, 'trajectories') : null;
      const filesBefore = trajDir ? fileSizes(trajDir) : null;
      const storeBefore = t.capture ? storedImages(t.capture.dataDir) : null;
      const journalBefore = t.capture ? dirBytes(path.join(t.capture.dataDir, 'journal')) : 0;
      const modelBefore = proc(model.proc.pid);
      const before = t.pid ? proc(t.pid) : null;
      let peak = before ? before.rss : NaN;
      const timer = t.pid ? setInterval(() => (peak = Math.max(peak, proc(t.pid).rss)), 25) : null;
      const res = await runAgents({ port: t.port, prefix, set });
      const loadCpu = before ? proc(t.pid).cpu - before.cpu : NaN;
      const modelCpu = proc(model.proc.pid).cpu - modelBefore.cpu;
      // Every episode is still open: what the journal holds of this round's calls.
      const journalBytes = t.capture ? dirBytes(path.join(t.capture.dataDir, 'journal')) - journalBefore : null;
      // Then the sidecar closes every episode, stores its images and exports its trajectory
      // (capture work too), waited for until every trajectory is written.
      const exportS = t.capture ? await t.capture.endRollouts(prefix, agents) : 0;
      const totalCpu = before ? proc(t.pid).cpu - before.cpu : NaN;
      if (timer) clearInterval(timer);
      if (t.pid) peak = Math.max(peak, proc(t.pid).rss);
      // Read after the CPU figures: neither the stand-in's count nor the checks are in them.
      const w = await modelWindow(model);
      const round = {
        calls: res.calls,
        errors: res.errors,
        p50_ms: res.p50,
        p99_ms: res.p99,
        request_bytes_per_call: res.request_bytes / res.calls,
        upstream_requests: w.requests['/v1/chat/completions'] ?? 0,
        upstream_images: w.images,
        upstream_pad_counts: w.pad_counts,
        model_server_cpu_us_per_call: (modelCpu / res.calls) * 1e6,
      };
      if (t.pid) {
        round.cpu_us_per_call_load = (loadCpu / res.calls) * 1e6;
        round.cpu_us_per_call = (totalCpu / res.calls) * 1e6;
        round.peak_rss_mib = peak / 2 ** 20;
      }
      if (res.errors > 0) problems.push(`${t.name} round ${r}: ${res.problems.slice(0, 2).join('; ')}`);
      if (round.upstream_requests !== res.calls)
        problems.push(`${t.name} round ${r}: ${round.upstream_requests} requests reached the stand-in for ${res.calls} calls`);
      if (w.pad_counts.some((n) => n !== pads))
        problems.push(`${t.name} round ${r}: the stand-in expanded images to ${w.pad_counts.join(', ')} pads, not ${pads}`);
      if (t.capture) {
        const check = checkTrajectories(trajDir, filesBefore, prefix, set, pads);
        const store = checkStore(t.capture.dataDir, storeBefore, set);
        const written = [...fileSizes(trajDir)].reduce((n, [f, size]) => n + size - (filesBefore.get(f) ?? 0), 0);
        Object.assign(round, {
          export_s: exportS,
          journal_bytes_per_call: journalBytes / res.calls,
          trajectory_bytes: written,
          trajectory_bytes_per_call: written / res.calls,
          trajectories: check.trajectories,
          images_complete: check.complete,
          images: check.images,
          spans_ok: check.spans_ok,
          stored_files: store.stored_files,
          stored_added: store.added_files,
          stored_bytes: store.added_bytes,
          sent_distinct: store.sent_distinct,
          sent_png_bytes: store.sent_png_bytes,
        });
        const bad = [...check.problems, ...store.problems];
        if (check.trajectories !== agents || check.complete !== agents || check.spans_ok !== agents * turns || bad.length > 0)
          problems.push(
            `${t.name} round ${r}: ${check.trajectories} trajectories for ${agents} rollouts, ${check.complete} images_complete, ${check.spans_ok} of ${agents * turns} images as sent with ${pads}-pad spans${bad.length ? ` (${bad.slice(0, 3).join('; ')})` : ''}`,
          );
        if (store.added_files !== store.sent_distinct)
          problems.push(`${t.name} round ${r}: ${store.added_files} images stored for ${store.sent_distinct} distinct screenshots sent`);
      }
      (out.targets[t.name] ??= { rounds: [] }).rounds.push(round);
    }
  }
  // Medians over rounds, then the sidecar's CPU against the pipes'.
  for (const x of Object.values(out.targets)) {
    const keys = new Set(x.rounds.flatMap((r) => Object.keys(r).filter((k) => typeof r[k] === 'number')));
    x.median = Object.fromEntries([...keys].map((k) => [k, median(x.rounds.map((r) => r[k]))]));
  }
  const sc = out.targets.sidecar;
  if (sc) {
    const sum = (k) => sc.rounds.reduce((n, r) => n + (r[k] ?? 0), 0);
    out.images = {
      sent_distinct: sum('sent_distinct'),
      stored_added: sum('stored_added'),
      stored_files: Math.max(...sc.rounds.map((r) => r.stored_files)),
      stored_bytes: sum('stored_bytes'),
      sent_png_bytes: sum('sent_png_bytes'),
      trajectories: sum('trajectories'),
      images_complete: sum('images_complete'),
      images: sum('images'),
      spans_ok: sum('spans_ok'),
    };
  }
  const ratio = (a, b, k) => (out.targets[a] && out.targets[b] ? out.targets[a].median[k] / out.targets[b].median[k] : NaN);
  // Within each round (the two targets ran one after the other), as the bars table does.
  const paired = (a, b, k) =>
    out.targets[a] && out.targets[b] ? median(out.targets[a].rounds.map((x, i) => x[k] / (out.targets[b].rounds[i]?.[k] ?? NaN))) : NaN;
  out.ratios = {
    cpu_per_call_vs_persist: ratio('sidecar', 'bare-persist', 'cpu_us_per_call'),
    cpu_per_call_vs_persist_paired: paired('sidecar', 'bare-persist', 'cpu_us_per_call'),
    cpu_per_call_load_vs_persist: ratio('sidecar', 'bare-persist', 'cpu_us_per_call_load'),
    cpu_per_call_vs_bare: ratio('sidecar', 'bare-pipe', 'cpu_us_per_call'),
    persist_vs_bare: ratio('bare-persist', 'bare-pipe', 'cpu_us_per_call'),
  };
  if (out.rounds === 0) problems.push('no round was measured within the time budget');
  out.error = problems.length > 0 ? problems.join(' | ') : null;
  return out;
}

module.exports = { benchScreenshots, sidecarConfig, makeScreens, checkTrajectories, checkStore, storedImages, PROCESSOR, IMAGE_PAD };
