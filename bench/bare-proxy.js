'use strict';
// The floor any Node proxy pays: node:http in, node:http out (keep-alive), an in-memory tee of the
// response, no parsing. argv: upstream port. Prints {"port": N} when up.
const http = require('node:http');

const upstreamPort = Number(process.argv[2]);
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
let teed = 0;

const server = http.createServer((req, res) => {
  const up = http.request({ host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url, headers: req.headers, agent }, (ures) => {
    res.writeHead(ures.statusCode, ures.headers);
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
    res.writeHead(502).end();
  });
  req.pipe(up);
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
process.on('SIGTERM', () => process.exit(teed >= 0 ? 0 : 1));
