import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Kafka, logLevel } from 'kafkajs';
import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startKafkaTestBroker } from '../support/kafka-broker';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

const TOKEN = 'control-token-0123456789abcdef';

async function control(sidecar: TestSidecar, body: unknown, token: string | null = TOKEN): Promise<Response> {
  return fetch(`${sidecar.telemetryOrigin}/lightning/v1/control`, {
    method: 'POST',
    headers: token ? { authorization: `Bearer ${token}` } : {},
    body: JSON.stringify(body),
  });
}

/** Settles within `ms`, or says it is still pending (its timer is cleared either way: nothing outlives the test). */
async function within<T>(p: Promise<T>, ms: number): Promise<{ done: true; value: T } | { done: false }> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p.then((value) => ({ done: true as const, value })),
      new Promise<{ done: false }>((r) => (timer = setTimeout(() => r({ done: false }), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

describe('pause / resume during a weight sync (POST /lightning/v1/control)', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm', chunkDelayMs: 20 });
    sidecar = await startSidecar(upstream.url, {
      service: { api_token: TOKEN, control: { max_held_calls: 2, max_hold_ms: 1500 } },
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
    });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  it('holds new calls while paused, lets in-flight streams finish, and releases held calls on resume', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/pause-1/v1`, apiKey: 'k', maxRetries: 0 });
    // In flight before the pause: a slow stream (20 ms between chunks).
    const inFlight = client.chat.completions.stream({ model: 'm', messages: [{ role: 'user', content: 'a long answer please' }] }).finalChatCompletion();
    for (let i = 0; i < 200 && upstream.requests.length === 0; i++) await new Promise((r) => setTimeout(r, 5));
    const paused = await control(sidecar, { type: 'pause', reason: 'weight-sync' });
    expect(paused.status).toBe(200);
    expect(((await paused.json()) as { state: { paused: boolean } }).state.paused).toBe(true);
    const requestsAtPause = upstream.requests.length;
    const held = client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'new call' }] });
    expect((await within(inFlight, 2000)).done).toBe(true);
    expect((await within(held, 150)).done).toBe(false);
    expect(upstream.requests.length).toBe(requestsAtPause);
    const state = (await (await fetch(`${sidecar.telemetryOrigin}/lightning/v1/control`)).json()) as { held_calls: number; reason: string };
    expect(state).toMatchObject({ held_calls: 1, reason: 'weight-sync' });
    expect(await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_paused')).toMatch(/lightning_sidecar_paused 1/);

    expect((await control(sidecar, { type: 'resume' })).status).toBe(200);
    const released = await held;
    expect(released.choices[0].message.content).toBe('Hello from the fake model.');
    const metrics = await sidecar.app.metrics.registry.metrics();
    expect(metrics).toMatch(/lightning_sidecar_held_calls_total\{outcome="released"\} 1/);
    expect(metrics).toMatch(/lightning_sidecar_paused 0/);
    expect(metrics).toMatch(/lightning_sidecar_paused_seconds_total [0-9.]*[1-9]/);
  });

  it('past the hold limits answers 429 with Retry-After and an OpenAI-shaped error', async () => {
    expect((await control(sidecar, { type: 'pause', reason: 'weight-sync' })).status).toBe(200);
    const raw = (content: string) =>
      fetch(`${sidecar.origin}/rollout/pause-2/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] }),
      });
    const a = raw('one');
    const b = raw('two');
    await new Promise((r) => setTimeout(r, 50));
    // max_held_calls = 2: the third is refused at once.
    const third = await raw('three');
    expect(third.status).toBe(429);
    expect(third.headers.get('retry-after')).toBe('2');
    expect(third.headers.get('x-lightning-paused')).toBe('true');
    const err = ((await third.json()) as { error: { type: string; code: string; message: string } }).error;
    expect(err).toMatchObject({ type: 'rate_limit_error', code: 'policy_update' });
    expect(err.message).toMatch(/policy is being updated \(weight-sync\)/);
    // max_hold_ms = 1500: the held ones time out with 429 too.
    expect((await a).status).toBe(429);
    expect((await b).status).toBe(429);
    expect(await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_held_calls_total')).toMatch(/outcome="timed_out"\} 2/);
    await control(sidecar, { type: 'resume' });
    // The refused calls left no transitions and took no sequence numbers.
    expect((await raw('after')).status).toBe(200);
  });

  it('an SDK with retries rides through a short pause', async () => {
    await control(sidecar, { type: 'pause', reason: 'weight-sync', until_ms: Date.now() + 700 });
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/pause-3/v1`, apiKey: 'k', maxRetries: 3 });
    const started = Date.now();
    const res = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
    expect(res.choices[0].message.content).toBe('Hello from the fake model.');
    expect(Date.now() - started).toBeGreaterThanOrEqual(300);
    expect(((await (await fetch(`${sidecar.telemetryOrigin}/lightning/v1/control`)).json()) as { paused: boolean }).paused).toBe(false);
  });

  it('guards the route with the API token and validates messages', async () => {
    expect((await control(sidecar, { type: 'pause' }, null)).status).toBe(401);
    expect((await control(sidecar, { type: 'pause' }, 'wrong-token-wrong-token')).status).toBe(401);
    const bad = await control(sidecar, { type: 'policy', version: 'has space' });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { param: string } }).error.param).toBe('version');
    expect((await control(sidecar, { type: 'reboot' })).status).toBe(400);
    expect(((await (await fetch(`${sidecar.telemetryOrigin}/lightning/v1/control`)).json()) as { paused: boolean }).paused).toBe(false);
  });
});

describe('a client that goes away while its call is held', () => {
  it('gives its place back; the call never reaches the model server, takes no sequence number, and shutdown does not wait for it', async () => {
    const upstream = await startFakeModelServer({ flavor: 'vllm' });
    const sidecar = await startSidecar(upstream.url, {
      service: { api_token: TOKEN, control: { max_held_calls: 1, max_hold_ms: 20_000 } },
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
    });
    let stopped = false;
    try {
      const heldNow = async () => ((await (await fetch(`${sidecar.telemetryOrigin}/lightning/v1/control`)).json()) as { held_calls: number }).held_calls;
      expect((await control(sidecar, { type: 'pause', reason: 'weight-sync' })).status).toBe(200);
      // An agent's call, held; then its client gives up (its own timeout) and closes the connection.
      const req = http.request(`${sidecar.origin}/rollout/gone-1/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } });
      req.on('error', () => {});
      req.end(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'never mind' }] }));
      for (let i = 0; i < 200 && (await heldNow()) === 0; i++) await new Promise((r) => setTimeout(r, 10));
      expect(await heldNow()).toBe(1);
      req.destroy();
      for (let i = 0; i < 200 && (await heldNow()) === 1; i++) await new Promise((r) => setTimeout(r, 10));
      expect(await heldNow()).toBe(0);
      expect(await sidecar.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_held_calls_total')).toMatch(/outcome="abandoned"\} 1/);

      // Its place is free (max_held_calls is 1): the agent's retry is held, not refused.
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/gone-1/v1`, apiKey: 'k', maxRetries: 0 });
      const retry = client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'again' }] });
      expect((await within(retry, 150)).done).toBe(false);
      expect(await heldNow()).toBe(1);
      const requestsBefore = upstream.requests.length;
      expect((await control(sidecar, { type: 'resume' })).status).toBe(200);
      expect((await retry).choices[0].message.content).toBe('Hello from the fake model.');
      // Only the retry went to the model server, and it is the rollout's first call.
      expect(upstream.requests.length).toBe(requestsBefore + 1);
      const reward = await fetch(`${sidecar.origin}/lightning/v1/rollouts/gone-1/reward`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
        body: JSON.stringify({ value: 1 }),
      });
      expect(reward.status).toBe(202);
      await sidecar.waitForEpisodes(1);
      expect(sidecar.transitions().map((t) => [t.rollout_id, t.seq, t.status])).toEqual([['gone-1', 0, 'ok']]);
      // Nothing of the abandoned call is still in flight: the sidecar stops without waiting out a drain.
      const stopping = sidecar.stop();
      stopped = true;
      expect((await within(stopping, 5000)).done).toBe(true);
    } finally {
      if (!stopped) await sidecar.stop();
      await upstream.close();
    }
  });
});

describe('policy_version on transitions', () => {
  let upstream: http.Server;
  let upstreamUrl: string;
  let headerVersion: string | null = null;
  beforeAll(async () => {
    // A vLLM-like server that names the policy it serves in a response header.
    upstream = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        const body = JSON.stringify({
          id: 'c',
          object: 'chat.completion',
          created: 1,
          model: 'm',
          prompt_token_ids: [1, 2, 3],
          choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop', token_ids: [7, 8] }],
          usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
        });
        res.writeHead(200, { 'content-type': 'application/json', ...(headerVersion ? { 'x-policy-version': headerVersion } : {}) }).end(body);
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`;
  });
  afterAll(() => new Promise<void>((r) => upstream.close(() => r())));

  it('comes from static config, then the control channel, then the upstream header; the episode reports its lag', async () => {
    const sidecar = await startSidecar(upstreamUrl, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      processors: { policy: { version: '16', response_header: 'X-Policy-Version' } },
    });
    try {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/pv/v1`, apiKey: 'k', maxRetries: 0 });
      const call = () => client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }] });
      await call(); // static: 16
      expect((await control(sidecar, { type: 'policy', version: 17 }, null)).status).toBe(200);
      await call(); // control channel: 17
      headerVersion = '18';
      await call(); // the serving layer says 18
      headerVersion = null;
      expect((await control(sidecar, { type: 'policy', version: '19' }, null)).status).toBe(200);
      expect((await postReward(sidecar.origin, 'pv', 1)).status).toBe(202);
      const [episode] = await sidecar.waitForEpisodes(1);
      expect(sidecar.transitions().map((t) => t.policy_version)).toEqual(['16', '17', '18']);
      // Newest seen (19, from the control channel) minus oldest used (16).
      expect(episode).toMatchObject({ policy_versions: ['16', '17', '18'], policy_version_lag: 3 });
    } finally {
      await sidecar.stop();
    }
  });
});

describe('the control topic on Kafka (test broker)', () => {
  it('every sidecar consumes it from the end: pause holds calls, resume releases them, policy versions land on transitions', async () => {
    const broker = await startKafkaTestBroker();
    const upstream = await startFakeModelServer({ flavor: 'vllm' });
    const overrides = {
      service: { exporter: 'kafka' },
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      exporters: { kafka: { brokers: broker.brokers, connection_timeout_ms: 500 } },
    };
    const a = await startSidecar(upstream.url, overrides);
    const b = await startSidecar(upstream.url, overrides);
    const kafka = new Kafka({ brokers: broker.brokers, logLevel: logLevel.NOTHING });
    const producer = kafka.producer();
    try {
      await Promise.all([a.app.kafkaControl!.ready(), b.app.kafkaControl!.ready()]);
      expect(a.app.kafkaControl!.groupId).not.toBe(b.app.kafkaControl!.groupId);
      await producer.connect();
      const send = (msg: unknown) => producer.send({ topic: 'lightning.control', messages: [{ value: JSON.stringify(msg) }] });
      await send({ type: 'policy', version: '41' });
      await send({ type: 'pause', reason: 'weight-sync' });
      for (const s of [a, b]) for (let i = 0; i < 200 && !s.app.controller.state().paused; i++) await new Promise((r) => setTimeout(r, 25));
      expect([a.app.controller.state(), b.app.controller.state()].map((s) => [s.paused, s.policy_version])).toEqual([
        [true, '41'],
        [true, '41'],
      ]);

      const client = new OpenAI({ baseURL: `${a.origin}/rollout/kc/v1`, apiKey: 'k', maxRetries: 0 });
      const held = client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }] });
      expect((await within(held, 200)).done).toBe(false);
      await send({ type: 'garbage' });
      await send({ type: 'resume' });
      expect((await held).choices[0].message.content).toBe('Hello from the fake model.');
      expect((await postReward(a.origin, 'kc', 1)).status).toBe(202);
      await new Promise((r) => setTimeout(r, 50));
      for (let i = 0; i < 200 && broker.records('lightning.transitions').length === 0; i++) await new Promise((r) => setTimeout(r, 25));
      const [t] = broker.records('lightning.transitions').map((r) => JSON.parse(r.value!.toString()) as { policy_version: string });
      expect(t.policy_version).toBe('41');
      expect(await a.app.metrics.registry.getSingleMetricAsString('lightning_sidecar_control_messages_total')).toMatch(/source="kafka",outcome="invalid"\} 1/);
    } finally {
      await producer.disconnect();
      await a.stop();
      await b.stop();
      await upstream.close();
      await broker.close();
    }
  });

  it('a sidecar that starts later replays the tail of the topic: it knows the current policy version and that the pause is over', async () => {
    const broker = await startKafkaTestBroker();
    const upstream = await startFakeModelServer({ flavor: 'vllm' });
    const kafka = new Kafka({ brokers: broker.brokers, logLevel: logLevel.NOTHING });
    const producer = kafka.producer();
    await producer.connect();
    for (const msg of [{ type: 'policy', version: '39' }, { type: 'pause', reason: 'weight-sync' }, { type: 'resume' }, { type: 'policy', version: '40' }]) {
      await producer.send({ topic: 'lightning.control', messages: [{ value: JSON.stringify(msg) }] });
    }
    const late = await startSidecar(upstream.url, {
      service: { exporter: 'kafka' },
      exporters: { kafka: { brokers: broker.brokers, connection_timeout_ms: 500 } },
    });
    try {
      await late.app.kafkaControl!.ready();
      for (let i = 0; i < 200 && late.app.controller.state().policy_version !== '40'; i++) await new Promise((r) => setTimeout(r, 25));
      expect(late.app.controller.state()).toMatchObject({ policy_version: '40', paused: false });
      // And it still follows new messages.
      await producer.send({ topic: 'lightning.control', messages: [{ value: JSON.stringify({ type: 'policy', version: '41' }) }] });
      for (let i = 0; i < 200 && late.app.controller.state().policy_version !== '41'; i++) await new Promise((r) => setTimeout(r, 25));
      expect(late.app.controller.state().policy_version).toBe('41');
    } finally {
      await producer.disconnect();
      await late.stop();
      await upstream.close();
      await broker.close();
    }
  });
});
