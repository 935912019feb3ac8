'use strict';
// The suite's vLLM stand-in with Qwen3's real tokenizer and chat template (test/support/qwen3-server.ts,
// compiled into build/ by `npm run bench`), for the token-in scenario. Prints {"port": N, "stats": M}
// when up. On the second port (127.0.0.1 too), `GET /bench/window` answers what the stand-in got since
// the last time it was asked, then forgets it: the requests by path, and the token-id prompts of
// `/v1/completions`, checked: how many continue an earlier prompt of the window and the ids the
// stand-in sampled for it, and the digests of the distinct prompts (so that two targets' prompts can
// be compared id for id). The check runs there, between rounds, not while a round is measured.
const { serveWindow } = require('./lib');
const crypto = require('node:crypto');
const { startQwen3Server, sample, decode } = require('../build/test/support/qwen3-server.js');

const digest = (ids) => crypto.createHash('sha256').update(Uint32Array.from(ids)).digest('hex').slice(0, 24);

/** Whether `prefix` is `ids`' start, shorter than it. */
function startsWith(ids, prefix) {
  if (prefix.length >= ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}

function windowOf(s) {
  const requests = {};
  for (const r of s.requests) requests[r.path] = (requests[r.path] ?? 0) + 1;
  // Distinct prompts (agents in one round send the same ones), each with what the stand-in samples after it.
  const distinct = new Map();
  for (const p of s.completionPrompts) {
    const d = digest(p);
    const x = distinct.get(d);
    if (x) x.count++;
    else distinct.set(d, { ids: p, count: 1 });
  }
  const continuations = [...distinct.values()].map((x) => [...x.ids, ...sample(decode(x.ids, false)).ids]);
  let continuing = 0;
  for (const x of distinct.values()) if (continuations.some((c) => startsWith(x.ids, c))) continuing += x.count;
  const out = {
    requests,
    completions: s.completionPrompts.length,
    continuing,
    max_prompt_tokens: Math.max(0, ...[...distinct.values()].map((x) => x.ids.length)),
    distinct_prompts: [...distinct.keys()].sort(),
  };
  s.requests.length = 0;
  s.completionPrompts.length = 0;
  return out;
}

startQwen3Server().then((s) => serveWindow(s, windowOf));
