import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { FACTOR, IMAGE_PAD, MAX_PIXELS, MIN_PIXELS, VISION_END, VISION_START, startQwenVlServer, type QwenVlServer } from '../support/qwen-vl-server';
import { openaiAgent, SCREENS } from '../support/screenshot-agent';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';
import { requirementsMet } from './requirements';

/**
 * A trainer's side of images, end to end: a screenshot agent runs through a real sidecar in front
 * of the Qwen-VL stand-in, and a Python script with the trainer client (clients/python) reads the
 * file exporter's trajectory and the image store, and rebuilds the model input from them alone:
 * each image's bytes in order, byte-identical to what the agent sent, sitting between the vision
 * start and end tokens with as many pads as its own `smart_resize` (written in the script, not
 * taken from the sidecar or the stand-in) gives the PNG's size.
 */

const ROOT = path.join(__dirname, '../..');
const PYTHON = '/usr/bin/python3';
const THIS = 'test/python/images.test.ts';

/**
 * The rebuild. argv: the sidecar's data dir, a folder holding the agent's screenshots
 * (screen-<k>.png, in the order it sent them), the resize settings as JSON. Prints one JSON verdict.
 */
const REBUILD = String.raw`
import hashlib, json, math, struct, sys
from pathlib import Path
from lightning_sidecar_client import FileImages, check_image_spans, iter_trajectories, trajectory_images

data_dir, screens_dir, settings = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
VISION_START, VISION_END = settings['vision_start'], settings['vision_end']


def smart_resize(height, width, factor, min_pixels, max_pixels):
    # The Qwen2-VL image processor's resize, height first, with Python's round (half to even).
    if min(height, width) < factor or max(height, width) / min(height, width) > 200:
        raise ValueError(f'the processor refuses a {width}x{height} image')
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = math.floor(height / beta / factor) * factor
        w = math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def png_size(data):
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and data[12:16] == b'IHDR', 'not a PNG'
    width, height = struct.unpack('>II', data[16:24])
    return width, height


trajectories = list(iter_trajectories(data_dir=data_dir))
assert len(trajectories) == 1, f'{len(trajectories)} trajectories'
t = trajectories[0]
ids, mask = t['token_ids'], t['loss_mask']
pad = t['image_processor']['image_token_id']
sent = [p.read_bytes() for p in sorted(screens_dir.glob('screen-*.png'))]
images = trajectory_images(t, FileImages(Path(data_dir) / 'images'))
spans = check_image_spans(t)
checks = []
for k, image in enumerate(images):
    start, length, data = image['start'], image['length'], image['data']
    width, height = png_size(data)
    h, w = smart_resize(height, width, settings['factor'], settings['min_pixels'], settings['max_pixels'])
    expected = (h // settings['factor']) * (w // settings['factor'])
    checks.append({
        'order': image['order'],
        'bytes_as_sent': k < len(sent) and data == sent[k],
        'sha256': hashlib.sha256(data).hexdigest() == image['sha256'],
        'size': [width, height] == [image['width'], image['height']],
        'vision_start': ids[start - 1] == VISION_START,
        'vision_end': ids[start + length] == VISION_END,
        'all_pads': all(x == pad for x in ids[start:start + length]),
        'not_trained': all(m == 0 for m in mask[start:start + length]),
        'length': length,
        'smart_resize_pads': expected,
        'image_grid_thw': [1, h // 14, w // 14],
    })
# The model input: the ids as they are, and the images in order, one per run of pads.
rebuilt = {
    'input_ids': len(ids),
    'images': len(images),
    'pads_in_ids': sum(1 for x in ids if x == pad),
    'pads_of_images': sum(c['smart_resize_pads'] for c in checks),
    'vision_starts': sum(1 for x in ids if x == VISION_START),
    'spans': [list(s) for s in spans],
}
ok = (len(images) == len(sent) and rebuilt['pads_in_ids'] == rebuilt['pads_of_images'] and rebuilt['vision_starts'] == len(images)
      and all(all(v for key, v in c.items() if isinstance(v, bool)) and c['length'] == c['smart_resize_pads'] for c in checks))
print(json.dumps({'ok': ok, 'pad': pad, 'images_complete': t['images_complete'], 'rebuilt': rebuilt, 'checks': checks}))
`;

interface Verdict {
  ok: boolean;
  pad: number;
  images_complete: boolean;
  rebuilt: { input_ids: number; images: number; pads_in_ids: number; pads_of_images: number; vision_starts: number; spans: number[][] };
  checks: {
    order: number;
    bytes_as_sent: boolean;
    sha256: boolean;
    size: boolean;
    vision_start: boolean;
    vision_end: boolean;
    all_pads: boolean;
    not_trained: boolean;
    length: number;
    smart_resize_pads: number;
    image_grid_thw: number[];
  }[];
}

const missing = existsSync(PYTHON) ? null : `${PYTHON} is not installed (Debian: python3)`;

if (requirementsMet(THIS, missing, 'the Python client rebuilds a screenshot trajectory')) {
  describe('the Python client rebuilds a screenshot trajectory', () => {
    let server: QwenVlServer | undefined;
    let sidecar: TestSidecar | undefined;
    const screensDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-screens-'));
    afterAll(async () => {
      await sidecar?.stop();
      await server?.close();
      rmSync(screensDir, { recursive: true, force: true });
    });

    it('gets every image in order, byte-identical, each between its vision tokens with the pads smart_resize gives', async () => {
      server = await startQwenVlServer();
      sidecar = await startSidecar(server.url, {
        receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
        processors: { images: { processor: { factor: FACTOR, min_pixels: MIN_PIXELS, max_pixels: MAX_PIXELS } } },
      });
      const rollout = 'screens-python';
      const answers = await openaiAgent(sidecar, rollout, false);
      expect(answers).toHaveLength(SCREENS.length);
      expect((await postReward(sidecar.origin, rollout, 1)).status).toBe(202);
      const deadline = Date.now() + 20_000;
      while (!sidecar.episodes().some((e) => e.rollout_id === rollout)) {
        if (Date.now() > deadline) throw new Error(`no episode for ${rollout}`);
        await new Promise((r) => setTimeout(r, 20));
      }
      // The agent's screenshots, as it sent them, for the script to compare byte for byte.
      SCREENS.forEach((png, k) => writeFileSync(path.join(screensDir, `screen-${k}.png`), png));
      const settings = { factor: FACTOR, min_pixels: MIN_PIXELS, max_pixels: MAX_PIXELS, vision_start: VISION_START, vision_end: VISION_END };
      const done = spawnSync(PYTHON, ['-c', REBUILD, sidecar.dataDir, screensDir, JSON.stringify(settings)], {
        cwd: ROOT,
        env: { PATH: process.env.PATH ?? '', PYTHONPATH: path.join(ROOT, 'clients/python'), PYTHONDONTWRITEBYTECODE: '1' },
        encoding: 'utf8',
        timeout: 30_000,
      });
      expect(done.stderr).toBe('');
      expect(done.status).toBe(0);
      const verdict = JSON.parse(done.stdout) as Verdict;
      expect(verdict.images_complete).toBe(true);
      expect(verdict.pad).toBe(IMAGE_PAD);
      expect(verdict.rebuilt.images).toBe(SCREENS.length);
      expect(verdict.rebuilt.vision_starts).toBe(SCREENS.length);
      // 1280×800 resizes to 1288×812: 46 × 29 = 1334 pads, a 1 × 58 × 92 patch grid.
      expect(verdict.checks.map((c) => [c.order, c.length, c.smart_resize_pads, c.image_grid_thw])).toEqual(
        SCREENS.map((_, k) => [k, 1334, 1334, [1, 58, 92]]),
      );
      for (const c of verdict.checks) {
        expect(c).toMatchObject({ bytes_as_sent: true, sha256: true, size: true, vision_start: true, vision_end: true, all_pads: true, not_trained: true });
      }
      expect(verdict.rebuilt.pads_in_ids).toBe(SCREENS.length * 1334);
      expect(verdict.rebuilt.spans.map(([, length]) => length)).toEqual(SCREENS.map(() => 1334));
      expect(verdict.ok).toBe(true);
    }, 60_000);
  });
}
