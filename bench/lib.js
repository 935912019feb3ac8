'use strict';
// Bench helpers: bounded load generators, process sampling, child processes, statistics.
const http = require('node:http');
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const CLK_TCK = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** CPU seconds (user + system) of a process or one of its threads, from a /proc stat file. */
function statCpu(file) {
  const { user, sys } = statTimes(file);
  return user + sys;
}

/** User and system CPU seconds from a /proc stat file (utime and stime). */
function statTimes(file) {
  const stat = fs.readFileSync(file, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: Number(f[11]) / CLK_TCK, sys: Number(f[12]) / CLK_TCK };
}

/** A process's main thread's user and system CPU seconds (for Node: the event loop). */
function mainThreadTimes(pid) {
  return statTimes(`/proc/${pid}/task/${pid}/stat`);
}

/**
 * CPU seconds (user + system) and RSS bytes of a process, from /proc; `mainCpu` is its main
 * thread's (for Node: the event loop; the rest is the thread pool's file I/O and fsync, GC helpers).
 */
function proc(pid) {
  const cpu = statCpu(`/proc/${pid}/stat`);
  let mainCpu = NaN;
  try {
    mainCpu = statCpu(`/proc/${pid}/task/${pid}/stat`);
  } catch {
    // No per-thread figures here.
  }
  const rss = Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
  return { cpu, mainCpu, rss };
}

function quantile(sorted, q) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
}

/** Starts a node child that prints {"port": N} (and maybe other ports); resolves with { proc, port, … }. */
function startNodeChild(script, args, env = {}) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [script, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
    let buf = '';
    const t = setTimeout(() => reject(new Error(`${script} did not start`)), 10_000);
    p.stdout.on('data', (c) => {
      buf += c;
      // {"port": N} and, from some children, more ports (e.g. "stats") on the same line.
      const m = /\{"port":\d+(?:,"\w+":\d+)*\}/.exec(buf);
      if (m) {
        clearTimeout(t);
        resolve({ ...JSON.parse(m[0]), proc: p });
      }
    });
    p.once('exit', (code) => reject(new Error(`${script} exited (${code})`)));
  });
}

async function waitHttp(url, timeoutMs = 15_000) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {
      // not up yet
    }
    if (Date.now() > until) throw new Error(`${url} not ready`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Closed-loop load: `conns` keep-alive connections, each sending one request after another, until
 * `durationMs` or `maxRequests` (both bounds hold). Latency is request start → response end; ttfb is
 * request start → first body byte.
 */
function closedLoop({ port, path, body, headers = {}, conns, durationMs, maxRequests = 1e9 }) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: conns });
  const payload = Buffer.isBuffer(body) ? body : Buffer.from(body);
  const lat = [];
  const ttfb = [];
  let errors = 0;
  let sent = 0;
  const t0 = performance.now();
  const cpu0 = machineCpu();
  const deadline = t0 + durationMs;
  const one = () =>
    new Promise((resolve) => {
      const start = performance.now();
      let first = 0;
      const req = http.request(
        { host: '127.0.0.1', port, path, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': payload.length, ...headers } },
        (res) => {
          res.on('data', () => {
            if (first === 0) first = performance.now();
          });
          res.on('end', () => {
            const end = performance.now();
            if (res.statusCode !== 200) errors++;
            lat.push(end - start);
            ttfb.push((first || end) - start);
            resolve();
          });
          res.on('error', () => {
            errors++;
            resolve();
          });
        },
      );
      req.on('error', () => {
        errors++;
        resolve();
      });
      req.end(payload);
    });
  const worker = async () => {
    while (performance.now() < deadline && sent < maxRequests) {
      sent++;
      await one();
    }
  };
  return Promise.all(Array.from({ length: conns }, worker)).then(() => {
    const elapsedMs = performance.now() - t0;
    const cpu1 = machineCpu();
    agent.destroy();
    lat.sort((a, b) => a - b);
    ttfb.sort((a, b) => a - b);
    return {
      requests: lat.length,
      errors,
      elapsedMs,
      rps: (lat.length / elapsedMs) * 1000,
      p50: quantile(lat, 0.5),
      p99: quantile(lat, 0.99),
      ttfbP50: quantile(ttfb, 0.5),
      ttfbP99: quantile(ttfb, 0.99),
      // The whole machine's idle share over the round (load generator, model server and proxy share its cores).
      machineIdle: cpu1 && cpu0 ? (cpu1.idle - cpu0.idle) / Math.max(1, cpu1.total - cpu0.total) : NaN,
    };
  });
}

/** The machine's CPU time, all cores, from /proc/stat: idle (with I/O wait) and total, in ticks; null where unreadable. */
function machineCpu() {
  try {
    const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    return { idle: f[3] + f[4], total: f.slice(0, 8).reduce((a, b) => a + b, 0) };
  } catch {
    return null;
  }
}

/** A config file for a sidecar (LIGHTNING_CONFIG), in a fresh temporary directory. */
function writeConfig(yaml) {
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'lightning-bench-cfg-')), 'config.yaml');
  fs.writeFileSync(file, yaml);
  return file;
}

/**
 * A stand-in model server's bench port (127.0.0.1, a port of its own): `GET /bench/window` answers
 * `windowOf(server)`; prints {"port", "stats"} once it listens, as the bench reads it from stdout.
 */
function serveWindow(server, windowOf) {
  const stats = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/bench/window') {
      const body = JSON.stringify(windowOf(server));
      return res.writeHead(200, { 'content-type': 'application/json' }).end(body);
    }
    res.writeHead(404).end();
  });
  stats.listen(0, '127.0.0.1', () => process.stdout.write(`${JSON.stringify({ port: server.port, stats: stats.address().port })}\n`));
}

module.exports = { serveWindow, proc, mainThreadTimes, quantile, median, freePort, startNodeChild, waitHttp, closedLoop, writeConfig, CLK_TCK };
