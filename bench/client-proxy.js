'use strict';
// The bare pipe (bare-proxy.js) with the upstream leg swapped for another HTTP/1.1 client, to set
// the sidecar's own client against undici with everything else the same: node:http in, the
// agent's whole request body read first (as the sidecar does for a captured call), one request
// upstream with that body and a content-length, the answer written back chunk by chunk as it
// arrives (status and headers as received), an in-memory tee of it, no parsing. argv: upstream
// port, then `own` (the sidecar's UpstreamClient, from dist/: `npm run build` first) or `undici`
// (a Pool's dispatch with a handler, no stream per response). Prints {"port": N} when up.
const http = require('node:http');

const upstreamPort = Number(process.argv[2]);
const variant = process.argv[3];
let teed = 0;

/** The agent's headers for the upstream request: as received, less hop-by-hop fields, with the body's length. */
const SKIP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length']);
function upstreamHeaders(raw, length) {
  const out = [];
  for (let i = 0; i < raw.length; i += 2) if (!SKIP.has(raw[i].toLowerCase())) out.push(raw[i], raw[i + 1]);
  out.push('content-length', String(length));
  return out;
}

/** Sends `body` upstream for `req` and answers `res` with what comes back. */
let forward;
if (variant === 'own') {
  const { UpstreamClient } = require('../dist/receivers/llm-proxy/upstream-client.js');
  const client = new UpstreamClient({ hostname: '127.0.0.1', port: upstreamPort, secure: false });
  forward = (req, res, body) => {
    const up = client.request({ method: req.method, path: req.url, headers: upstreamHeaders(req.rawHeaders, body.length) });
    up.on('response', (ures) => {
      res.writeHead(ures.statusCode, ures.rawHeaders);
      const tee = [];
      ures.on('data', (c) => {
        tee.push(c);
        res.write(c);
      });
      ures.on('end', () => {
        teed += tee.length;
        res.end();
      });
    });
    up.on('error', () => {
      if (res.headersSent) res.destroy();
      else res.writeHead(502).end();
    });
    up.end(body);
  };
} else if (variant === 'undici') {
  const { Pool } = require('undici');
  const pool = new Pool(`http://127.0.0.1:${upstreamPort}`, { connections: 256, pipelining: 1 });
  forward = (req, res, body) => {
    const tee = [];
    // undici 7's handler interface (DispatchHandler): the onResponse* callbacks with a controller.
    pool.dispatch(
      { method: req.method, path: req.url, headers: upstreamHeaders(req.rawHeaders, body.length), body },
      {
        onRequestStart() {},
        onResponseStart(_controller, statusCode, headers) {
          res.writeHead(statusCode, headers);
        },
        onResponseData(_controller, c) {
          tee.push(c);
          res.write(c);
        },
        onResponseEnd() {
          teed += tee.length;
          res.end();
        },
        onResponseError() {
          if (res.headersSent) res.destroy();
          else res.writeHead(502).end();
        },
      },
    );
  };
} else {
  process.stderr.write(`client-proxy.js: the client is \`own\` or \`undici\`, not ${JSON.stringify(variant)}\n`);
  process.exit(2);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => forward(req, res, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks)));
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
process.on('SIGTERM', () => process.exit(teed >= 0 ? 0 : 1));
