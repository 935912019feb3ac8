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

// The product's default record: one trajectory per segment of the rollout (docs/output-contract.md).
const dir = path.join(DATA_DIR, 'trajectories');
const { trajectory, file } = await until(`a trajectory of ${rolloutId} in ${dir}`, async () => {
  for (const name of readdirSync(dir).filter((f) => f.endsWith('.ndjson'))) {
    for (const line of readFileSync(path.join(dir, name), 'utf8').split('\n')) {
      if (!line.includes(rolloutId)) continue;
      const t = JSON.parse(line);
      if (t.rollout_id === rolloutId) return { ok: true, trajectory: t, file: name };
    }
  }
  return { ok: false, last: `no line for ${rolloutId} yet` };
});
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const ids = [...REPLY.promptIds, ...REPLY.responseIds];
const mask = [...REPLY.promptIds.map(() => 0), ...REPLY.responseIds.map(() => 1)];
if (!same(trajectory.token_ids, ids) || !same(trajectory.loss_mask, mask) || trajectory.prompt_length !== REPLY.promptIds.length) {
  fail(
    `trajectory: token ids or loss mask differ from the model's (${JSON.stringify([trajectory.token_ids, trajectory.loss_mask, trajectory.prompt_length])})`,
  );
}
const last = ids.length - 1;
if (trajectory.final_reward !== 1 || trajectory.group_id !== 'image-smoke' || !same(trajectory.token_rewards, [{ position: last, value: 1 }])) {
  fail(`trajectory: final_reward ${trajectory.final_reward}, group_id ${trajectory.group_id}, token_rewards ${JSON.stringify(trajectory.token_rewards)}`);
}
pass(`trajectory ${trajectory.trajectory_id} in trajectories/${file}: the model's token ids, loss mask, final_reward 1 on the last sampled id`);
