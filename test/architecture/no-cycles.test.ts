import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';

/**
 * No import circle in src/: a module never reaches itself through its own imports. Type-only
 * imports count too: a type that two modules need from each other belongs in a third, lower one,
 * and a circle of types is the same knot to a reader (and becomes a runtime one with the first
 * value that follows the type). Re-exports (`export … from`) and dynamic `import()` count as well.
 */
const SRC = path.join(__dirname, '../../src');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = path.join(dir, f);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** The module file a relative specifier names (`./x` → x.ts or x/index.ts); null when none. */
function resolve(from: string, spec: string): string | null {
  const base = path.resolve(path.dirname(from), spec.replace(/\.js$/, ''));
  for (const candidate of [`${base}.ts`, path.join(base, 'index.ts'), base]) if (existsSync(candidate) && statSync(candidate).isFile()) return candidate;
  return null;
}

/** A relative module specifier after `from` or `import` (static, re-export, dynamic), as layers.test.ts reads them. */
const IMPORT = /(?:from|import)\s*\(?\s*['"](\.{1,2}\/[^'"]+)['"]/g;

function imports(file: string): string[] {
  // Comments are dropped first, so an import shown in a doc comment is not taken for one.
  return [...readFileSync(file, 'utf8').matchAll(IMPORT)].flatMap((m) => resolve(file, m[1]) ?? []);
}

/** Every circle, each once: the strongly connected components of more than one module (or a module importing itself). */
function circles(graph: Map<string, string[]>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    let w: string;
    do {
      w = stack.pop()!;
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1 || (graph.get(v) ?? []).includes(v)) found.push(component.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

const rel = (f: string) => path.relative(SRC, f);

describe('the imports of src/', () => {
  it('form no circle', () => {
    const graph = new Map(files(SRC).map((f) => [f, imports(f)]));
    expect(circles(graph).map((c) => c.map(rel).join(' ↔ '))).toEqual([]);
  });

  it('are read whole: every relative import names a module of src/', () => {
    const unresolved: string[] = [];
    for (const file of files(SRC)) {
      for (const m of readFileSync(file, 'utf8').matchAll(IMPORT)) if (resolve(file, m[1]) === null) unresolved.push(`${rel(file)}: ${m[1]}`);
    }
    expect(unresolved).toEqual([]);
  });

  it('catches a circle (the check itself)', () => {
    const graph = new Map([
      ['a', ['b']],
      ['b', ['c']],
      ['c', ['a']],
      ['d', ['a']],
      ['e', ['e']],
    ]);
    expect(circles(graph)).toEqual([['a', 'b', 'c'], ['e']]);
  });
});
