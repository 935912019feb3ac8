'use strict';
// The suite's vLLM stand-in serving Qwen2.5-VL (test/support/qwen-vl-server.ts, compiled into build/
// by `npm run bench`), for the screenshot scenario: it renders the chat with Qwen2.5-VL's template,
// tokenizes it with Qwen3's tokenizer and expands each image to as many `<|image_pad|>` ids as the
// Qwen-VL processor gives its size. argv: how many `click` calls its policy makes before it answers
// (3 when not given). Prints {"port": N, "stats": M} when up. On the second port (127.0.0.1 too),
// `GET /bench/window` answers what the stand-in got since it was last asked, then forgets it (it
// keeps every request's parsed body until then, screenshots included, so the bench asks after each
// round): the POST requests by path, the images it expanded and the distinct pad counts they got.
const { serveWindow } = require('./lib');
const { startQwenVlServer } = require('../build/test/support/qwen-vl-server.js');

const clicks = Number(process.argv[2] ?? 3);

function windowOf(s) {
  const requests = {};
  for (const r of s.requests) requests[r.path] = (requests[r.path] ?? 0) + 1;
  const pads = new Set();
  let images = 0;
  for (const call of s.images) {
    images += call.length;
    for (const i of call) pads.add(i.pads);
  }
  const out = { requests, chat_answered: s.images.length, images, pad_counts: [...pads].sort((a, b) => a - b), urls: s.urls.length };
  s.requests.length = 0;
  s.images.length = 0;
  s.urls.length = 0;
  return out;
}

startQwenVlServer({ clicks }).then((s) => serveWindow(s, windowOf));
