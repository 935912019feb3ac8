import { createHash } from 'node:crypto';
import { crc32, inflateSync } from 'node:zlib';
import OpenAI from 'openai';
import { HermesToolParser } from '../../../src/receivers/llm-proxy/token-in/hermes-tools';
import { decode, encode, type ChatMessage } from '../../support/qwen3-server';
import {
  CLICK_TOOLS,
  IMAGE_PAD,
  IM_END,
  VISION_END,
  VISION_START,
  collapsePads,
  dataUrl,
  decodeVl,
  imagePads,
  imageSize,
  pngScreenshot,
  renderVlChat,
  smartResize,
  startQwenVlServer,
  type QwenVlServer,
  type VlRender,
} from '../../support/qwen-vl-server';

/**
 * The Qwen2.5-VL stand-in the multimodal capture tests run against: smart_resize as transformers
 * computes it (the values below were checked against `transformers`' own function), the PNG
 * screenshots it is fed, and its chat route, which must expand each image's pad to that image's
 * count, in order, the same streamed or not, and be readable by the real `openai` SDK.
 */

/** The pad runs of a prompt: one per `<|vision_start|>`, each closed by `<|vision_end|>`. */
function padRuns(ids: readonly number[]): { offset: number; pads: number }[] {
  const runs: { offset: number; pads: number }[] = [];
  ids.forEach((t, i) => {
    if (t !== VISION_START) return;
    let j = i + 1;
    while (ids[j] === IMAGE_PAD) j++;
    expect(ids[j]).toBe(VISION_END);
    runs.push({ offset: i + 1, pads: j - i - 1 });
  });
  return runs;
}

/** The start of a JPEG up to its frame header (APP0, then SOF0 or SOF2): all `imageSize` reads. */
function jpegHead(width: number, height: number, sof: 0xc0 | 0xc2): Buffer {
  const app0 = [0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00];
  const frame = [0xff, sof, 0x00, 0x11, 0x08, height >> 8, height & 0xff, width >> 8, width & 0xff, 0x03, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1];
  return Buffer.from([0xff, 0xd8, ...app0, ...frame, 0xff, 0xd9]);
}

interface ChatAnswer {
  prompt_token_ids: number[];
  choices: {
    message: {
      role: string;
      content: string | null;
      reasoning_content: null;
      tool_calls: { id: string; type: 'function'; function: { name: string; arguments: string } }[];
    };
    token_ids: number[];
    finish_reason: string;
    logprobs: { content: { token: string; logprob: number; bytes: null; top_logprobs: unknown[] }[] } | null;
  }[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

async function chat(server: QwenVlServer, body: Record<string, unknown>): Promise<ChatAnswer> {
  const r = await fetch(`${server.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'Qwen/Qwen2.5-VL-7B-Instruct', return_token_ids: true, ...body }),
  });
  expect(r.status).toBe(200);
  return (await r.json()) as ChatAnswer;
}

/** The `data:` payloads of an SSE answer, `[DONE]` included. */
async function events(server: QwenVlServer, body: Record<string, unknown>): Promise<string[]> {
  const r = await fetch(`${server.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'Qwen/Qwen2.5-VL-7B-Instruct', return_token_ids: true, stream: true, ...body }),
  });
  expect(r.status).toBe(200);
  expect(r.headers.get('content-type')).toMatch(/^text\/event-stream/);
  return (await r.text())
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice(6));
}

const screenshot = (width: number, height: number, seed: number) => ({ type: 'image_url', image_url: { url: dataUrl(pngScreenshot(width, height, seed)) } });

describe('smart_resize', () => {
  it('gives the worked examples: 1280×800 → 812×1288, grid 58×92, 1334 pads; 1300×876 → 1426 pads', () => {
    expect(smartResize(800, 1280)).toEqual({ height: 812, width: 1288 });
    expect([812 / 14, 1288 / 14]).toEqual([58, 92]);
    expect(imagePads(800, 1280)).toBe(1334);
    expect(smartResize(876, 1300)).toEqual({ height: 868, width: 1288 });
    expect(imagePads(876, 1300)).toBe(1426);
  });

  it('rounds halves to even as Python does: 1260×798 is 1260 pads, not the 1305 Math.round would give', () => {
    expect(798 / 28).toBe(28.5);
    expect(smartResize(798, 1260)).toEqual({ height: 784, width: 1260 });
    expect(imagePads(798, 1260)).toBe(1260);
    expect((Math.round(798 / 28) * 28 * 1260) / 784).toBe(1305);
    // 42 / 28 = 1.5 rounds up to 2, 70 / 28 = 2.5 rounds down to 2.
    expect(smartResize(42, 70)).toEqual({ height: 56, width: 56 });
  });

  it('clamps to max_pixels and min_pixels as transformers does', () => {
    expect(smartResize(4000, 4000)).toEqual({ height: 3584, width: 3584 });
    expect(smartResize(8192, 8192)).toEqual({ height: 3584, width: 3584 });
    expect(smartResize(3585, 3583)).toEqual({ height: 3584, width: 3584 });
    expect(smartResize(2160, 3840)).toEqual({ height: 2156, width: 3836 });
    expect(smartResize(30, 30)).toEqual({ height: 56, width: 56 });
    expect(smartResize(28, 28)).toEqual({ height: 56, width: 56 });
    // The image processor's own default max_pixels (28 × 28 × 1280).
    expect(smartResize(1080, 1920, { maxPixels: 1003520 })).toEqual({ height: 728, width: 1316 });
    expect(imagePads(1080, 1920, { maxPixels: 1003520 })).toBe(1222);
  });

  it('refuses a side shorter than the factor and an aspect ratio above 200', () => {
    expect(() => smartResize(600, 20)).toThrow('height:600 or width:20 must be larger than factor:28');
    expect(() => imagePads(20, 600)).toThrow(/must be larger than factor/);
    expect(() => smartResize(28, 6000)).toThrow(/absolute aspect ratio must be smaller than 200/);
  });
});

describe('screenshots', () => {
  it('pngScreenshot writes a valid deterministic PNG of the size asked, tens of KB for 1280×800', () => {
    const png = pngScreenshot(1280, 800, 1);
    expect(png.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
    expect(imageSize(png)).toEqual({ width: 1280, height: 800 });
    expect(png.length).toBeGreaterThan(5_000);
    expect(png.length).toBeLessThan(200_000);
    // Every chunk's CRC is right, and the pixels inflate to 800 rows of a filter byte and 1280 RGB pixels.
    const types: string[] = [];
    const idat: Buffer[] = [];
    for (let p = 8; p < png.length;) {
      const length = png.readUInt32BE(p);
      const type = png.toString('latin1', p + 4, p + 8);
      expect(png.readUInt32BE(p + 8 + length)).toBe(crc32(png.subarray(p + 4, p + 8 + length)));
      if (type === 'IDAT') idat.push(png.subarray(p + 8, p + 8 + length));
      types.push(type);
      p += 12 + length;
    }
    expect(types).toEqual(['IHDR', 'IDAT', 'IEND']);
    expect(png.subarray(24, 29)).toEqual(Buffer.from([8, 2, 0, 0, 0]));
    const raw = inflateSync(Buffer.concat(idat));
    expect(raw.length).toBe(800 * (1 + 1280 * 3));
    expect(pngScreenshot(1280, 800, 1).equals(png)).toBe(true);
    expect(pngScreenshot(1280, 800, 2).equals(png)).toBe(false);
    expect(imageSize(pngScreenshot(1300, 876, 3))).toEqual({ width: 1300, height: 876 });
  });

  it('imageSize reads JPEG frame headers (baseline and progressive) and refuses other bytes', () => {
    expect(imageSize(jpegHead(1300, 876, 0xc0))).toEqual({ width: 1300, height: 876 });
    expect(imageSize(jpegHead(640, 480, 0xc2))).toEqual({ width: 640, height: 480 });
    expect(() => imageSize(Buffer.from('GIF89a......'))).toThrow(/not a PNG or JPEG/);
    expect(dataUrl(Buffer.from([1, 2, 3]))).toBe('data:image/png;base64,AQID');
  });
});

describe('the Qwen2.5-VL chat route', () => {
  let server: QwenVlServer;
  afterEach(() => server?.close());

  it('expands the images in text order, each pad run between vision_start and vision_end', async () => {
    server = await startQwenVlServer();
    const messages = [
      {
        role: 'user',
        content: [{ type: 'text', text: 'Compare these.' }, screenshot(1280, 800, 1), { type: 'text', text: 'and' }, screenshot(1260, 798, 2)],
      },
    ];
    const a = await chat(server, { messages, logprobs: true });
    const rendered = renderVlChat(messages);
    expect(rendered.text).toBe(
      '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' +
        '<|im_start|>user\nCompare these.<|vision_start|><|image_pad|><|vision_end|>and<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n' +
        '<|im_start|>assistant\n',
    );
    const ids = a.prompt_token_ids;
    expect(padRuns(ids).map((r) => r.pads)).toEqual([1334, 1260]);
    expect(collapsePads(ids)).toEqual(encode(rendered.text));
    expect(server.images).toEqual([
      [
        { index: 0, width: 1280, height: 800, pads: 1334, offset: padRuns(ids)[0].offset, source: 'data' },
        { index: 1, width: 1260, height: 798, pads: 1260, offset: padRuns(ids)[1].offset, source: 'data' },
      ],
    ]);
    expect(a.usage.prompt_tokens).toBe(ids.length);
    const c = a.choices[0];
    expect(c.message).toEqual({ role: 'assistant', content: 'I see 2 image(s).', reasoning_content: null, tool_calls: [] });
    expect(c.finish_reason).toBe('stop');
    expect(c.token_ids).toEqual([...encode('I see 2 image(s).'), IM_END]);
    expect(c.logprobs!.content.map((l) => l.logprob)).toEqual(c.token_ids.map((t) => 0 - (t % 7) / 10));
    expect(a.usage.completion_tokens).toBe(c.token_ids.length);
  });

  it('gives the same ids streamed and not, in vLLM chunks', async () => {
    server = await startQwenVlServer();
    const messages = [
      { role: 'system', content: 'You operate a computer.' },
      { role: 'user', content: [screenshot(1300, 876, 3), { type: 'text', text: 'Open the menu.' }] },
    ];
    for (const tools of [undefined, CLICK_TOOLS]) {
      const whole = await chat(server, { messages, tools, logprobs: true });
      const raw = await events(server, { messages, tools, logprobs: true, stream_options: { include_usage: true } });
      expect(raw.at(-1)).toBe('[DONE]');
      const chunks = raw.slice(0, -1).map((e) => JSON.parse(e) as Record<string, unknown> & { choices: Record<string, unknown>[] });
      expect(chunks[0].prompt_token_ids).toEqual(whole.prompt_token_ids);
      expect(padRuns(whole.prompt_token_ids).map((r) => r.pads)).toEqual([1426]);
      expect(chunks[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
      const deltas = chunks.slice(1).filter((c) => c.choices.length > 0);
      expect(deltas.flatMap((c) => c.choices[0].token_ids as number[])).toEqual(whole.choices[0].token_ids);
      expect(deltas.flatMap((c) => (c.choices[0].logprobs as ChatAnswer['choices'][0]['logprobs'])!.content)).toEqual(whole.choices[0].logprobs!.content);
      const finish = deltas.at(-1)!.choices[0];
      expect(finish).toMatchObject({ delta: {}, finish_reason: whole.choices[0].finish_reason, token_ids: [IM_END] });
      expect(chunks.at(-1)).toMatchObject({ choices: [], usage: whole.usage });
      if (tools) {
        expect(whole.choices[0].message.content).toBeNull();
        expect(whole.choices[0].message.tool_calls[0].function).toEqual({ name: 'click', arguments: '{"x": 110, "y": 205}' });
        expect(deltas[0].choices[0].delta).toMatchObject({
          tool_calls: [{ index: 0, type: 'function', function: { name: 'click', arguments: '{"x": 110, "y": 205}' } }],
        });
      } else expect(deltas[0].choices[0].delta).toEqual({ content: 'I see 1 image(s).' });
    }
  });

  it('the pads option changes what an image expands to, down to no pads at all', async () => {
    server = await startQwenVlServer({ pads: (i, n) => (i === 0 ? n + 2 : i === 1 ? 0 : n) });
    const messages = [{ role: 'user', content: [screenshot(1280, 800, 1), screenshot(1280, 800, 2), screenshot(1260, 798, 3)] }];
    const a = await chat(server, { messages });
    expect(padRuns(a.prompt_token_ids).map((r) => r.pads)).toEqual([1336, 0, 1260]);
    expect(server.images[0].map((i) => i.pads)).toEqual([1336, 0, 1260]);
    expect(a.choices[0].message.content).toBe('I see 3 image(s).');
  });

  it('takes http(s) image URLs without fetching them: sizes from urlSizes, else 1280×800', async () => {
    server = await startQwenVlServer({ urlSizes: { 'https://example.test/b.png': { width: 1300, height: 876 } } });
    const messages = [
      {
        role: 'user',
        content: [
          { type: 'image_url', image_url: { url: 'https://example.test/a.png' } },
          { type: 'image_url', image_url: { url: 'https://example.test/b.png' } },
        ],
      },
    ];
    const a = await chat(server, { messages });
    expect(padRuns(a.prompt_token_ids).map((r) => r.pads)).toEqual([1334, 1426]);
    expect(server.urls).toEqual(['https://example.test/a.png', 'https://example.test/b.png']);
    expect(server.images[0].map((i) => [i.source, i.url, i.width, i.height])).toEqual([
      ['url', 'https://example.test/a.png', 1280, 800],
      ['url', 'https://example.test/b.png', 1300, 876],
    ]);
  });

  it('a screenshot agent on the openai SDK: clicks, tool results with screenshots, each prompt continuing the last', async () => {
    server = await startQwenVlServer({ clicks: 3 });
    const client = new OpenAI({ baseURL: server.url, apiKey: 'sk-test', maxRetries: 0 });
    const messages: ChatMessage[] = [
      { role: 'system', content: 'You operate a computer by clicking.' },
      { role: 'user', content: [{ type: 'text', text: 'Open the settings.' }, screenshot(1280, 800, 1)] },
    ];
    const clicks: unknown[] = [];
    const prompts: number[][] = [];
    const sampled: number[][] = [];
    let answer: string | null = null;
    for (let turn = 0; turn < 6 && answer === null; turn++) {
      const body = { model: 'Qwen/Qwen2.5-VL-7B-Instruct', messages: messages as never, tools: CLICK_TOOLS, return_token_ids: true } as never;
      let message: { content: string | null; tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[] };
      if (turn !== 1) {
        const r = (await client.chat.completions.create(body)) as unknown as ChatAnswer;
        prompts.push(r.prompt_token_ids);
        sampled.push(r.choices[0].token_ids);
        message = r.choices[0].message;
      } else {
        // One turn streamed through the SDK, its deltas put back together.
        const s = await client.chat.completions.create({ ...(body as object), stream: true } as never);
        message = { content: null, tool_calls: [] };
        const ids: number[] = [];
        for await (const chunk of s as unknown as AsyncIterable<Record<string, unknown> & { choices: Record<string, unknown>[] }>) {
          if (Array.isArray(chunk.prompt_token_ids)) prompts.push(chunk.prompt_token_ids as number[]);
          const c = chunk.choices[0];
          if (!c) continue;
          ids.push(...((c.token_ids as number[] | undefined) ?? []));
          const d = c.delta as { content?: string; tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[] };
          if (d.content) message.content = (message.content ?? '') + d.content;
          if (d.tool_calls) message.tool_calls!.push(...d.tool_calls.map((t) => ({ id: t.id, type: t.type, function: t.function })));
        }
        sampled.push(ids);
      }
      const calls = message.tool_calls ?? [];
      if (calls.length === 0) {
        answer = message.content;
        break;
      }
      messages.push({ role: 'assistant', content: message.content, tool_calls: calls });
      for (const call of calls) {
        clicks.push(JSON.parse(call.function.arguments));
        messages.push({
          role: 'tool',
          tool_call_id: call.id,
          content: [{ type: 'text', text: `clicked ${call.function.arguments}` }, screenshot(1280, 800, 10 + clicks.length)],
        });
      }
    }
    expect(clicks).toEqual([
      { x: 110, y: 205 },
      { x: 120, y: 210 },
      { x: 130, y: 215 },
    ]);
    expect(answer).toBe('Done after 4 screenshots.');
    expect(server.images.map((imgs) => imgs.length)).toEqual([1, 2, 3, 4]);
    // What the model sampled is what the next prompt re-renders: each prompt continues the last one.
    for (let i = 1; i < prompts.length; i++)
      expect(prompts[i].slice(0, prompts[i - 1].length + sampled[i - 1].length)).toEqual([...prompts[i - 1], ...sampled[i - 1]]);
    const last = decodeVl(prompts[3]);
    expect(last).toContain(
      '<|im_start|>assistant\n<tool_call>\n{"name": "click", "arguments": {"x": 110, "y": 205}}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\n<tool_response>\nclicked {"x": 110, "y": 205}<|vision_start|><|image_pad|><|vision_end|>\n</tool_response><|im_end|>\n',
    );
    expect(last).toMatch(
      /^<\|im_start\|>system\nYou operate a computer by clicking\.\n\n# Tools\n[\s\S]*"name": "click"[\s\S]*<\/tool_call><\|im_end\|>\n<\|im_start\|>user\n/,
    );
    expect(padRuns(prompts[3]).map((r) => r.pads)).toEqual([1334, 1334, 1334, 1334]);
  });

  it('answers the model listing and version as vLLM, 404 elsewhere, 400 on bad JSON and bad images', async () => {
    server = await startQwenVlServer();
    const models = await (await fetch(`${server.url}/models`)).json();
    expect(models).toEqual({ object: 'list', data: [{ id: 'Qwen/Qwen2.5-VL-7B-Instruct', object: 'model', owned_by: 'vllm', max_model_len: 128000 }] });
    expect(await (await fetch(`http://127.0.0.1:${server.port}/version`)).json()).toEqual({ version: '0.11.0' });
    expect((await fetch(`http://127.0.0.1:${server.port}/tokenize`, { method: 'POST', body: '{}' })).status).toBe(404);
    const bad = await fetch(`${server.url}/chat/completions`, { method: 'POST', body: '{"messages": [' });
    expect(bad.status).toBe(400);
    const post = (content: unknown) =>
      fetch(`${server.url}/chat/completions`, { method: 'POST', body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] }) });
    const narrow = await post([screenshot(20, 600, 1)]);
    expect(narrow.status).toBe(400);
    expect(await narrow.json()).toMatchObject({ object: 'error', code: 400, message: expect.stringMatching(/must be larger than factor:28/) });
    expect((await post([{ type: 'image_url', image_url: { url: 'file:///etc/hostname' } }])).status).toBe(400);
    expect((await post([{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }])).status).toBe(400);
    expect(server.images).toEqual([]);
  });
});

/** A POST to the stand-in's root (not under `/v1`), its status and JSON or SSE `data:` payloads. */
async function post(server: QwenVlServer, path: string, body: Record<string, unknown>): Promise<{ status: number; json: unknown; events: string[] }> {
  const r = await fetch(`http://127.0.0.1:${server.port}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  if (r.headers.get('content-type')?.startsWith('text/event-stream'))
    return {
      status: r.status,
      json: null,
      events: text
        .split('\n\n')
        .filter((e) => e.startsWith('data: '))
        .map((e) => e.slice(6)),
    };
  return { status: r.status, json: JSON.parse(text), events: [] };
}

interface GenerateAnswer {
  request_id: string;
  output_mode: string;
  model: string;
  prompt_token_ids?: number[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  choices: {
    index: number;
    finish_reason: string | null;
    token_ids: number[];
    text?: string;
    logprobs: { content: { token_id: number; logprob: number; rank: number; top_logprobs: { token_id: number; logprob: number; rank: number }[] }[] } | null;
  }[];
}

/** What vLLM's hermes parser (the sidecar's) reads out of a sampled text: content ('' is none) and calls. */
function hermes(text: string): { content: string | null; calls: { name: string; arguments: string }[] } {
  const p = new HermesToolParser();
  const a = p.push(text);
  const b = p.end();
  const content = a.content + b.content;
  return { content: content === '' ? null : content, calls: [...a.calls, ...b.calls] };
}

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

describe('the Qwen2.5-VL token-in routes (tokenIn)', () => {
  let server: QwenVlServer;
  afterEach(() => server?.close());

  const MODEL_ID = 'Qwen/Qwen2.5-VL-7B-Instruct';
  const pngs = [pngScreenshot(1280, 800, 1), pngScreenshot(1260, 798, 2)];
  const twoImages = [
    { role: 'system', content: 'You operate a computer.' },
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Compare these.' },
        { type: 'image_url', image_url: { url: dataUrl(pngs[0]) } },
        { type: 'image_url', image_url: { url: dataUrl(pngs[1]) } },
      ],
    },
  ];
  const render = async (body: Record<string, unknown>): Promise<VlRender> => {
    const r = await post(server, '/v1/chat/completions/render', { model: MODEL_ID, ...body });
    expect(r.status).toBe(200);
    return r.json as VlRender;
  };
  /** The GenerateRequest a client sends for a render: its ids and features, with what it asks on top. */
  const generateBody = (r: VlRender, extra: Record<string, unknown> = {}, params: Record<string, unknown> = {}) => ({
    model: r.model,
    token_ids: r.token_ids,
    features: r.features,
    sampling_params: { ...r.sampling_params, ...params },
    ...extra,
  });

  it("render gives the chat route's prompt ids and the images' features as one GenerateRequest", async () => {
    server = await startQwenVlServer({ tokenIn: true });
    const a = await chat(server, { messages: twoImages, tools: CLICK_TOOLS });
    const r = await render({ messages: twoImages, tools: CLICK_TOOLS, max_tokens: 64, chat_template_kwargs: { enable_thinking: false } });
    expect(r.token_ids).toEqual(a.prompt_token_ids);
    expect(r.request_id).toMatch(/^chatcmpl-[0-9a-f]+$/);
    expect(r).toMatchObject({ sampling_params: { max_tokens: 64 }, model: MODEL_ID, stream: false });
    const runs = padRuns(r.token_ids);
    expect(runs.map((x) => x.pads)).toEqual([1334, 1260]);
    const hashes = pngs.map(sha256);
    expect(r.features).toEqual({
      mm_hashes: { image: hashes },
      mm_placeholders: { image: runs.map((x) => ({ offset: x.offset, length: x.pads })) },
      kwargs_data: { image: hashes.map((h) => Buffer.from(`kw:${h}`).toString('base64')) },
    });
    // Placeholders cover the pads only: the vision markers sit just outside each.
    for (const p of r.features!.mm_placeholders.image) {
      expect(r.token_ids[p.offset - 1]).toBe(VISION_START);
      expect(r.token_ids[p.offset + p.length]).toBe(VISION_END);
    }
    // Renders are recorded in `images` as chat requests are.
    expect(server.images).toHaveLength(2);
    expect(server.images[1]).toEqual(server.images[0]);

    // No images: features null; no max_tokens: null; add_generation_prompt false: no assistant header.
    const text = [{ role: 'user', content: 'Hello.' }];
    const plain = await render({ messages: text });
    expect(plain).toMatchObject({ features: null, sampling_params: { max_tokens: null } });
    expect(plain.token_ids).toEqual((await chat(server, { messages: text })).prompt_token_ids);
    const open = await render({ messages: text, add_generation_prompt: false });
    expect(open.token_ids).toEqual(encode(renderVlChat(text as ChatMessage[], undefined, false).text));
    expect(plain.token_ids.slice(0, open.token_ids.length)).toEqual(open.token_ids);
    expect(decode(plain.token_ids.slice(open.token_ids.length), false)).toBe('<|im_start|>assistant\n');
  });

  it("generate on the render's ids and features samples the chat route's ids, whole, as text and streamed", async () => {
    server = await startQwenVlServer({ tokenIn: true });
    for (const tools of [undefined, CLICK_TOOLS]) {
      server.generated.length = 0;
      const a = await chat(server, { messages: twoImages, tools, logprobs: true });
      const r = await render({ messages: twoImages, tools, max_tokens: 256 });
      const wanted = a.choices[0].token_ids;

      const whole = await post(server, '/inference/v1/generate', generateBody(r, { return_token_ids: true }, { logprobs: 1 }));
      expect(whole.status).toBe(200);
      const g = whole.json as GenerateAnswer;
      expect(g.request_id).toMatch(/^generate-tokens-[0-9a-f]+$/);
      expect(g).toMatchObject({ output_mode: 'tokens', model: MODEL_ID, prompt_token_ids: r.token_ids, usage: a.usage });
      expect(g.choices).toHaveLength(1);
      expect(g.choices[0]).toMatchObject({ index: 0, finish_reason: 'stop', token_ids: wanted });
      expect(g.choices[0].token_ids.at(-1)).toBe(IM_END);
      expect(g.choices[0]).not.toHaveProperty('text');
      expect(g.choices[0].logprobs!.content).toEqual(
        wanted.map((t) => ({ token_id: t, logprob: 0 - (t % 7) / 10, rank: 1, top_logprobs: [{ token_id: t, logprob: 0 - (t % 7) / 10, rank: 1 }] })),
      );
      expect(g.choices[0].logprobs!.content.map((l) => l.logprob)).toEqual(a.choices[0].logprobs!.content.map((l) => l.logprob));

      // Text mode: the answer without special tokens, from which the hermes parser reads the chat route's message.
      const t = (await post(server, '/inference/v1/generate', generateBody(r, { output_mode: 'text' }))).json as GenerateAnswer;
      expect(t.output_mode).toBe('text');
      expect(t).not.toHaveProperty('prompt_token_ids');
      expect(t.choices[0]).toMatchObject({ token_ids: wanted, logprobs: null, text: decode(wanted, true) });
      const parsed = hermes(t.choices[0].text!);
      const m = a.choices[0].message;
      expect(parsed.content).toBe(m.content);
      expect(parsed.calls).toEqual(m.tool_calls.map((c) => c.function));
      if (tools) expect(t.choices[0].text).toBe('<tool_call>\n{"name": "click", "arguments": {"x": 120, "y": 210}}\n</tool_call>');
      else expect(t.choices[0].text).toBe('I see 2 image(s).');

      // Streamed: deltas, the prompt's ids on the first, <|im_end|> and the finish reason on the last, then usage.
      const s = await post(
        server,
        '/inference/v1/generate',
        generateBody(r, { stream: true, stream_options: { include_usage: true }, return_token_ids: true, output_mode: 'text' }, { logprobs: 1 }),
      );
      expect(s.status).toBe(200);
      expect(s.events.at(-1)).toBe('[DONE]');
      const chunks = s.events.slice(0, -1).map((e) => JSON.parse(e) as GenerateAnswer);
      const deltas = chunks.filter((c) => c.choices.length > 0);
      expect(new Set(chunks.map((c) => c.request_id)).size).toBe(1);
      expect(chunks[0].prompt_token_ids).toEqual(r.token_ids);
      expect(chunks.slice(1).every((c) => c.prompt_token_ids === undefined)).toBe(true);
      expect(deltas.flatMap((c) => c.choices[0].token_ids)).toEqual(wanted);
      expect(deltas.flatMap((c) => c.choices[0].logprobs!.content)).toEqual(g.choices[0].logprobs!.content);
      expect(deltas.map((c) => c.choices[0].text).join('')).toBe(t.choices[0].text);
      expect(deltas.slice(0, -1).every((c) => c.choices[0].finish_reason === null)).toBe(true);
      expect(deltas.at(-1)!.choices[0]).toMatchObject({ finish_reason: 'stop', token_ids: [IM_END], text: '' });
      expect(chunks.at(-1)).toMatchObject({ choices: [], usage: a.usage });

      const placeholders = r.features!.mm_placeholders.image;
      expect(server.generated).toEqual([0, 1, 2].map(() => ({ promptIds: r.token_ids, placeholders, error: null })));
    }
  });

  it('answers the one-token probe without features as vLLM, and records it nowhere but requests', async () => {
    server = await startQwenVlServer({ tokenIn: true });
    const probe = { model: MODEL_ID, token_ids: [9707], sampling_params: { max_tokens: 1 } };
    const choices = [{ index: 0, token_ids: [13], text: decode([13], true), finish_reason: 'length', logprobs: null }];
    expect(await post(server, '/inference/v1/generate', probe)).toMatchObject({
      status: 200,
      json: { request_id: 'generate-tokens-probe', output_mode: 'tokens', choices },
    });
    expect((await post(server, '/inference/v1/generate', { ...probe, output_mode: 'text' })).json).toEqual({
      request_id: 'generate-tokens-probe',
      output_mode: 'text',
      choices,
    });
    expect(server.generated).toEqual([]);
    expect(server.requests.map((r) => r.path)).toEqual(['/inference/v1/generate', '/inference/v1/generate']);
    // No token ids: FastAPI's validation error.
    expect((await post(server, '/inference/v1/generate', { model: MODEL_ID, sampling_params: { max_tokens: 1 } })).status).toBe(422);
  });

  it("refuses, with vLLM's 400, ids whose pad runs the features do not list exactly", async () => {
    server = await startQwenVlServer({ tokenIn: true });
    const r = await render({ messages: twoImages });
    const f = r.features!;
    const [p0, p1] = f.mm_placeholders.image;
    const text = await render({ messages: [{ role: 'user', content: 'Hello.' }] });
    const cases: [string, Record<string, unknown>, RegExp][] = [
      ['runs without features', { ...generateBody(r), features: undefined }, /2 image placeholder run\(s\) of token 151655 but no features/],
      ['runs with features null', { ...generateBody(r), features: null }, /but no features/],
      ['features without runs', { ...generateBody(r), token_ids: text.token_ids }, /features list 2 image placeholder\(s\) but the prompt has no image tokens/],
      [
        'offsets shifted by one',
        generateBody({
          ...r,
          features: {
            ...f,
            mm_placeholders: {
              image: [
                { ...p0, offset: p0.offset + 1 },
                { ...p1, offset: p1.offset + 1 },
              ],
            },
          },
        }),
        new RegExp(`image 0: features place it at offset ${p0.offset + 1}, length 1334, but the prompt's pad run is at offset ${p0.offset}, length 1334`),
      ],
      [
        'a length off by one',
        generateBody({ ...r, features: { ...f, mm_placeholders: { image: [p0, { ...p1, length: p1.length - 1 }] } } }),
        new RegExp(`image 1: features place it at offset ${p1.offset}, length 1259, but the prompt's pad run is at offset ${p1.offset}, length 1260`),
      ],
      [
        'one placeholder fewer than runs',
        generateBody({
          ...r,
          features: { mm_hashes: { image: [f.mm_hashes.image[0]] }, mm_placeholders: { image: [p0] }, kwargs_data: { image: [f.kwargs_data.image[0]] } },
        }),
        /features list 1 image placeholder\(s\) for the prompt's 2 image placeholder run\(s\)/,
      ],
      [
        'one hash fewer than placeholders',
        generateBody({ ...r, features: { ...f, mm_hashes: { image: [f.mm_hashes.image[0]] } } }),
        /features.mm_hashes.image has 1 entries for 2 images/,
      ],
      [
        'one processor output more than placeholders',
        generateBody({ ...r, features: { ...f, kwargs_data: { image: [...f.kwargs_data.image, 'a3c6'] } } }),
        /features.kwargs_data.image has 3 entries for 2 images/,
      ],
      [
        'a pad run cut short in the ids',
        { ...generateBody(r), token_ids: [...r.token_ids.slice(0, p1.offset), ...r.token_ids.slice(p1.offset + 1)] },
        /image 1: features place it at offset \d+, length 1260, but the prompt's pad run is at offset \d+, length 1259/,
      ],
      ['features not an object', { ...generateBody(r), features: [1] }, /features must be an object/],
    ];
    for (const [name, body, message] of cases) {
      const a = await post(server, '/inference/v1/generate', body);
      expect([name, a.status]).toEqual([name, 400]);
      expect(a.json).toEqual({ object: 'error', message: expect.stringMatching(message), type: 'BadRequestError', code: 400 });
    }
    expect(server.generated).toHaveLength(cases.length);
    expect(server.generated.every((g) => g.error !== null)).toBe(true);
    expect(server.generated[0]).toMatchObject({ promptIds: r.token_ids, placeholders: null });
    expect(server.generated[3].placeholders).toEqual([
      { offset: p0.offset + 1, length: 1334 },
      { offset: p1.offset + 1, length: 1260 },
    ]);
    // The right features still go through; a text prompt goes through without features, or with empty ones.
    expect((await post(server, '/inference/v1/generate', generateBody(r))).status).toBe(200);
    expect((await post(server, '/inference/v1/generate', generateBody(text))).status).toBe(200);
    const empty = { mm_hashes: { image: [] }, mm_placeholders: { image: [] }, kwargs_data: { image: [] } };
    expect((await post(server, '/inference/v1/generate', { ...generateBody(text), features: empty })).status).toBe(200);
    expect(server.generated.slice(cases.length).map((g) => g.error)).toEqual([null, null, null]);
  });

  it('answers 404 on both routes without tokenIn, as a plain vllm serve', async () => {
    server = await startQwenVlServer();
    const r = await post(server, '/v1/chat/completions/render', { model: MODEL_ID, messages: twoImages });
    expect(r).toMatchObject({ status: 404, json: { detail: 'Not Found' } });
    const g = await post(server, '/inference/v1/generate', { model: MODEL_ID, token_ids: [9707], sampling_params: { max_tokens: 1 } });
    expect(g).toMatchObject({ status: 404, json: { detail: 'Not Found' } });
    expect(server.images).toEqual([]);
    expect(server.generated).toEqual([]);
  });

  it("a screenshot agent on render + generate: each turn's render begins with the last render and what was sampled", async () => {
    server = await startQwenVlServer({ tokenIn: true, clicks: 3 });
    const messages: ChatMessage[] = [
      { role: 'system', content: 'You operate a computer by clicking.' },
      { role: 'user', content: [{ type: 'text', text: 'Open the settings.' }, screenshot(1280, 800, 1)] },
    ];
    const renders: VlRender[] = [];
    const sampled: number[][] = [];
    let answer: string | null = null;
    for (let turn = 0; turn < 6 && answer === null; turn++) {
      const r = await render({ messages, tools: CLICK_TOOLS });
      // Every other turn streamed, its deltas put back together.
      const streamed = turn % 2 === 1;
      const g = await post(server, '/inference/v1/generate', generateBody(r, { output_mode: 'text', ...(streamed ? { stream: true } : {}) }));
      expect(g.status).toBe(200);
      const choices = streamed ? g.events.slice(0, -1).map((e) => (JSON.parse(e) as GenerateAnswer).choices[0]) : (g.json as GenerateAnswer).choices;
      const ids = choices.flatMap((c) => c.token_ids);
      const text = choices.map((c) => c.text).join('');
      // What the chat route answers for the same conversation is what the sidecar rebuilds.
      const a = await chat(server, { messages, tools: CLICK_TOOLS });
      expect(a.prompt_token_ids).toEqual(r.token_ids);
      expect(ids).toEqual(a.choices[0].token_ids);
      const parsed = hermes(text);
      expect(parsed.content).toBe(a.choices[0].message.content);
      expect(parsed.calls).toEqual(a.choices[0].message.tool_calls.map((c) => c.function));
      renders.push(r);
      sampled.push(ids);
      if (parsed.calls.length === 0) {
        answer = parsed.content;
        break;
      }
      const calls = parsed.calls.map((c, i) => ({ id: `call-${turn}-${i}`, type: 'function' as const, function: c }));
      messages.push({ role: 'assistant', content: parsed.content, tool_calls: calls });
      for (const call of calls)
        messages.push({
          role: 'tool',
          tool_call_id: call.id,
          content: [{ type: 'text', text: `clicked ${call.function.arguments}` }, screenshot(1280, 800, 10 + turn)],
        });
    }
    expect(answer).toBe('Done after 4 screenshots.');
    expect(renders).toHaveLength(4);
    expect(sampled.slice(0, 3).map((ids) => decode(ids, true))).toEqual([
      '<tool_call>\n{"name": "click", "arguments": {"x": 110, "y": 205}}\n</tool_call>',
      '<tool_call>\n{"name": "click", "arguments": {"x": 120, "y": 210}}\n</tool_call>',
      '<tool_call>\n{"name": "click", "arguments": {"x": 130, "y": 215}}\n</tool_call>',
    ]);
    for (let i = 1; i < renders.length; i++) {
      const before = [...renders[i - 1].token_ids, ...sampled[i - 1]];
      expect(renders[i].token_ids.slice(0, before.length)).toEqual(before);
      // The earlier images keep their places and hashes; one new screenshot comes after them.
      const [prev, next] = [renders[i - 1].features!, renders[i].features!];
      expect(next.mm_placeholders.image.slice(0, -1)).toEqual(prev.mm_placeholders.image);
      expect(next.mm_hashes.image.slice(0, -1)).toEqual(prev.mm_hashes.image);
      expect(next.mm_placeholders.image.at(-1)!.offset).toBeGreaterThan(before.length);
      expect(next.mm_hashes.image.at(-1)).toBe(sha256(pngScreenshot(1280, 800, 10 + i - 1)));
    }
    expect(renders.map((r) => r.features!.mm_placeholders.image.length)).toEqual([1, 2, 3, 4]);
    expect(server.generated.map((g) => [g.promptIds, g.placeholders, g.error])).toEqual(
      renders.map((r) => [r.token_ids, r.features!.mm_placeholders.image, null]),
    );
  });
});
