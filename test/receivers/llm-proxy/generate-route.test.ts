import type { CallFacts } from '../../../src/formats/extract';
import { requestNumbers } from '../../../src/processors/rewards/request-numbers';
import { GenerateRoute } from '../../../src/receivers/llm-proxy/token-in/generate-route';
import { createLogger } from '../../../src/telemetry/logger';

// Whether token-in uses vLLM's generate route: only an answer that says so decides.

const logger = createLogger({ level: 'error', write: () => {} });
const answer = (status: number, body: unknown) => async () => ({ status, body: Buffer.from(JSON.stringify(body)) });
const WITH_TEXT = { choices: [{ index: 0, token_ids: [13], text: '.' }] };

describe('the generate route', () => {
  it('a 200 with text sends every later call there without asking again', async () => {
    const route = new GenerateRoute('auto', logger);
    let asked = 0;
    const probe = async () => {
      asked++;
      return answer(200, WITH_TEXT)();
    };
    expect(await route.use(probe)).toBe(true);
    expect(await route.use(probe)).toBe(true);
    expect(asked).toBe(1);
  });

  it('a 404, or a 200 without text, decides against it; a 503, a 429 or no answer decide nothing', async () => {
    for (const [probe, decided] of [
      [answer(404, { detail: 'Not Found' }), true],
      [answer(200, { choices: [{ token_ids: [13] }] }), true],
      [answer(503, { error: 'paused' }), false],
      [answer(429, {}), false],
      [async () => ({ error: Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }) }), false],
    ] as const) {
      const route = new GenerateRoute('auto', logger);
      expect(await route.use(probe)).toBe(false);
      let again = false;
      await route.use(async () => {
        again = true;
        return answer(200, WITH_TEXT)();
      });
      expect(again).toBe(!decided);
    }
  });

  it('concurrent first calls share one question; a configured route asks nothing', async () => {
    const route = new GenerateRoute('auto', logger);
    let asked = 0;
    const probe = async () => {
      asked++;
      await new Promise((r) => setTimeout(r, 10));
      return answer(200, WITH_TEXT)();
    };
    expect(await Promise.all([route.use(probe), route.use(probe), route.use(probe)])).toEqual([true, true, true]);
    expect(asked).toBe(1);
    expect(new GenerateRoute('completions', logger).use(probe)).toBe(false);
    expect(new GenerateRoute('generate', logger).use(probe)).toBe(true);
  });
});

describe('request numbers', () => {
  const numbers = (body: unknown) => requestNumbers({ bodies: { request: [0] } } as unknown as CallFacts, () => Buffer.from(JSON.stringify(body)))!;
  it('reads sampling parameters nested in sampling_params, and other members at the top', () => {
    const n = numbers({ input_ids: [1, 2], sampling_params: { temperature: 0.5, max_new_tokens: 9 }, routed_experts_start_len: 4 });
    expect([n('temperature'), n('max_new_tokens'), n('routed_experts_start_len'), n('top_p')]).toEqual([0.5, 9, 4, null]);
    expect(numbers({ temperature: 0.7, seed: 3 })('seed')).toBe(3);
  });
});
