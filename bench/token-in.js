'use strict';
// "Token-in": calculator agents in tool loops with growing contexts, against the vLLM stand-in
// with Qwen3's real tokenizer and chat template. Each agent asks for N results in one user query;
// the model calls the calculator once per result (thinking first), each tool result adds ~1 KiB of
// output to the context, then it answers; the agent drops `reasoning_content` when it sends the
// history back, as most frameworks do. The same agents run directly, through a sidecar with
// token-in off, one with token-in rendered by the server (`/tokenize` every call) and one that
// renders locally from Qwen3's tokenizer files: added p50 latency and CPU per call, the model
// server's requests per call by route (counted there), and the token-in counters (from each
// sidecar's metrics). The model server checks the prompts: each continues an earlier one and the
// ids it sampled after it, and the local rendering's prompts are the server rendering's.
const http = require('node:http');
const { median } = require('./lib');

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'calculator',
      description: 'Evaluates one arithmetic expression',
      parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
    },
  },
];

function post(agent, port, path, body) {
  return new Promise((resolve, reject) => {
    const start = performance.now();
    const req = http.request(
      { host: '127.0.0.1', port, path, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': body.length } },
      (res) => {
        const parts = [];
        res.on('data', (c) => parts.push(c));
        res.on('end', () => resolve({ status: res.statusCode, ms: performance.now() - start, body: Buffer.concat(parts) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    // No call waits more than a minute (the stand-in answers in tens of milliseconds).
    req.setTimeout(60_000, () => req.destroy(new Error('no answer within 60 s')));
    req.end(body);
  });
}

function evaluate(e) {
  const m = /^(-?\d+)\s*([-+*])\s*(-?\d+)$/.exec(e.trim());
  if (!m) return 'error';
  const [a, b] = [Number(m[1]), Number(m[3])];
  return String(m[2] === '+' ? a + b : m[2] === '-' ? a - b : a * b);
}

/** One agent's tool loop: its call latencies and how many calls it made; throws on a wrong answer. */
async function runAgent({ port, rollout, results, agent }) {
  const path = rollout ? `/rollout/${rollout}/v1/chat/completions` : '/v1/chat/completions';
  const exprs = Array.from({ length: results }, (_, i) => `${i + 2}*${i + 3}`);
  const messages = [
    { role: 'system', content: 'You are a careful calculator agent.' },
    { role: 'user', content: `Compute ${exprs.join(', ')}.` },
  ];
  const ms = [];
  for (let step = 0; step <= results; step++) {
    const r = await post(agent, port, path, Buffer.from(JSON.stringify({ model: 'Qwen/Qwen3-8B', messages, tools: TOOLS })));
    if (r.status !== 200) throw new Error(`call answered ${r.status}: ${r.body.toString('utf8', 0, 300)}`);
    ms.push(r.ms);
    const m = JSON.parse(r.body.toString('utf8')).choices[0].message;
    messages.push({ role: 'assistant', content: m.content, ...(m.tool_calls?.length ? { tool_calls: m.tool_calls } : {}) });
    if (!m.tool_calls?.length) {
      // The stand-in's answer names each expression with its tool result (the result's first line).
      const wrong = exprs.filter((e) => !m.content.includes(`${e} = ${evaluate(e)}`));
      if (wrong.length > 0) throw new Error(`wrong final answer for ${wrong.join(', ')}: ${m.content.slice(0, 200)}`);
      return ms;
    }
    for (const c of m.tool_calls) {
      const { expression } = JSON.parse(c.function.arguments);
      // The result, then ~1 KiB of tool output: the context grows by a tool turn each call.
      const out = `${evaluate(expression)}`;
      messages.push({ role: 'tool', tool_call_id: c.id, content: `${out}\n${'log line of the calculator tool output. '.repeat(26)}`.trim() });
    }
  }
  throw new Error('the agent did not finish');
}

async function runAgents({ port, prefix, agents, results }) {
  const pool = new http.Agent({ keepAlive: true, maxSockets: agents });
  const all = await Promise.all(Array.from({ length: agents }, (_, a) => runAgent({ port, rollout: prefix ? `${prefix}-${a}` : null, results, agent: pool })));
  pool.destroy();
  return all.flat();
}

/** The sidecar's /metrics text. */
async function metricsText(telemetryPort) {
  return (await fetch(`http://127.0.0.1:${telemetryPort}/metrics`)).text();
}

/** The sum of a counter's samples whose labels include `match`. */
function metricSum(text, name, match) {
  let n = 0;
  for (const line of text.split('\n')) if (line.startsWith(`${name}{`) && line.includes(match)) n += Number(line.split(' ').pop());
  return n;
}

/** The token-in counters of a sidecar, by what they count. */
function tokenInCounters(text) {
  const calls = (r) => metricSum(text, 'lightning_sidecar_token_in_calls_total', `result="${r}"`);
  return {
    spliced: calls('spliced'),
    rendered: calls('rendered'),
    fallback: calls('fallback'),
    rendered_by_sidecar: metricSum(text, 'lightning_sidecar_token_in_rendering_total', 'by="sidecar"'),
    rendered_by_server: metricSum(text, 'lightning_sidecar_token_in_rendering_total', 'by="server"'),
    checks_match: metricSum(text, 'lightning_sidecar_token_in_render_checks_total', 'result="match"'),
    checks_mismatch: metricSum(text, 'lightning_sidecar_token_in_render_checks_total', 'result="mismatch"'),
  };
}

const minus = (a, b) => Object.fromEntries(Object.keys(a).map((k) => [k, a[k] - b[k]]));
const total = (rounds, key) => rounds.reduce((n, r) => n + (r[key] ?? 0), 0);

/** What the model server got since it was last asked (its stats port; see qwen3-model-server.js). */
async function modelWindow(model) {
  return (await fetch(`http://127.0.0.1:${model.stats}/bench/window`)).json();
}

/**
 * The same agents directly, through a sidecar with token-in off, one with token-in rendered by the
 * server (`/tokenize` every call), and one rendering locally from Qwen3's tokenizer files
 * (`token_in.tokenizer_dir`, `verify_fraction` at its default): warm-up rounds for the sidecars,
 * then measured rounds in alternating order, none started after `budgetMs`.
 */
async function benchTokenIn({ model, off, on, local, proc, agents, results, rounds, warmup, budgetMs }) {
  const targets = [
    { name: 'direct', port: model.port, pid: null },
    { name: 'sidecar', port: off.port, pid: off.proc.pid, sidecar: off },
    { name: 'sidecar-token-in', port: on.port, pid: on.proc.pid, sidecar: on, tokenIn: true },
    { name: 'sidecar-token-in-local', port: local.port, pid: local.proc.pid, sidecar: local, tokenIn: true },
  ];
  const out = { agents, results_per_agent: results, calls_per_agent: results + 1, warmup_rounds: warmup, targets: {} };
  const t0 = performance.now();
  for (let w = 0; w < warmup; w++) for (const t of targets) if (t.pid) await runAgents({ port: t.port, prefix: `tiw${w}-${t.name}`, agents, results });
  await modelWindow(model); // forgets the warm-up's requests
  let done = 0;
  for (let r = 0; r < rounds && performance.now() - t0 < budgetMs; r++, done++) {
    for (const t of r % 2 === 0 ? targets : [...targets].reverse()) {
      const countersBefore = t.tokenIn ? tokenInCounters(await metricsText(t.sidecar.telemetry)) : null;
      const before = t.pid ? proc(t.pid) : null;
      const modelBefore = proc(model.proc.pid);
      const ms = await runAgents({ port: t.port, prefix: t.pid ? `ti${r}-${t.name}` : null, agents, results });
      const after = t.pid ? proc(t.pid) : null;
      const modelAfter = proc(model.proc.pid);
      // Read after the CPU figures: neither the metrics nor the model server's check is in them.
      const counters = t.tokenIn ? minus(tokenInCounters(await metricsText(t.sidecar.telemetry)), countersBefore) : null;
      const w = await modelWindow(model);
      const x = (out.targets[t.name] ??= { rounds: [] });
      x.rounds.push({
        calls: ms.length,
        p50_ms: median(ms),
        cpu_us_per_call: before ? ((after.cpu - before.cpu) / ms.length) * 1e6 : null,
        model_server_cpu_us_per_call: ((modelAfter.cpu - modelBefore.cpu) / ms.length) * 1e6,
        tokenize: w.requests['/tokenize'] ?? 0,
        completions: w.completions,
        chat: w.requests['/v1/chat/completions'] ?? 0,
        // Completions prompts that are an earlier prompt of the round and the ids sampled after it, then more.
        continuing: w.continuing,
        max_prompt_tokens: w.max_prompt_tokens,
        distinct_prompts: w.distinct_prompts,
        ...(counters ? { counters } : {}),
      });
    }
  }
  out.rounds = done;
  for (const t of targets) {
    const x = out.targets[t.name];
    if (!x) continue;
    const calls = total(x.rounds, 'calls');
    x.p50_ms = median(x.rounds.map((r) => r.p50_ms));
    x.cpu_us_per_call = t.pid ? median(x.rounds.map((r) => r.cpu_us_per_call)) : null;
    x.model_server_cpu_us_per_call = median(x.rounds.map((r) => r.model_server_cpu_us_per_call));
    x.calls = calls;
    x.tokenize_per_call = total(x.rounds, 'tokenize') / calls;
    x.completions_per_call = total(x.rounds, 'completions') / calls;
    x.chat_per_call = total(x.rounds, 'chat') / calls;
    x.continuing = total(x.rounds, 'continuing');
    x.max_prompt_tokens = Math.max(...x.rounds.map((r) => r.max_prompt_tokens));
    if (t.tokenIn) {
      x.counters = {};
      for (const r of x.rounds) for (const [k, v] of Object.entries(r.counters)) x.counters[k] = (x.counters[k] ?? 0) + v;
    }
  }
  if (done === 0) return { ...out, error: 'no round was measured within the time budget' };
  const d = out.targets.direct.p50_ms;
  const offP50 = out.targets.sidecar.p50_ms;
  for (const x of Object.values(out.targets)) {
    x.added_p50_ms = x === out.targets.direct ? null : x.p50_ms - d;
    x.over_off_p50_ms = x === out.targets.direct || x === out.targets.sidecar ? null : x.p50_ms - offP50;
  }
  // Kept under their earlier names (token-in with the server's rendering as "on").
  const onT = out.targets['sidecar-token-in'];
  Object.assign(out, { spliced: onT.counters.spliced, rendered: onT.counters.rendered, fallback: onT.counters.fallback });
  out.added_p50_ms = { off: out.targets.sidecar.added_p50_ms, on: onT.added_p50_ms, local: out.targets['sidecar-token-in-local'].added_p50_ms };
  out.cpu_us_per_call = { off: out.targets.sidecar.cpu_us_per_call, on: onT.cpu_us_per_call, local: out.targets['sidecar-token-in-local'].cpu_us_per_call };
  // Correctness: under token-in every call is a completions call whose prompt, but for each
  // rollout's first, continues an earlier prompt and the ids sampled after it; and the local
  // rendering's prompts are the server rendering's, id for id (the workload is deterministic:
  // Qwen3's template renders no tool-call ids).
  const problems = [];
  for (const name of ['sidecar-token-in', 'sidecar-token-in-local']) {
    const x = out.targets[name];
    const firsts = agents * x.rounds.length;
    if (x.completions_per_call !== 1 || x.chat_per_call !== 0)
      problems.push(`${name}: ${x.completions_per_call} completions and ${x.chat_per_call} chat calls a call`);
    if (x.continuing !== x.calls - firsts)
      problems.push(`${name}: ${x.continuing} prompts continue the previous prompt and sampled ids, of ${x.calls - firsts} expected`);
    if (x.counters.spliced !== x.calls - firsts || x.counters.fallback !== 0)
      problems.push(`${name}: ${x.counters.spliced} spliced, ${x.counters.fallback} through as chat`);
  }
  const lc = out.targets['sidecar-token-in-local'].counters;
  if (lc.checks_mismatch !== 0) problems.push(`local rendering: ${lc.checks_mismatch} checks against the server's rendering mismatched`);
  const promptSet = (name) => new Set(out.targets[name].rounds.flatMap((r) => r.distinct_prompts));
  const [server, mine] = [promptSet('sidecar-token-in'), promptSet('sidecar-token-in-local')];
  const same = server.size === mine.size && [...server].every((p) => mine.has(p));
  if (!same) problems.push(`local rendering: its ${mine.size} distinct prompts are not the server rendering's ${server.size}`);
  out.checks = { distinct_prompts: server.size, local_prompts_same_as_server: same, problems };
  for (const x of Object.values(out.targets)) for (const r of x.rounds) delete r.distinct_prompts;
  if (problems.length > 0) out.error = problems.join('; ');
  return out;
}

module.exports = { benchTokenIn };
