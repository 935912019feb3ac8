import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';

/**
 * The layering of src/ (docs/architecture.md): a module imports only from lower layers, or from
 * its own folder. The vocabulary is the ground floor; the stages know only what is below them;
 * the pipeline's parts (pipeline/: intake, replay, export queue, body writers) join journal,
 * processors and exporters above them; the wiring (service/) and the command line sit on top.
 */
const LAYERS: Record<string, number> = {
  model: 0,
  config: 1,
  formats: 1,
  security: 1,
  telemetry: 2,
  journal: 3,
  processors: 3,
  receivers: 3,
  exporters: 3,
  control: 3,
  trainer: 3,
  pipeline: 4,
  viewer: 4,
  service: 5,
  cli: 6,
  main: 7,
};

const SRC = path.join(__dirname, '../../src');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = path.join(dir, f);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** Top folder under src/ (`main` for src/main.ts). */
const folderOf = (file: string) => path.relative(SRC, file).split(path.sep)[0].replace(/\.ts$/, '');

function imports(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/(?:from|import)\s*\(?\s*['"](\.{1,2}\/[^'"]+)['"]/g)].map((m) => path.resolve(path.dirname(file), m[1]));
}

describe('the layers of src/', () => {
  const all = files(SRC);

  it('puts every folder of src/ in a layer', () => {
    expect([...new Set(all.map(folderOf))].filter((f) => !(f in LAYERS))).toEqual([]);
  });

  it('has no import from a lower layer up, nor between two stages', () => {
    const violations: string[] = [];
    for (const file of all) {
      const from = folderOf(file);
      for (const target of imports(file)) {
        const to = folderOf(target);
        if (to === from) continue;
        if (LAYERS[to] >= LAYERS[from])
          violations.push(`${path.relative(SRC, file)} (${from}, layer ${LAYERS[from]}) imports ${path.relative(SRC, target)} (${to}, layer ${LAYERS[to]})`);
      }
    }
    expect(violations).toEqual([]);
  });

  it('keeps the vocabulary free of anything of ours but itself', () => {
    const model = all.filter((f) => folderOf(f) === 'model');
    expect(model.length).toBeGreaterThan(0);
    for (const f of model) for (const t of imports(f)) expect(folderOf(t)).toBe('model');
  });
});
