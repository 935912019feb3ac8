import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

/**
 * No function in src/ is longer than 200 lines: a function that long is several named parts
 * waiting to be found (docs/architecture.md). Counted from its first line to its last, the
 * functions nested in it included.
 */
const MAX_LINES = 200;
const SRC = path.join(__dirname, '../../src');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = path.join(dir, f);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** Every function-like node of a file longer than `max` lines, as `file:line name (N lines)`. */
export function longFunctions(file: string, text: string, max: number): string[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.ES2022, true);
  const found: string[] = [];
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body) {
      const first = source.getLineAndCharacterOfPosition(node.getStart(source)).line;
      const last = source.getLineAndCharacterOfPosition(node.getEnd()).line;
      const lines = last - first + 1;
      if (lines > max) {
        const named = node.name ?? (ts.isVariableDeclaration(node.parent) ? node.parent.name : undefined);
        const name = named && ts.isIdentifier(named) ? named.text : '(anonymous)';
        found.push(`${path.relative(SRC, file)}:${first + 1} ${name} (${lines} lines)`);
      }
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

describe('function length', () => {
  it(`no function in src/ is over ${MAX_LINES} lines`, () => {
    const long = files(SRC).flatMap((f) => longFunctions(f, readFileSync(f, 'utf8'), MAX_LINES));
    expect(long).toEqual([]);
  });

  it('finds a long function, nested or not (the check can fail)', () => {
    const body = Array.from({ length: 12 }, (_, i) => `  const v${i} = ${i};`).join('\n');
    const text = `export function outer() {\n  const inner = () => {\n${body}\n  };\n  return inner;\n}\n`;
    expect(longFunctions(path.join(SRC, 'x.ts'), text, 10)).toEqual(['x.ts:1 outer (17 lines)', 'x.ts:2 inner (14 lines)']);
  });
});
