'use strict';
// The floor for a proxy that persists every call: bare-proxy.js, plus one synchronous write per
// call of a small header line, the request body and the response body to a file, made before the
// answer is complete for the client (so an answered call is in the file). No parsing, no
// checksum, no second copy for an exporter. argv: upstream port, directory for the file. Prints
// {"port": N} when up; the file is removed at exit. bare-record-proxy.js builds on it.
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');

const NL = Buffer.from('\n');

/**
 * The persisting pipe's server: `answered(call, sized, response)` runs once each answer is written
 * down and ended (`sized`: it had a content-length; `response`: its chunks). `files` are removed by
 * `close`.
 */
function persistingServer(upstreamPort, dir, answered = null) {
  const file = path.join(dir, `calls-${process.pid}.log`);
  const fd = fs.openSync(file, 'a');
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
  let calls = 0;
  const server = http.createServer((req, res) => {
    const request = [];
    req.on('data', (c) => request.push(c));
    const up = http.request({ host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url, headers: req.headers, agent }, (ures) => {
      res.writeHead(ures.statusCode, ures.headers);
      const response = [];
      // The client must not see the whole answer before the write: a chunked answer's chunks go on
      // at once and its end (the terminating chunk) after the write; an answer with a
      // content-length keeps its last chunk back until then.
      const sized = ures.headers['content-length'] !== undefined;
      let last = null;
      ures.on('data', (c) => {
        response.push(c);
        if (!sized) {
          res.write(c);
          return;
        }
        if (last) res.write(last);
        last = c;
      });
      ures.on('end', () => {
        const call = ++calls;
        const head = Buffer.from(`${JSON.stringify({ call, path: req.url, status: ures.statusCode })}\n`);
        fs.writevSync(fd, [head, ...request, NL, ...response, NL]);
        if (last) res.end(last);
        else res.end();
        answered?.(call, sized, response);
      });
    });
    up.on('error', () => {
      res.writeHead(502).end();
    });
    req.pipe(up);
  });
  server.keepAliveTimeout = 65_000;
  return { server, file };
}

/** Listens on 127.0.0.1, says its port, and removes `files` (after `beforeExit`) on SIGTERM. */
function serve(server, files, beforeExit = () => {}) {
  server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
  process.on('SIGTERM', () => {
    beforeExit();
    for (const f of files) fs.rmSync(f, { force: true });
    process.exit(0);
  });
}

if (require.main === module) {
  const { server, file } = persistingServer(Number(process.argv[2]), process.argv[3]);
  serve(server, [file]);
}

module.exports = { persistingServer, serve };
