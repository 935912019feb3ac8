'use strict';
// Bench model server for agent workloads: answers chat completions like vLLM with token ids of
// the real prompt (bench/agent-tokens.js, ~4 bytes a token): prompt_token_ids, choices[].token_ids
// and logprobs when asked. The answer's text is chosen from the request's size, so every target
// gets the same answers. Prints {"port": N} when up.
const http = require('node:http');
const { promptIds, answerIds } = require('./agent-tokens');

const delayMs = Number(process.argv[2] ?? 1);

function answerText(promptLength) {
  return `Step ${promptLength % 997}: I looked at the tool output and will call the next tool. `.repeat(3);
}

const server = http.createServer((req, res) => {
  const parts = [];
  req.on('data', (c) => parts.push(c));
  req.on('end', () => {
    let body;
    try {
      body = JSON.parse(Buffer.concat(parts).toString('utf8'));
    } catch {
      res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":{"message":"bad json"}}');
      return;
    }
    const prompt = promptIds(body.messages ?? []);
    const text = answerText(prompt.length);
    const ids = answerIds(text);
    const out = {
      id: `chatcmpl-${prompt.length}`,
      object: 'chat.completion',
      created: 1,
      model: body.model ?? 'bench-policy',
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: text },
          logprobs: body.logprobs ? { content: ids.map((t, i) => ({ token: `t${t}`, logprob: -0.001 * (i % 100), bytes: null, top_logprobs: [] })) } : null,
          finish_reason: 'stop',
          ...(body.return_token_ids ? { token_ids: ids } : {}),
        },
      ],
      usage: { prompt_tokens: prompt.length, completion_tokens: ids.length, total_tokens: prompt.length + ids.length },
      ...(body.return_token_ids ? { prompt_token_ids: prompt } : {}),
    };
    const bytes = Buffer.from(JSON.stringify(out));
    setTimeout(() => res.writeHead(200, { 'content-type': 'application/json', 'content-length': bytes.length }).end(bytes), delayMs);
  });
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
process.on('SIGTERM', () => process.exit(0));
