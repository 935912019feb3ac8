'use strict';
// "Routing": one sidecar in front of R model-server replicas, each with vLLM-style automatic
// prefix caching (prefix-cache-server.js). Agents with growing contexts resend their whole
// history every call, so a replica that served a rollout's last call has all but the new turn
// cached; a replica that did not recomputes the prompt (prefill), which costs time to first token
// and GPU. Three placements of the same workload, each against fresh replicas and a fresh sidecar:
// - service: the sidecar given one address that spreads connections over the replicas at random,
//   as a Kubernetes Service does (kube-proxy balances per connection, not per call);
// - round_robin: the sidecar given every replica, each call to the next;
// - sticky: the sidecar given every replica, a rollout's calls kept on the replica of its first.
// The cache capacity lets each replica hold its share of the conversations (with sticky
// placement) but not every conversation (with spreading), as KV-cache memory does.
// Reported per case: agent-side TTFT (first SSE byte through the sidecar), wall time, prefill
// tokens computed against an ideal (one replica, unlimited cache), cache hit rate and the calls
// each replica served. Run it alone with `npm run bench -- --only routing`.
const http = require('node:http');
const net = require('node:net');
const { quantile } = require('./lib');
const { startPrefixCacheServer, PrefixCache, blockHashes, answerText } = require('./prefix-cache-server');
const { promptIds } = require('./agent-tokens');

const REPLICAS = 4;
const AGENTS = 16;
const BLOCK_TOKENS = 16;
// Prefill at 20k tokens/s a replica, about what one GPU does for an 8B model.
const PER_TOKEN_US = 50;
const BASE_MS = 5;
const ITL_MS = 2;
// Cache per replica: this many times its share (AGENTS / REPLICAS) of full-length conversations.
const HEADROOM = 1.5;
const CASES = ['service', 'round_robin', 'sticky'];

// Shared by every agent: the only prefix conversations have in common (~200 tokens).
const SYSTEM = 'You are a coding agent working in a sandbox. Think, then call exactly one tool per step. '.repeat(9);

/** ~1–2k tokens (~4 bytes a token) of text, different for every agent and turn. */
function toolText(agent, turn) {
  const tokens = 1000 + ((agent * 7 + turn * 5) % 9) * 125;
  const line = `agent ${agent} turn ${turn}: row ${agent * 100 + turn} of the tool output, with numbers and words. `;
  return line.repeat(Math.ceil((tokens * 4) / line.length)).slice(0, tokens * 4);
}

/** How long the agent's tool runs after answer `turn` (100–370 ms): agents drift apart as real ones do. */
function toolMs(agent, turn) {
  return 100 + ((agent * 13 + turn * 7) % 10) * 30;
}

/** The conversation's first messages: the shared system prompt, then the agent's task and its first output. */
function firstMessages(agent) {
  return [
    { role: 'system', content: SYSTEM },
    { role: 'user', content: `Task ${agent}: fix the failing test.\n${toolText(agent, 0)}` },
  ];
}

/** The conversation as the stand-in answers it (its answers depend only on the prompt's length): every prompt's ids. */
function prompts(agent, turns) {
  const messages = firstMessages(agent);
  const out = [];
  for (let t = 0; t < turns; t++) {
    const ids = promptIds(messages);
    out.push(ids);
    messages.push({ role: 'assistant', content: answerText(ids.length) }, { role: 'tool', content: toolText(agent, t + 1) });
  }
  return out;
}

function settings(quick) {
  const turns = quick ? 6 : 12;
  const all = Array.from({ length: AGENTS }, (_, a) => prompts(a, turns));
  const finalTokens = Math.max(...all.map((p) => p[p.length - 1].length));
  const capacityBlocks = Math.ceil((HEADROOM * (AGENTS / REPLICAS) * finalTokens) / BLOCK_TOKENS);
  // The ideal: one replica whose cache never evicts computes each prompt's new part once.
  const ideal = new PrefixCache(Infinity);
  let idealPrefill = 0;
  let promptTokens = 0;
  for (const agentPrompts of all)
    for (const ids of agentPrompts) {
      const hashes = blockHashes(ids, BLOCK_TOKENS);
      idealPrefill += ids.length - ideal.cachedTokens(hashes, ids.length, BLOCK_TOKENS);
      ideal.touch(hashes);
      promptTokens += ids.length;
    }
  return {
    replicas: REPLICAS,
    agents: AGENTS,
    turns,
    block_tokens: BLOCK_TOKENS,
    capacity_tokens: capacityBlocks * BLOCK_TOKENS,
    headroom: HEADROOM,
    per_token_us: PER_TOKEN_US,
    base_ms: BASE_MS,
    itl_ms: ITL_MS,
    final_prompt_tokens: finalTokens,
    prompt_tokens: promptTokens,
    ideal_prefill_tokens: idealPrefill,
    ideal_cache_hit_rate: 1 - idealPrefill / promptTokens,
  };
}

/**
 * A Kubernetes Service on 127.0.0.1: each incoming connection piped to a replica chosen at random
 * (kube-proxy's iptables mode); every call on that connection then goes to the same replica. The
 * choices come from a fixed seed, so runs differ only by timing.
 */
function startBalancer(ports, seed = 1) {
  const connections = ports.map(() => 0);
  const sockets = new Set();
  let state = seed >>> 0;
  // mulberry32: well mixed from its first output, unlike xorshift from a small seed.
  const random = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = Math.imul(state ^ (state >>> 15), state | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
  const server = net.createServer((client) => {
    const i = Math.floor(random() * ports.length);
    connections[i]++;
    const upstream = net.connect(ports[i], '127.0.0.1');
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.once('close', () => sockets.delete(s));
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () =>
      resolve({
        port: server.address().port,
        connections: () => [...connections],
        close: () =>
          new Promise((done) => {
            for (const s of sockets) s.destroy();
            server.close(() => done());
          }),
      }),
    );
  });
}

/** One streamed call: status, TTFT (first body byte), latency and the answer's text; status 0 on a network error or timeout. */
function call(agent, port, body, rollout, timeoutMs) {
  return new Promise((resolve) => {
    const start = performance.now();
    let first = 0;
    const failed = () => resolve({ status: 0, ttftMs: NaN, ms: performance.now() - start, text: null, done: false });
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        path: '/v1/chat/completions',
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': body.length, 'x-rollout-id': rollout },
      },
      (res) => {
        const parts = [];
        res.on('data', (c) => {
          if (first === 0) first = performance.now();
          parts.push(c);
        });
        res.on('end', () => {
          const end = performance.now();
          const { text, done } = res.statusCode === 200 ? readStream(Buffer.concat(parts).toString('utf8')) : { text: null, done: false };
          resolve({ status: res.statusCode, ttftMs: (first || end) - start, ms: end - start, text, done });
        });
        res.on('error', failed);
      },
    );
    req.setTimeout(timeoutMs, () => req.destroy(new Error('timed out')));
    req.on('error', failed);
    req.end(body);
  });
}

/** An SSE answer's text, and whether it ended with `[DONE]`. */
function readStream(body) {
  let text = '';
  let done = false;
  for (const line of body.split('\n')) {
    if (line === 'data: [DONE]') done = true;
    if (!line.startsWith('data: {')) continue;
    const delta = JSON.parse(line.slice(6)).choices?.[0]?.delta;
    if (typeof delta?.content === 'string') text += delta.content;
  }
  return { text, done };
}

/**
 * One agent's rollout: `turns` streamed calls, each resending the history with the last answer
 * and a new tool output, its tool's run time apart. Stops at its first failed call (the conversation cannot go on) or at
 * the deadline; returns its calls.
 */
async function runAgent({ port, agent, rollout, turns, deadline, timeoutMs }) {
  const pool = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const messages = firstMessages(agent);
  const calls = [];
  for (let t = 0; t < turns && performance.now() < deadline; t++) {
    const body = Buffer.from(JSON.stringify({ model: 'bench-policy', messages, stream: true, max_tokens: 64 }));
    const r = await call(pool, port, body, rollout, Math.min(timeoutMs, Math.max(1, deadline - performance.now())));
    // The stand-in's answer is known from the prompt: anything else means the stream was damaged on the way.
    r.ok = r.status === 200 && r.done && r.text === answerText(promptIds(messages).length);
    calls.push(r);
    if (!r.ok) break;
    if (t + 1 < turns) await new Promise((resolve) => setTimeout(resolve, toolMs(agent, t)));
    messages.push({ role: 'assistant', content: r.text }, { role: 'tool', content: toolText(agent, t + 1) });
  }
  pool.destroy();
  return calls;
}

function sum(xs) {
  return xs.reduce((a, b) => a + b, 0);
}

/** One placement against fresh replicas and a fresh sidecar. */
async function runCase(name, s, { startSidecar, stop, deadlineMs }) {
  const replicas = await Promise.all(
    Array.from({ length: REPLICAS }, () =>
      startPrefixCacheServer({ capacityTokens: s.capacity_tokens, blockTokens: BLOCK_TOKENS, perTokenUs: PER_TOKEN_US, baseMs: BASE_MS, itlMs: ITL_MS }),
    ),
  );
  const urls = replicas.map((r) => `http://127.0.0.1:${r.port}/v1`);
  let balancer = null;
  let sidecar = null;
  try {
    try {
      // Episodes stay open for the whole run: a call queued for seconds must not close its rollout.
      const env = { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000' };
      if (name === 'service') {
        balancer = await startBalancer(replicas.map((r) => r.port));
        sidecar = await startSidecar(balancer.port, { ...env, LIGHTNING_UPSTREAM_URL: `http://127.0.0.1:${balancer.port}/v1` });
      } else {
        sidecar = await startSidecar(replicas[0].port, { ...env, LIGHTNING_UPSTREAM_URL: urls.join(','), LIGHTNING_UPSTREAM_ROUTING: name });
      }
    } catch (err) {
      return { error: `did not start: ${err.message}` };
    }
    return await measure(name, s, { replicas, sidecar, balancer, deadlineMs });
  } finally {
    if (sidecar) await stop(sidecar.proc);
    if (balancer) await balancer.close();
    await Promise.all(replicas.map((r) => r.close()));
  }
}

/** Runs the agents through `sidecar` and reads what the replicas computed. */
async function measure(name, s, { replicas, sidecar, balancer, deadlineMs }) {
  const tag = `rt-${name}-${Date.now()}`;
  const t0 = performance.now();
  const perAgent = await Promise.all(
    Array.from({ length: AGENTS }, (_, a) =>
      runAgent({ port: sidecar.port, agent: a, rollout: `${tag}-${a}`, turns: s.turns, deadline: t0 + deadlineMs, timeoutMs: 60_000 }),
    ),
  );
  const wallMs = performance.now() - t0;
  const calls = perAgent.flat();
  const ok = calls.filter((c) => c.ok);
  const ttft = ok.map((c) => c.ttftMs).sort((x, y) => x - y);
  const lat = ok.map((c) => c.ms).sort((x, y) => x - y);
  const stats = replicas.map((r) => r.stats());
  const serverTtft = stats.flatMap((x) => x.ttftMs).sort((x, y) => x - y);
  const perReplica = stats.map((x) => x.calls);
  const promptTokens = sum(stats.map((x) => x.promptTokens));
  const cachedTokens = sum(stats.map((x) => x.cachedTokens));
  const prefillTokens = sum(stats.map((x) => x.prefillTokens));
  return {
    expected_calls: AGENTS * s.turns,
    calls: ok.length,
    failures: calls.length - ok.length,
    // Calls never made: an agent stops at its first failure, or all stop at the deadline.
    not_made: AGENTS * s.turns - calls.length,
    failed_statuses: [...new Set(calls.filter((c) => !c.ok).map((c) => c.status))],
    wall_s: wallMs / 1000,
    ttft_ms: { p50: quantile(ttft, 0.5), p99: quantile(ttft, 0.99) },
    latency_ms: { p50: quantile(lat, 0.5), p99: quantile(lat, 0.99) },
    // At the replicas: arrival to first token, queueing for the prefill lane included.
    replica_ttft_ms: { p50: quantile(serverTtft, 0.5), p99: quantile(serverTtft, 0.99) },
    prompt_tokens: promptTokens,
    cached_tokens: cachedTokens,
    prefill_tokens: prefillTokens,
    cache_hit_rate: promptTokens > 0 ? cachedTokens / promptTokens : NaN,
    // Only comparable when every call was made (the ideal is for the whole workload).
    prefill_vs_ideal: prefillTokens / s.ideal_prefill_tokens,
    calls_per_replica: perReplica,
    calls_max_over_mean: Math.max(...perReplica) / (sum(perReplica) / REPLICAS),
    prefill_tokens_per_replica: stats.map((x) => x.prefillTokens),
    evicted_blocks: sum(stats.map((x) => x.evictedBlocks)),
    ...(balancer ? { connections_per_replica: balancer.connections() } : {}),
  };
}

/**
 * Runs the three placements (or `cases`); `startSidecar(upstreamPort, env)` and `stop(proc)` as
 * in run.js. A case whose sidecar does not start (a sidecar without several upstreams) is
 * reported with `error` instead of failing the run.
 */
async function benchRouting({ startSidecar, stop, quick = false, cases = CASES, log = () => {} }) {
  const s = settings(quick);
  // Per case: the bound on the agents' time; a run over it stops early and says so (not_made).
  const deadlineMs = quick ? 15_000 : 45_000;
  const out = { ...s, cases: {} };
  for (const name of cases) {
    log(`routing: ${name}`);
    out.cases[name] = await runCase(name, s, { startSidecar, stop, deadlineMs });
  }
  return out;
}

module.exports = { benchRouting, startBalancer };
