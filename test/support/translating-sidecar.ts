import type { Transition } from '../../src/model/records';
import { vllmCalculatorScript } from './calculator';
import { startFakeModelServer, type Fault, type FakeModelServer, type ReceivedRequest, type Turn } from './fake-model-server';
import { postReward, startSidecar, type TestSidecar } from './sidecar';

/** What a client received for one request: the body text as it arrived (complete once `done`). */
export interface Received {
  status: number;
  text: string;
  done: Promise<void>;
}

export interface TranslatingSidecar {
  readonly upstream: FakeModelServer;
  readonly sidecar: TestSidecar;
  /** Overrides the calculator agent's turn for this test (reset before each test). */
  script: ((r: ReceivedRequest) => Turn) | null;
  /** A fault of the model server for this test (reset before each test). */
  fault: ((r: ReceivedRequest) => Fault | null) | null;
  /** The rollout of the current test: each test has its own. */
  readonly rollout: string;
  /** Base URL without `/v1` for SDK clients; pair it with `fetch`, which puts in the current rollout. */
  readonly baseUrl: string;
  /** A fetch for SDK clients: sends to the current test's rollout and records what came back in `received`. */
  fetch(input: string | URL | Request, init?: RequestInit): Promise<Response>;
  /** The current test's responses, as the client received them, in order. */
  received: Received[];
  /** The upstream's chat-completions requests of the current test, in order. */
  chatRequests(): ReceivedRequest[];
  /** Ends the current rollout and reads its `n` transitions (one per call: the sidecar's record of each). */
  calls(n: number): Promise<Transition[]>;
}

/**
 * The real sidecar, translating Responses and Anthropic Messages (`receivers.llm_proxy.translate`),
 * in front of a strict vLLM-like model server (the calculator agent unless a test scripts it):
 * started in beforeAll, stopped in afterAll, a fresh rollout for every test.
 */
export function useTranslatingSidecar(): TranslatingSidecar {
  let upstream: FakeModelServer | undefined;
  let sidecar: TestSidecar | undefined;
  let rollout = '';
  let tests = 0;
  const h: TranslatingSidecar = {
    get upstream() {
      return upstream!;
    },
    get sidecar() {
      return sidecar!;
    },
    script: null,
    fault: null,
    get rollout() {
      return rollout;
    },
    get baseUrl() {
      return `${sidecar!.origin}/rollout/ROLLOUT`;
    },
    async fetch(input, init) {
      const res = await fetch(String(input).replace('/rollout/ROLLOUT/', `/rollout/${rollout}/`), init);
      const entry: Received = { status: res.status, text: '', done: Promise.resolve() };
      const copy = res.clone().body;
      if (copy) {
        entry.done = (async () => {
          const decoder = new TextDecoder();
          try {
            for await (const chunk of copy) entry.text += decoder.decode(chunk as Uint8Array, { stream: true });
          } catch {
            // A connection cut short: the text is what arrived.
          }
        })();
      }
      h.received.push(entry);
      return res;
    },
    received: [],
    chatRequests: () => upstream!.requests.filter((r) => r.path === '/v1/chat/completions'),
    async calls(n) {
      await Promise.all(h.received.map((r) => r.done));
      expect((await postReward(sidecar!.origin, rollout, 1)).status).toBe(202);
      const until = Date.now() + 10_000;
      const mine = () => sidecar!.transitions().filter((t) => t.rollout_id === rollout);
      while (mine().length < n && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      return mine();
    },
  };
  beforeAll(async () => {
    upstream = await startFakeModelServer({ strict: true, script: (r) => (h.script ?? vllmCalculatorScript)(r), fault: (r) => h.fault?.(r) ?? null });
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm', translate: ['responses', 'anthropic.messages'] } },
    });
  });
  afterAll(async () => {
    await sidecar?.stop();
    await upstream?.close();
  });
  beforeEach(() => {
    h.script = null;
    h.fault = null;
    h.received.length = 0;
    upstream!.requests.length = 0;
    rollout = `sdk-${++tests}`;
  });
  return h;
}
