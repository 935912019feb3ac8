'use strict';
// "Token-in": calculator agents in tool loops with growing contexts, against the vLLM stand-in
// with Qwen3's real tokenizer and chat template. Each agent asks for N results in one user query;
// the model calls the calculator once per result (thinking first), each tool result adds ~1 KiB of
// output to the context, then it answers; the agent drops `reasoning_content` when it sends the
// history back, as most frameworks do. The same agents run directly, through a sidecar with
// token-in off, and through one with it on: added p50 latency and CPU per call, on vs off, and
// how many calls were spliced (from the sidecar's metrics).
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

async function metricSum(telemetryPort, name, match) {
  const text = await (await fetch(`http://127.0.0.1:${telemetryPort}/metrics`)).text();
  let n = 0;
  for (const line of text.split('\n')) if (line.startsWith(name) && line.includes(match)) n += Number(line.split(' ').pop());
  return n;
}

async function benchTokenIn({ model, off, on, proc, agents, results, rounds, warmup }) {
  const targets = [
    { name: 'direct', port: model.port, pid: null },
    { name: 'sidecar', port: off.port, pid: off.proc.pid, sidecar: off },
    { name: 'sidecar-token-in', port: on.port, pid: on.proc.pid, sidecar: on },
  ];
  const out = { agents, results_per_agent: results, calls_per_agent: results + 1, targets: {} };
  for (let w = 0; w < warmup; w++) for (const t of targets) if (t.pid) await runAgents({ port: t.port, prefix: `tiw${w}-${t.name}`, agents, results });
  for (let r = 0; r < rounds; r++) {
    for (const t of r % 2 === 0 ? targets : [...targets].reverse()) {
      const before = t.pid ? proc(t.pid) : null;
      const modelBefore = proc(model.proc.pid);
      const ms = await runAgents({ port: t.port, prefix: t.pid ? `ti${r}-${t.name}` : null, agents, results });
      const after = t.pid ? proc(t.pid) : null;
      const modelAfter = proc(model.proc.pid);
      const x = (out.targets[t.name] ??= { rounds: [] });
      x.rounds.push({
        calls: ms.length,
        p50_ms: median(ms),
        cpu_us_per_call: before ? ((after.cpu - before.cpu) / ms.length) * 1e6 : null,
        model_server_cpu_us_per_call: ((modelAfter.cpu - modelBefore.cpu) / ms.length) * 1e6,
      });
    }
  }
  for (const t of targets) {
    const x = out.targets[t.name];
    x.p50_ms = median(x.rounds.map((r) => r.p50_ms));
    x.cpu_us_per_call = t.pid ? median(x.rounds.map((r) => r.cpu_us_per_call)) : null;
    x.model_server_cpu_us_per_call = median(x.rounds.map((r) => r.model_server_cpu_us_per_call));
  }
  out.spliced = await metricSum(on.telemetry, 'lightning_sidecar_token_in_calls_total', 'result="spliced"');
  out.rendered = await metricSum(on.telemetry, 'lightning_sidecar_token_in_calls_total', 'result="rendered"');
  out.fallback = await metricSum(on.telemetry, 'lightning_sidecar_token_in_calls_total', 'result="fallback"');
  const d = out.targets.direct.p50_ms;
  out.added_p50_ms = { off: out.targets.sidecar.p50_ms - d, on: out.targets['sidecar-token-in'].p50_ms - d };
  out.cpu_us_per_call = { off: out.targets.sidecar.cpu_us_per_call, on: out.targets['sidecar-token-in'].cpu_us_per_call };
  return out;
}

module.exports = { benchTokenIn };
