import { crc32, inflateSync } from 'node:zlib';
import OpenAI from 'openai';
import { encode, type ChatMessage } from '../../support/qwen3-server';
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
