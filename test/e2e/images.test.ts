import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import type { Trajectory } from '../../src/model/records';
import { CLICK_TOOLS, FACTOR, MAX_PIXELS, MIN_PIXELS, MODEL, startQwenVlServer, type QwenVlServer } from '../support/qwen-vl-server';
import { openaiAgent, SCREENS } from '../support/screenshot-agent';
import { startKafkaTestBroker } from '../support/kafka-broker';
import { metricSample, postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * Screenshot agents through the sidecar, in front of a vision-model stand-in that expands images as
 * the Qwen-VL processor does (vision start, N image pads from the resized size, vision end) and
 * returns ids as vLLM does. Agents on the real `openai` and `@anthropic-ai/sdk` SDKs send a new
 * screenshot every turn (data URLs; the whole history each time), streamed and not. Each
 * trajectory's image spans must be the server's placeholder runs, the stored images byte-identical
 * to what the agent sent, each distinct image stored once; a placeholder/image mismatch, an image
 * that cannot be stored and an http(s) image each make the trajectory fail closed, counted.
 */

/** The same agent on the Anthropic SDK (base64 image blocks), through the sidecar's translation to chat. */
async function anthropicAgent(sidecar: TestSidecar, rollout: string, stream: boolean): Promise<string[]> {
  const client = new Anthropic({ baseURL: `${sidecar.origin}/rollout/${rollout}`, apiKey: 'sk-ant-test', maxRetries: 0 });
  const image = (png: Buffer): Anthropic.ImageBlockParam => ({
    type: 'image',
    source: { type: 'base64', media_type: 'image/png', data: png.toString('base64') },
  });
  const messages: Anthropic.MessageParam[] = [{ role: 'user', content: [{ type: 'text', text: 'Open the settings.' }, image(SCREENS[0])] }];
  const tools: Anthropic.Tool[] = CLICK_TOOLS.map((t) => ({
    name: t.function.name,
    description: t.function.description,
    input_schema: t.function.parameters as Anthropic.Tool.InputSchema,
  }));
  const answers: string[] = [];
  for (let turn = 1; turn <= 8; turn++) {
    const params = { model: MODEL, max_tokens: 512, messages, tools };
    const m = stream ? await client.messages.stream(params).finalMessage() : await client.messages.create(params);
    const uses = m.content.filter((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use');
    answers.push(uses.length > 0 ? `click ${JSON.stringify(uses[0].input)}` : m.content.map((b) => (b.type === 'text' ? b.text : '')).join(''));
    messages.push({ role: 'assistant', content: m.content });
    if (uses.length === 0) break;
    messages.push({
      role: 'user',
      content: [
        ...uses.map((u) => ({ type: 'tool_result' as const, tool_use_id: u.id, content: 'clicked' })),
        image(SCREENS[Math.min(turn, SCREENS.length - 1)]),
      ],
    });
  }
  return answers;
}

async function closed(sidecar: TestSidecar, rollout: string): Promise<Trajectory[]> {
  expect((await postReward(sidecar.origin, rollout, 1)).status).toBe(202);
  const deadline = Date.now() + 20_000;
  while (!sidecar.episodes().some((e) => e.rollout_id === rollout)) {
    if (Date.now() > deadline) throw new Error(`no episode for ${rollout}`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return sidecar.trajectories().filter((t) => t.rollout_id === rollout);
}

async function metric(sidecar: TestSidecar, line: string): Promise<number> {
  return (await metricSample(sidecar, line)) ?? 0;
}

/** Every file of the image store, by name. */
function stored(dataDir: string): Map<string, Buffer> {
  const dir = path.join(dataDir, 'images');
  const out = new Map<string, Buffer>();
  if (!existsSync(dir)) return out;
  for (const sub of readdirSync(dir)) for (const f of readdirSync(path.join(dir, sub))) out.set(f, readFileSync(path.join(dir, sub, f)));
  return out;
}

describe('images in calls become trainable trajectories, or fail closed', () => {
  const servers: QwenVlServer[] = [];
  const sidecars: TestSidecar[] = [];
  afterAll(async () => {
    await Promise.all(sidecars.map((s) => s.stop()));
    await Promise.all(servers.map((s) => s.close()));
  });
  const setup = async (
    serverOptions: Parameters<typeof startQwenVlServer>[0] = {},
    processor = true,
  ): Promise<{ server: QwenVlServer; sidecar: TestSidecar }> => {
    const server = await startQwenVlServer(serverOptions);
    servers.push(server);
    const sidecar = await startSidecar(server.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      processors: processor ? { images: { processor: { factor: FACTOR, min_pixels: MIN_PIXELS, max_pixels: MAX_PIXELS } } } : {},
    });
    sidecars.push(sidecar);
    return { server, sidecar };
  };

  it.each([
    ['openai', false],
    ['openai', true],
    ['anthropic', false],
    ['anthropic', true],
  ] as const)(
    '%s SDK (streamed: %s): one segment, spans at the server placeholders, the stored bytes the agent sent, each image once',
    async (sdk, stream) => {
      const { server, sidecar } = await setup();
      const rollout = `screens-${sdk}-${stream}`;
      const answers = sdk === 'openai' ? await openaiAgent(sidecar, rollout, stream) : await anthropicAgent(sidecar, rollout, stream);
      expect(answers).toEqual(['click {"x":110,"y":205}', 'click {"x":120,"y":210}', 'click {"x":130,"y":215}', 'Done after 4 screenshots.']);
      const [t, ...more] = await closed(sidecar, rollout);
      expect(more).toHaveLength(0);
      expect(t.segments).toBe(1);
      expect(t.images_error).toBeNull();
      expect(t.images_complete).toBe(true);
      // The server's placeholders of the last call, image by image.
      const last = server.images[server.images.length - 1];
      expect(t.images!.map((i) => [i.order, i.start, i.length, i.width, i.height])).toEqual(last.map((i) => [i.index, i.offset, i.pads, i.width, i.height]));
      expect(t.images!.every((i) => i.length === 1334)).toBe(true);
      // The loss mask is 0 on every placeholder; the ids there are the pad token.
      for (const i of t.images!) {
        expect(t.loss_mask.slice(i.start!, i.start! + i.length!).every((m) => m === 0)).toBe(true);
        expect(t.token_ids.slice(i.start!, i.start! + i.length!).every((id) => id === t.image_processor!.image_token_id)).toBe(true);
      }
      expect(t.image_processor).toEqual({ image_token_id: 151655, factor: FACTOR, min_pixels: MIN_PIXELS, max_pixels: MAX_PIXELS });
      // Stored once each, byte-identical to what the agent sent, named by their hash.
      const files = stored(sidecar.dataDir);
      expect(files.size).toBe(4);
      for (const [i, image] of t.images!.entries()) {
        expect(files.get(`${image.sha256}.png`)).toEqual(SCREENS[i]);
        expect(image.bytes).toBe(SCREENS[i].length);
        expect(image.mime).toBe('image/png');
      }
      expect(await metric(sidecar, 'lightning_sidecar_images_stored_total{result="written"}')).toBe(4);
      expect(await metric(sidecar, 'lightning_sidecar_trajectory_images_total{outcome="complete"}')).toBe(1);
    },
    60_000,
  );

  it('the same screenshot sent again and again is stored once, and every run points at it', async () => {
    const { sidecar } = await setup();
    const same = [SCREENS[0], SCREENS[0], SCREENS[0], SCREENS[0]];
    await openaiAgent(sidecar, 'same-screen', false, same);
    const [t] = await closed(sidecar, 'same-screen');
    expect(t.images).toHaveLength(4);
    expect(new Set(t.images!.map((i) => i.sha256)).size).toBe(1);
    expect(stored(sidecar.dataDir).size).toBe(1);
    expect(t.images_complete).toBe(true);
  }, 60_000);

  it('placeholders that do not pair with the images: flagged, counted, not published as complete', async () => {
    // The server expands the third image to nothing (as if it had dropped it).
    const { sidecar } = await setup({ pads: (index, n) => (index === 2 ? 0 : n) });
    await openaiAgent(sidecar, 'dropped', false);
    const [t] = await closed(sidecar, 'dropped');
    expect(t.images_complete).toBe(false);
    expect(t.images_error).toMatch(/^placeholders_do_not_pair: 3 placeholder run\(s\) for 4 image\(s\)/);
    expect(t.images!.every((i) => i.start === null && i.length === null)).toBe(true);
    expect(await metric(sidecar, 'lightning_sidecar_trajectory_images_total{outcome="placeholders_do_not_pair"}')).toBe(1);
  }, 60_000);

  it('images the server gave no placeholders at all: the request still read for them, and flagged', async () => {
    // No placeholder in any prompt: only the proxy's note that the request names images (made as
    // it streamed through) has the export read the request; without it the images would be lost.
    const { sidecar } = await setup({ pads: () => 0 });
    await openaiAgent(sidecar, 'no-placeholders', false);
    const [t] = await closed(sidecar, 'no-placeholders');
    expect(t.images).toHaveLength(4);
    expect(t.images_complete).toBe(false);
    expect(t.images_error).toMatch(/^placeholders_do_not_pair: 0 placeholder run\(s\) for 4 image\(s\)/);
  }, 60_000);

  it('a run of another length than the processor gives: flagged as placeholder_length', async () => {
    const { sidecar } = await setup({ pads: (index, n) => (index === 1 ? n + 2 : n) });
    await openaiAgent(sidecar, 'drift', false);
    const [t] = await closed(sidecar, 'drift');
    expect(t.images_complete).toBe(false);
    expect(t.images_error).toMatch(/^placeholder_length: image 1 \(1280x800\) has 1336 placeholders, the processor gives 1334/);
    expect(await metric(sidecar, 'lightning_sidecar_trajectory_images_total{outcome="placeholder_length"}')).toBe(1);
  }, 60_000);

  it('an image that cannot be stored: flagged store_failed, counted, the call itself served', async () => {
    const { sidecar } = await setup();
    // A file where the store's folder should be: nothing can be written under it.
    writeFileSync(path.join(sidecar.dataDir, 'images'), 'not a folder');
    const answers = await openaiAgent(sidecar, 'unstorable', true);
    expect(answers).toHaveLength(4);
    const [t] = await closed(sidecar, 'unstorable');
    expect(t.images_complete).toBe(false);
    expect(t.images_error).toMatch(/^store_failed: image 0: /);
    expect(await metric(sidecar, 'lightning_sidecar_images_stored_total{result="failed"}')).toBe(4);
    expect(await metric(sidecar, 'lightning_sidecar_trajectory_images_total{outcome="store_failed"}')).toBe(1);
  }, 60_000);

  it('an http(s) image: its URL recorded, no bytes, flagged url_not_stored', async () => {
    const { server, sidecar } = await setup({}, false);
    const url = 'https://example.test/screen-1.png';
    await openaiAgent(sidecar, 'by-url', false, [SCREENS[0], url, SCREENS[2], SCREENS[3]]);
    const [t] = await closed(sidecar, 'by-url');
    expect(server.urls).toContain(url);
    expect(t.images_complete).toBe(false);
    expect(t.images_error).toMatch(/^url_not_stored: image 1/);
    expect(t.images![1]).toMatchObject({ url, sha256: null, bytes: null });
    // Its placeholder run is still where the server put it.
    expect(t.images![1].length).toBe(server.images[server.images.length - 1][1].pads);
    expect(stored(sidecar.dataDir).size).toBe(3);
    expect(await metric(sidecar, 'lightning_sidecar_trajectory_images_total{outcome="url_not_stored"}')).toBe(1);
  }, 60_000);

  it('with Kafka, each distinct image is a record of its own (keyed by its hash) before the trajectory, once across the episodes', async () => {
    const broker = await startKafkaTestBroker();
    const server = await startQwenVlServer();
    servers.push(server);
    try {
      const sidecar = await startSidecar(server.url, {
        service: { exporter: 'kafka' },
        receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
        exporters: { kafka: { brokers: broker.brokers, connection_timeout_ms: 500 } },
      });
      sidecars.push(sidecar);
      const episodes = async (n: number): Promise<void> => {
        const until = Date.now() + 20_000;
        while (broker.records('lightning.episodes').length < n && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
        expect(broker.records('lightning.episodes')).toHaveLength(n);
      };
      await openaiAgent(sidecar, 'kafka-1', false);
      expect((await postReward(sidecar.origin, 'kafka-1', 1)).status).toBe(202);
      await episodes(1);
      // A second rollout with the same first screenshot: it is not sent again.
      await openaiAgent(sidecar, 'kafka-2', true, [SCREENS[0], SCREENS[0], SCREENS[0], SCREENS[0]]);
      expect((await postReward(sidecar.origin, 'kafka-2', 1)).status).toBe(202);
      await episodes(2);
      const images = broker.records('lightning.images');
      expect(images.map((r) => r.key?.toString())).toEqual(SCREENS.map((png) => createHash('sha256').update(png).digest('hex')));
      images.forEach((r, i) => expect(r.value).toEqual(SCREENS[i]));
      const trajectories = broker.records('lightning.trajectories').map((r) => JSON.parse(r.value!.toString('utf8')) as Trajectory);
      expect(trajectories.map((t) => t.images_complete)).toEqual([true, true]);
      expect(trajectories[1].images!.map((i) => i.sha256)).toEqual(SCREENS.map(() => images[0].key?.toString()));
    } finally {
      await broker.close();
    }
  }, 60_000);

  describe('under token-in', () => {
    it.each([false, true])(
      'through vLLM render and generate (streamed: %s): the answers of chat, one segment, the spans where the ids put them',
      async (stream) => {
        const server = await startQwenVlServer({ tokenIn: true });
        servers.push(server);
        const sidecar = await startSidecar(server.url, {
          receivers: { llm_proxy: { upstream_flavor: 'auto', token_in: { enabled: true } } },
          processors: { images: { processor: { factor: FACTOR, min_pixels: MIN_PIXELS, max_pixels: MAX_PIXELS } } },
        });
        sidecars.push(sidecar);
        const plain = await setup();
        const rollout = `token-in-images-${stream}`;
        const answers = await openaiAgent(sidecar, rollout, stream);
        expect(answers).toEqual(await openaiAgent(plain.sidecar, `plain-${rollout}`, stream));
        const [t, ...more] = await closed(sidecar, rollout);
        expect(more).toHaveLength(0);
        const transitions = sidecar.transitions().filter((x) => x.rollout_id === rollout);
        expect(transitions.map((x) => x.token_in)).toEqual(['rendered:first_call', 'spliced', 'spliced', 'spliced']);
        expect(transitions.map((x) => x.translation?.upstream_api)).toEqual(['generate', 'generate', 'generate', 'generate']);
        // Each generate call carried the images' features, placed on the runs of its own prompt.
        const generated = server.requests.filter(
          (r) => r.path === '/inference/v1/generate' && Array.isArray(r.json.token_ids) && (r.json.token_ids as number[]).length > 1,
        );
        expect(generated).toHaveLength(4);
        expect(t.images_error).toBeNull();
        expect(t.images_complete).toBe(true);
        const last = generated[generated.length - 1].json;
        const placed = (last.features as { mm_placeholders: { image: { offset: number; length: number }[] } }).mm_placeholders.image;
        expect(t.images!.map((i) => [i.start, i.length])).toEqual(placed.map((p) => [p.offset, p.length]));
        expect(t.token_ids.slice(0, (last.token_ids as number[]).length)).toEqual(last.token_ids);
        // The journal keeps the features less the images' processed data.
        expect(await metric(sidecar, 'lightning_sidecar_token_in_calls_total{result="fallback",reason="images"}')).toBe(0);
      },
      60_000,
    );

    it('without vLLM generate route, calls with images go through as chat, counted', async () => {
      const server = await startQwenVlServer();
      servers.push(server);
      const sidecar = await startSidecar(server.url, { receivers: { llm_proxy: { upstream_flavor: 'auto', token_in: { enabled: true } } } });
      sidecars.push(sidecar);
      expect(await openaiAgent(sidecar, 'no-route', false)).toHaveLength(4);
      const [t] = await closed(sidecar, 'no-route');
      expect(t.images_complete).toBe(true);
      expect(await metric(sidecar, 'lightning_sidecar_token_in_calls_total{result="fallback",reason="images_need_generate_route"}')).toBe(4);
    }, 60_000);
  });
});
