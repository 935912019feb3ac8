/**
 * A stand-in for a vLLM server, to try the sidecar without a GPU. Two kinds, neither a language
 * model:
 *
 * - by default, the test suite's scripted server (examples/README.md says why) in its vLLM
 *   personality: `GET /v1/models` lists its model with `owned_by: "vllm"` and `GET /version`
 *   answers, as vLLM does, so the sidecar detects vLLM and asks for token ids; chat completions
 *   and completions, streamed and not, carry `prompt_token_ids`, `token_ids` and logprobs when
 *   asked (`return_token_ids`, `logprobs`), and the model asks for the `calculator` tool once
 *   before answering. `/v1/responses` and `/v1/messages` answer 404: the sidecar sends those
 *   calls to a vLLM server as chat completions (docs/translation.md);
 * - with `--qwen3`, the vLLM stand-in with Qwen3's real tokenizer and chat template
 *   (test/support/qwen3-server.ts, the one the token-in benchmark uses): `POST /tokenize`, chat
 *   completions answered as vLLM with `--reasoning-parser qwen3 --tool-call-parser hermes`, and
 *   completions with a prompt of token ids, for token-in (docs/token-in.md). Its "model" is a
 *   calculator policy that calls `calculator` once per arithmetic expression in the user's query,
 *   then answers with the results.
 *
 * Either also answers `GET /health` (200) and `GET /metrics` (vLLM's running and waiting gauges,
 * from the requests it has in flight), which the sidecar reads when it routes over several
 * replicas (docs/routing.md).
 *
 *   node build/examples/frameworks/stand-in-model.js [--qwen3] [--port N] [--log]
 *
 * It prints its URL (port N on 127.0.0.1, a free one by default); `--log` prints a line per
 * request it gets (but `/health` and `/metrics`), as a server's access log does.
 */
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { parseArgs } from 'node:util';
import { calculatorScript, startFakeModelServer } from '../../test/support/fake-model-server';

const USAGE = 'usage: node build/examples/frameworks/stand-in-model.js [--qwen3] [--port N] [--log]';

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { qwen3: { type: 'boolean', default: false }, port: { type: 'string', default: '0' }, log: { type: 'boolean', default: false } },
  });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port must be a port number\n${USAGE}`);

  // The server itself, on a free port; in front of it, on the port asked for, a pass-through
  // that adds /health, /metrics and the access log.
  let inner: { port: number; close(): Promise<void> };
  let model: string;
  let kind: string;
  if (values.qwen3) {
    const { startQwen3Server } = await import('../../test/support/qwen3-server');
    inner = await startQwen3Server();
    model = 'Qwen/Qwen3-8B';
    kind = 'vLLM stand-in, Qwen3 tokenizer and chat template, scripted calculator policy';
  } else {
    model = 'policy';
    inner = await startFakeModelServer({ strict: true, flavor: 'vllm', script: calculatorScript, model });
    kind = 'vLLM stand-in, scripted';
  }

  let inFlight = 0;
  const pool = new http.Agent({ keepAlive: true });
  const sockets = new Set<Socket>();
  const front = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && path === '/health') return void res.writeHead(200, { 'content-length': '0' }).end();
    if (req.method === 'GET' && path === '/metrics') {
      const label = `{model_name="${model}"}`;
      const body =
        `# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running${label} ${inFlight}\n` +
        `# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting${label} 0\n`;
      return void res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(body);
    }
    if (values.log) console.log(`${new Date().toISOString()} ${req.method} ${path}`);
    inFlight++;
    let counted = true;
    const done = () => {
      if (counted) inFlight--;
      counted = false;
    };
    res.once('close', done);
    const up = http.request({ host: '127.0.0.1', port: inner.port, method: req.method, path: req.url, headers: req.headers, agent: pool }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    up.once('error', () => res.destroy());
    req.pipe(up);
  });
  front.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    front.once('error', reject);
    front.listen(port, '127.0.0.1', () => resolve());
  });
  const url = `http://127.0.0.1:${(front.address() as AddressInfo).port}/v1`;
  console.log(`stand-in model (${kind}; not a language model) at ${url}`);

  const stop = () => {
    for (const s of sockets) s.destroy();
    front.close();
    pool.destroy();
    void inner.close().then(() => process.exit(0));
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

main().catch((err: Error & { code?: string }) => {
  console.error(`stand-in model: ${err.code === 'EADDRINUSE' ? 'the port is taken (--port N for another)' : err.message}`);
  process.exit(1);
});
