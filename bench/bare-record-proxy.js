'use strict';
// The floor for a proxy that turns every call into a training record: bare-persist-proxy.js (one
// synchronous write per call of its bytes, before the client has the whole answer), plus the least
// a capture that yields a record does: the answer parsed (a JSON answer once, a stream's every
// `data:` event), one record of its prompt and answer ids, logprobs and finish reason serialized,
// and the records written to a second file, gathered per turn of the event loop. No journal
// framing or checksums, no episodes, no rewards, no metrics. argv: upstream port, directory for
// the files. Prints {"port": N} when up; the files are removed at exit.
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');

const upstreamPort = Number(process.argv[2]);
const files = [path.join(process.argv[3], `calls-${process.pid}.log`), path.join(process.argv[3], `records-${process.pid}.ndjson`)];
const fd = fs.openSync(files[0], 'a');
const out = fs.openSync(files[1], 'a');
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
const NL = Buffer.from('\n');
let calls = 0;
let records = [];

function flushRecords() {
  const lines = records;
  records = [];
  fs.writeSync(out, lines.join(''));
}

/** The record of one answer: a chat completion, or the events of a streamed one. */
function record(call, sized, bytes) {
  const r = { call, prompt_token_ids: null, token_ids: [], logprobs: [], finish_reason: null };
  const take = (a) => {
    if (a.prompt_token_ids) r.prompt_token_ids = a.prompt_token_ids;
    const c = a.choices?.[0];
    if (!c) return;
    if (c.token_ids) r.token_ids.push(...c.token_ids);
    for (const e of c.logprobs?.content ?? []) r.logprobs.push(e.logprob);
    if (c.finish_reason) r.finish_reason = c.finish_reason;
  };
  const text = bytes.toString('utf8');
  try {
    if (sized) take(JSON.parse(text));
    else
      for (const line of text.split('\n')) {
        if (line.startsWith('data: ') && line !== 'data: [DONE]') take(JSON.parse(line.slice(6)));
      }
  } catch {
    r.error = 'unparsable';
  }
  return JSON.stringify(r) + '\n';
}

const server = http.createServer((req, res) => {
  const request = [];
  req.on('data', (c) => request.push(c));
  const up = http.request({ host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url, headers: req.headers, agent }, (ures) => {
    res.writeHead(ures.statusCode, ures.headers);
    const response = [];
    // As bare-persist-proxy.js: the answer's end waits for the write of the call's bytes.
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
      if (records.length === 0) setImmediate(flushRecords);
      records.push(record(call, sized, Buffer.concat(response)));
    });
  });
  up.on('error', () => {
    res.writeHead(502).end();
  });
  req.pipe(up);
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
process.on('SIGTERM', () => {
  if (records.length > 0) flushRecords();
  for (const f of files) fs.rmSync(f, { force: true });
  process.exit(0);
});
