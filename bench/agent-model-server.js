'use strict';
// Bench model server for agent workloads: answers chat completions like vLLM with token ids of
// the real prompt (bench/agent-tokens.js, ~4 bytes a token): prompt_token_ids, choices[].token_ids
// and logprobs when asked, whole or streamed (`stream: true`: one event a token, the prompt's ids
// in the first, as vLLM sends them). The answer's text is chosen from the request's size, so every
// target gets the same answers. On paths under `/routed/` (an upstream URL of
// `http://127.0.0.1:N/routed/v1`) it answers as vLLM started with `--enable-return-routed-experts`:
// non-streamed answers carry `choices[].routed_experts`, the base64 `.npy` of the routed experts
// (bench/routed-experts.js: uint8, [prompt + output - 1, 48, 8], from the request's
// `routed_experts_prompt_start`). Prints {"port": N} when up.
const http = require('node:http');
const { promptIds, answerIds } = require('./agent-tokens');
const { routedExpertsField } = require('./routed-experts');

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
    const routed = req.url.startsWith('/routed/');
    const prompt = promptIds(body.messages ?? []);
    const text = answerText(prompt.length);
    const ids = answerIds(text);
    if (body.stream === true) return setTimeout(() => stream(res, body, prompt, text, ids), delayMs);
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
          ...(routed ? { routed_experts: routedExpertsField(prompt.length + ids.length, body.routed_experts_prompt_start) } : {}),
        },
      ],
      usage: { prompt_tokens: prompt.length, completion_tokens: ids.length, total_tokens: prompt.length + ids.length },
      ...(body.return_token_ids ? { prompt_token_ids: prompt } : {}),
    };
    const bytes = Buffer.from(JSON.stringify(out));
    setTimeout(() => res.writeHead(200, { 'content-type': 'application/json', 'content-length': bytes.length }).end(bytes), delayMs);
  });
});
/** The answer as `chat.completion.chunk` events: a token's text and id in each, the end token last. */
function stream(res, body, prompt, text, ids) {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const event = (i) => {
    const last = i === ids.length - 1;
    const choice = {
      index: 0,
      delta: i === 0 ? { role: 'assistant', content: text.slice(0, 4) } : { content: last ? '' : text.slice(4 * i, 4 * i + 4) },
      logprobs: body.logprobs ? { content: [{ token: `t${ids[i]}`, logprob: -0.001 * (i % 100), bytes: null, top_logprobs: [] }] } : null,
      finish_reason: last ? 'stop' : null,
      ...(body.return_token_ids ? { token_ids: [ids[i]] } : {}),
    };
    const chunk = { id: `chatcmpl-${prompt.length}`, object: 'chat.completion.chunk', created: 1, model: body.model ?? 'bench-policy', choices: [choice] };
    if (i === 0 && body.return_token_ids) chunk.prompt_token_ids = prompt;
    return `data: ${JSON.stringify(chunk)}\n\n`;
  };
  // A few tokens a write, as a server flushing per scheduler step does.
  let i = 0;
  const next = () => {
    let out = '';
    for (let k = 0; k < 8 && i < ids.length; k++, i++) out += event(i);
    if (i < ids.length) res.write(out, () => setImmediate(next));
    else res.end(out + 'data: [DONE]\n\n');
  };
  next();
}

server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
process.on('SIGTERM', () => process.exit(0));
