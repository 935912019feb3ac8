import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../../support/sidecar';

let upstream: FakeModelServer;
let sidecar: TestSidecar;
beforeEach(async () => {
  upstream = await startFakeModelServer();
  sidecar = await startSidecar(upstream.url, { receivers: { rollout_api: { max_body_bytes: 1024 } } });
});
afterEach(async () => {
  await sidecar.stop();
  await upstream.close();
});

type ErrorJson = { error: { message: string } };
const post = (path: string, body: string, method = 'POST') =>
  fetch(`${sidecar.origin}${path}`, { method, headers: { 'content-type': 'application/json' }, body: method === 'GET' ? undefined : body });

describe('rollout API', () => {
  it.each([
    ['{}', 'value: is missing; the body must be {"value": <number>}'],
    ['{"value":"1"}', 'value: must be a finite number; the body must be {"value": <number>}'],
    ['{"reward":1}', 'value: is missing: use "value" instead of "reward"; the body must be {"value": <number>}'],
    ['{"score":0.5,"final":true}', 'value: is missing: use "value" instead of "score"; the body must be {"value": <number>}'],
    ['{"value":1,"final":"yes"}', 'final: must be a boolean'],
    ['{"value":1,"attempt_id":"a b"}', 'attempt_id: must be 1-128 characters'],
    ['{"value":1,"name":""}', 'name: must be a string'],
    ['[1]', 'body: must be a JSON object'],
    ['{"value":', 'body: is not valid JSON'],
  ])('answers 400 naming the field for %s', async (body, message) => {
    const res = await post('/lightning/v1/rollouts/r1/reward', body);
    expect(res.status).toBe(400);
    const json = (await res.json()) as ErrorJson;
    expect(json.error.message).toContain(message);
  });

  it('answers a reward posted as {"reward": 1} in the OpenAI error shape, saying to use "value"', async () => {
    const res = await post('/lightning/v1/rollouts/r1/reward', '{"reward":1}');
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({
      error: {
        message: 'value: is missing: use "value" instead of "reward"; the body must be {"value": <number>} (optionally "final", "name", "attempt_id")',
        type: 'invalid_request_error',
        param: 'value',
      },
    });
  });

  it('answers 400 for a malformed rollout id in the path', async () => {
    const res = await post('/lightning/v1/rollouts/bad%20id/reward', '{"value":1}');
    expect(res.status).toBe(400);
    expect(((await res.json()) as ErrorJson).error.message).toContain('rollout_id');
  });

  it('answers 404, 405 and 413 for unknown routes, other methods and big bodies', async () => {
    expect((await post('/lightning/v1/nothing', '{}')).status).toBe(404);
    const get = await post('/lightning/v1/rollouts/r1/reward', '', 'GET');
    expect(get.status).toBe(405);
    expect(get.headers.get('allow')).toBe('POST');
    expect((await post('/lightning/v1/rollouts/r1/reward', JSON.stringify({ value: 1, pad: 'x'.repeat(2000) }))).status).toBe(413);
  });

  it('closes the episode with a final reward and credits it to every call', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/rw/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'a' }] });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'b' }] });
    const step = await post('/lightning/v1/rollouts/rw/reward', '{"value":0.1,"final":false,"name":"format"}');
    expect(step.status).toBe(202);
    const res = await post('/lightning/v1/rollouts/rw/reward', '{"value":2.5}');
    expect(res.status).toBe(202);
    expect(await res.json()).toEqual({ accepted: true, rollout_id: 'rw', attempt_id: '0' });
    const [ep] = await sidecar.waitForEpisodes(1);
    expect(ep).toMatchObject({
      final_reward: 2.5,
      rewards: [
        { name: 'format', value: 0.1, final: false },
        { name: 'primary', value: 2.5, final: true },
      ],
    });
    expect(sidecar.transitions().map((t) => t.reward)).toEqual([2.5, 2.5]);
  });

  it('takes rewards on the agent-lightning v1 events route', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/proxy/rollout/agl/attempt/0/mode/train/openai/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'a' }] });
    const res = await post('/api/rollouts/agl/attempt/0/events', '{"event_type":"reward","data":{"value":1.0,"reason":"solved"}}');
    expect(res.status).toBe(202);
    const [ep] = await sidecar.waitForEpisodes(1);
    expect(ep).toMatchObject({ rollout_id: 'agl', final_reward: 1 });
    const misnamed = await post('/api/rollouts/agl/attempt/0/events', '{"event_type":"reward","data":{"reward":1}}');
    expect(misnamed.status).toBe(400);
    expect(await misnamed.json()).toEqual({
      error: {
        message: 'data.value: is missing: use "value" instead of "reward"; the body must be {"event_type": "reward", "data": {"value": <number>}}',
        type: 'invalid_request_error',
        param: 'data.value',
      },
    });
    const bad = await post('/api/rollouts/agl/attempt/0/events', '{"event_type":"model_request","data":{}}');
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as ErrorJson).error.message).toContain('event_type');
  });

  it('closes on end without a reward', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/e1/attempt/1/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'a' }] });
    expect((await post('/lightning/v1/rollouts/e1/end', '{"attempt_id":"1"}')).status).toBe(202);
    const [ep] = await sidecar.waitForEpisodes(1);
    expect(ep).toMatchObject({ rollout_id: 'e1', attempt_id: '1', episode_status: 'completed', final_reward: null });
  });
});
