// A vLLM-like model server for the image smoke test (deploy/image-smoke.sh): answers
// POST /v1/chat/completions with token ids and logprobs, listens on 127.0.0.1 only, prints
// {"port": N} as its first stdout line, and exits by itself after --lifetime-ms.
import http from 'node:http';

const lifetimeMs = Number(process.argv[process.argv.indexOf('--lifetime-ms') + 1] || 300_000);
/** What every answer says, so the check can compare what the agent and the trainer see. */
export const REPLY = { content: 'pong from the fake model', promptIds: [101, 102, 103, 104], responseIds: [201, 202, 203] };

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    if (req.method !== 'POST' || req.url !== '/v1/chat/completions') {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"not found"}}');
      return;
    }
    const request = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
    const body = {
      id: 'chatcmpl-smoke-1',
      object: 'chat.completion',
      created: 1_760_000_000,
      model: request.model ?? 'policy',
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: REPLY.content, reasoning_content: null },
          logprobs: { content: REPLY.responseIds.map((id) => ({ token: `token_id:${id}`, logprob: -0.5, bytes: null, top_logprobs: [] })) },
          finish_reason: 'stop',
          stop_reason: null,
          token_ids: REPLY.responseIds,
        },
      ],
      usage: {
        prompt_tokens: REPLY.promptIds.length,
        completion_tokens: REPLY.responseIds.length,
        total_tokens: REPLY.promptIds.length + REPLY.responseIds.length,
      },
      prompt_logprobs: null,
      prompt_token_ids: REPLY.promptIds,
    };
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
  });
});

if (process.argv[1] === new URL(import.meta.url).pathname) {
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(`${JSON.stringify({ port: server.address().port })}\n`);
  });
  setTimeout(() => process.exit(0), lifetimeMs).unref();
  process.on('SIGTERM', () => process.exit(0));
}
