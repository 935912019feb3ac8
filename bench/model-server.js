'use strict';
// Bench model server: answers like vLLM. JSON: ~1 KiB chat.completion after a fixed delay.
// SSE (request has "stream":true): 50 chunks, 1 ms apart, then [DONE]. Prints {"port": N} when up.
// GET /bench/requests answers how many requests it has read to their end (itself not counted):
// the bench checks with it that a proxy's calls reached this server.
const http = require('node:http');

const delayMs = Number(process.argv[2] ?? 1);
const CHUNKS = 50;
const words = Array.from({ length: 40 }, (_, i) => `word${i}`);
const json = Buffer.from(
  JSON.stringify({
    id: 'chatcmpl-bench',
    object: 'chat.completion',
    created: 1,
    model: 'bench-policy',
    prompt_token_ids: Array.from({ length: 40 }, (_, i) => 1000 + i),
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: words.join(' ') },
        logprobs: { content: words.slice(0, 12).map((w, i) => ({ token: w, logprob: -0.01 * i, bytes: null, top_logprobs: [] })) },
        finish_reason: 'stop',
        token_ids: Array.from({ length: 12 }, (_, i) => 2000 + i),
      },
    ],
    usage: { prompt_tokens: 40, completion_tokens: 12, total_tokens: 52 },
  }),
);
const chunk = (i) =>
  Buffer.from(
    `data: ${JSON.stringify({ id: 'chatcmpl-bench', object: 'chat.completion.chunk', created: 1, model: 'bench-policy', choices: [{ index: 0, delta: i === 0 ? { role: 'assistant', content: 'w' } : { content: ` w${i}` }, logprobs: { content: [{ token: `w${i}`, logprob: -0.01, bytes: null, top_logprobs: [] }] }, finish_reason: i === CHUNKS - 1 ? 'stop' : null, token_ids: [3000 + i] }], ...(i === 0 ? { prompt_token_ids: [1, 2, 3] } : {}) })}\n\n`,
  );
const CHUNK_BYTES = Array.from({ length: CHUNKS }, (_, i) => chunk(i));

let requests = 0;

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/bench/requests') {
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ requests }));
    return;
  }
  let streamed = false;
  let head = '';
  req.on('data', (c) => {
    if (head.length < 4096) head += c.toString('latin1', 0, Math.min(c.length, 4096));
  });
  req.on('end', () => {
    requests++;
    streamed = /"stream"\s*:\s*true/.test(head);
    setTimeout(() => {
      if (!streamed) {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': json.length }).end(json);
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      let i = 0;
      const next = () => {
        if (i < CHUNKS) {
          res.write(CHUNK_BYTES[i++]);
          setTimeout(next, 1);
        } else res.end('data: [DONE]\n\n');
      };
      next();
    }, delayMs);
  });
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
process.on('SIGTERM', () => process.exit(0));
