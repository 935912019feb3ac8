'use strict';
// Portkey's open-source AI gateway (npm @portkey-ai/gateway) as a bench target: what a Node user
// would put in front of an OpenAI-compatible server instead of the sidecar.
//
// Run as a script (`node bench/portkey.js PORT`), this file is the gateway's process: it binds the
// gateway to 127.0.0.1, refuses every connection it would open to anything but loopback, then
// loads the package's own server (build/start-server.js, its `bin`) with `--port=PORT --headless`.
// Required as a module, it starts that process and checks it.
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1']);

/** The gateway's entry point in node_modules, or null when the package is not installed. */
function gatewayEntry() {
  try {
    const pkg = require.resolve('@portkey-ai/gateway/package.json', { paths: [path.join(__dirname, '..')] });
    const { version, bin } = JSON.parse(fs.readFileSync(pkg, 'utf8'));
    const file = path.join(path.dirname(pkg), typeof bin === 'string' ? bin : bin.gateway);
    return fs.existsSync(file) ? { file, version } : null;
  } catch {
    return null;
  }
}

/**
 * The headers that route a call through the gateway to an OpenAI-compatible server: its `openai`
 * provider with a custom host (the gateway appends `/chat/completions` to it). Sent to the
 * Portkey target only.
 */
function routeHeaders(upstreamPort) {
  return { 'x-portkey-provider': 'openai', 'x-portkey-custom-host': `http://127.0.0.1:${upstreamPort}/v1` };
}

/**
 * Starts the gateway as a child process on a free loopback port, against the model server on
 * `upstreamPort`; resolves once it answers and has printed its start-up banner. `output()` is
 * what it has written to stdout and stderr since then: the byte count and the first 4 KiB (the
 * bench expects nothing); `refused()` counts the connections it tried to open to anything but
 * loopback (each also a line on its stderr).
 */
async function startPortkey(upstreamPort, { freePort, waitHttp }) {
  const entry = gatewayEntry();
  if (!entry) return null;
  const port = await freePort();
  const { spawn } = require('node:child_process');
  const p = spawn(process.execPath, [path.join(__dirname, 'portkey.js'), String(port)], {
    // Nothing from the bench's environment: no REDIS_CONNECTION_STRING (its cache), no
    // HTTP(S)_PROXY, no cloud credentials. TRUSTED_CUSTOM_HOSTS narrows the hosts a
    // x-portkey-custom-host may name (by default localhost, 127.0.0.1, ::1, host.docker.internal).
    env: { PATH: process.env.PATH, TRUSTED_CUSTOM_HOSTS: '127.0.0.1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let banner = '';
  let ready = false;
  let bytes = 0;
  let head = '';
  let refused = 0;
  const take = (c) => {
    const text = c.toString();
    // The guard's own lines (the gateway's logs may quote its error).
    refused += (text.match(/^portkey-guard: refused/gm) ?? []).length;
    if (!ready) {
      banner += text;
      return;
    }
    bytes += c.length;
    if (head.length < 4096) head += text.slice(0, 4096 - head.length);
  };
  p.stdout.on('data', take);
  p.stderr.on('data', take);
  try {
    await waitHttp(`http://127.0.0.1:${port}/`);
  } catch (err) {
    p.kill('SIGKILL');
    throw new Error(`${err.message}; it wrote: ${banner.slice(0, 300)}`);
  }
  // The banner comes about a second after the socket listens (a spinner first).
  for (let i = 0; i < 100 && !banner.includes('Ready for connections'); i++) await new Promise((r) => setTimeout(r, 50));
  ready = true;
  return {
    proc: p,
    port,
    version: entry.version,
    headers: routeHeaders(upstreamPort),
    output: () => ({ bytes, head }),
    refused: () => refused,
  };
}

/** How many requests the bench model server has read (its GET /bench/requests). */
async function upstreamRequests(modelPort) {
  return (await (await fetch(`http://127.0.0.1:${modelPort}/bench/requests`)).json()).requests;
}

/**
 * One request of `body` through the gateway and the same straight to the model server: the
 * gateway's status, whether its answer is byte for byte the model server's, whether its call
 * reached the model server (its count went up by one), and what the gateway logged meanwhile.
 */
async function checkAnswer(pk, modelPort, body) {
  const post = async (port, headers = {}) => {
    const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body,
    });
    return { status: res.status, text: await res.text() };
  };
  const direct = await post(modelPort);
  const logged = pk.output();
  const before = await upstreamRequests(modelPort);
  const through = await post(pk.port, pk.headers);
  const reached = (await upstreamRequests(modelPort)) - before;
  // The log of a failure is written around the answer: a moment for it to arrive.
  await new Promise((r) => setTimeout(r, 100));
  const out = pk.output();
  return {
    status: through.status,
    identical: through.status === 200 && through.text === direct.text,
    reached_upstream: reached,
    ...(through.status === 200 ? {} : { answer: through.text.slice(0, 200) }),
    ...(out.bytes > logged.bytes ? { log: out.head.slice(logged.head.length, logged.head.length + 300) } : {}),
  };
}

/** Installs the guards on node:net: listen on 127.0.0.1 only, connect to loopback only. */
function guard() {
  const listen = net.Server.prototype.listen;
  net.Server.prototype.listen = function (...args) {
    // @hono/node-server's serve() calls listen(port, undefined, callback): every interface.
    if (typeof args[0] === 'number' && (args[1] === undefined || typeof args[1] === 'function')) {
      if (args[1] === undefined) args.splice(1, 1);
      args.splice(1, 0, '127.0.0.1');
    }
    return listen.apply(this, args);
  };
  const connect = net.Socket.prototype.connect;
  net.Socket.prototype.connect = function (...args) {
    // net.connect and tls.connect (undici's fetch, ioredis, ws) pass normalized [options, cb].
    const first = Array.isArray(args[0]) ? args[0][0] : args[0];
    const o = first !== null && typeof first === 'object' ? first : { port: first, host: typeof args[1] === 'string' ? args[1] : undefined };
    if (o.path === undefined && !LOOPBACK.has(o.host ?? 'localhost')) {
      const err = new Error(`portkey-guard: refused connection to ${o.host}:${o.port}`);
      process.stderr.write(`${err.message}\n`);
      process.nextTick(() => this.destroy(err));
      return this;
    }
    return connect.apply(this, args);
  };
}

if (require.main === module) {
  const port = Number(process.argv[2]);
  const entry = gatewayEntry();
  if (!entry || !(port > 0)) {
    process.stderr.write('usage: node bench/portkey.js PORT (with @portkey-ai/gateway installed)\n');
    process.exit(2);
  }
  guard();
  // The gateway reads its flags from process.argv.slice(2).
  process.argv.splice(2, process.argv.length - 2, `--port=${port}`, '--headless');
  process.on('SIGTERM', () => process.exit(0));
  import(require('node:url').pathToFileURL(entry.file).href).catch((err) => {
    process.stderr.write(`${err.stack ?? err}\n`);
    process.exit(1);
  });
}

module.exports = { startPortkey, checkAnswer, upstreamRequests, routeHeaders, gatewayEntry };
