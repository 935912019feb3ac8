// The checks of the image smoke test (deploy/image-smoke.sh), run on the host against the
// sidecar started from the image: probes, one proxied call, a final reward, and the transition
// that call becomes in the data volume. Prints one line per check; exits 1 on the first failure.
// Env: PROXY_ORIGIN, TELEMETRY_ORIGIN, DATA_DIR; TIMEOUT_MS bounds the whole run (default 60 s).
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { REPLY } from './fake-model-server.mjs';

const { PROXY_ORIGIN, TELEMETRY_ORIGIN, DATA_DIR } = process.env;
const deadline = Date.now() + Number(process.env.TIMEOUT_MS || 60_000);
const rolloutId = `image-smoke-${process.pid}`;

function fail(message) {
  console.log(`check: FAIL ${message}`);
  process.exit(1);
}

function pass(message) {
  console.log(`check: ok   ${message}`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function request(url, init = {}) {
  return fetch(url, { ...init, signal: AbortSignal.timeout(Math.max(1, Math.min(10_000, deadline - Date.now()))) });
}

/** Polls until `probe` returns a value, or fails with what it last saw once the deadline passes. */
async function until(what, probe) {
  let last = 'nothing yet';
  while (Date.now() < deadline) {
    try {
      const value = await probe();
      if (value.ok) return value;
      last = value.last;
    } catch (err) {
      last = err.cause?.code ?? err.message;
    }
    await sleep(200);
  }
  fail(`${what}: timed out (last: ${last})`);
}

for (const route of ['/healthz', '/readyz']) {
  await until(`GET ${route}`, async () => {
    const res = await request(`${TELEMETRY_ORIGIN}${route}`);
    return { ok: res.status === 200, last: `HTTP ${res.status}` };
  });
  pass(`GET ${route} 200`);
}

const call = await request(`${PROXY_ORIGIN}/rollout/${rolloutId}/v1/chat/completions`, {
  method: 'POST',
  headers: { 'content-type': 'application/json', authorization: 'Bearer smoke', 'x-group-id': 'image-smoke' },
  body: JSON.stringify({ model: 'policy', messages: [{ role: 'user', content: 'ping' }] }),
});
const answer = await call.text();
if (call.status !== 200) fail(`proxied call: HTTP ${call.status} ${answer.slice(0, 300)}`);
if (JSON.parse(answer).choices?.[0]?.message?.content !== REPLY.content) fail(`proxied call: unexpected answer ${answer.slice(0, 300)}`);
pass(`POST /rollout/${rolloutId}/v1/chat/completions 200, the model's answer`);

const reward = await request(`${PROXY_ORIGIN}/lightning/v1/rollouts/${rolloutId}/reward`, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ value: 1, attempt_id: '0', final: true }),
});
if (reward.status !== 202) fail(`final reward: HTTP ${reward.status} ${(await reward.text()).slice(0, 300)}`);
pass(`POST /lightning/v1/rollouts/${rolloutId}/reward 202`);

const dir = path.join(DATA_DIR, 'transitions');
const { transition, file } = await until(`a transition of ${rolloutId} in ${dir}`, async () => {
  for (const name of readdirSync(dir).filter((f) => f.endsWith('.ndjson'))) {
    for (const line of readFileSync(path.join(dir, name), 'utf8').split('\n')) {
      if (!line.includes(rolloutId)) continue;
      const t = JSON.parse(line);
      if (t.rollout_id === rolloutId) return { ok: true, transition: t, file: name };
    }
  }
  return { ok: false, last: `no line for ${rolloutId} yet` };
});
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
if (!same(transition.prompt_token_ids, REPLY.promptIds) || !same(transition.response_token_ids, REPLY.responseIds)) {
  fail(`transition: token ids differ from the model's (${JSON.stringify([transition.prompt_token_ids, transition.response_token_ids])})`);
}
if (transition.final_reward !== 1 || transition.group_id !== 'image-smoke') {
  fail(`transition: final_reward ${transition.final_reward}, group_id ${transition.group_id}`);
}
pass(`transition ${transition.transition_id} in transitions/${file}: the model's token ids, final_reward 1`);
