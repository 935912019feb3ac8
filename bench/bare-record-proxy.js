'use strict';
// The floor for a proxy that turns every call into a training record: bare-persist-proxy.js (one
// synchronous write per call of its bytes, before the client has the whole answer), plus the least
// a capture that yields a record does: the answer parsed (a JSON answer once, a stream's every
// `data:` event), one record of its prompt and answer ids, logprobs and finish reason serialized,
// and the records written to a second file, gathered per turn of the event loop. No journal
// framing or checksums, no episodes, no rewards, no metrics. argv: upstream port, directory for
// the files. Prints {"port": N} when up; the files are removed at exit.
const fs = require('node:fs');
const path = require('node:path');
const { persistingServer, serve } = require('./bare-persist-proxy');

const dir = process.argv[3];
const out = path.join(dir, `records-${process.pid}.ndjson`);
const fd = fs.openSync(out, 'a');
let records = [];

function flushRecords() {
  const lines = records;
  records = [];
  fs.writeSync(fd, lines.join(''));
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

const { server, file } = persistingServer(Number(process.argv[2]), dir, (call, sized, response) => {
  if (records.length === 0) setImmediate(flushRecords);
  records.push(record(call, sized, Buffer.concat(response)));
});
serve(server, [file, out], () => {
  if (records.length > 0) flushRecords();
});
