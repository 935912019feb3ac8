import { builtinModules } from 'node:module';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import semver from 'semver';

const ROOT = path.join(__dirname, '../..');
const pkg = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string }; dependencies: Record<string, string> };
const lock = JSON.parse(readFileSync(path.join(ROOT, 'package-lock.json'), 'utf8')) as { packages: Record<string, { engines?: { node?: string } | string[] }> };

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : [],
  );
}

/** Package names imported by src/ (static, dynamic and require), node: built-ins and relative paths left out. */
function importedPackages(): Set<string> {
  const found = new Set<string>();
  const specifier = /(?:\bfrom\s+|\bimport\s*\(\s*|\brequire\s*\(\s*|\bimport\s+)['"]([^'"]+)['"]/g;
  for (const file of sources(path.join(ROOT, 'src'))) {
    for (const m of readFileSync(file, 'utf8').matchAll(specifier)) {
      const spec = m[1];
      if (spec.startsWith('.') || spec.startsWith('node:')) continue;
      const parts = spec.split('/');
      found.add(spec.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]);
    }
  }
  return found;
}

describe('package.json', () => {
  it('lists as runtime dependencies only packages that src/ imports', () => {
    const imported = importedPackages();
    const unused = Object.keys(pkg.dependencies).filter((name) => !imported.has(name));
    expect(unused).toEqual([]);
  });

  it('declares every package src/ imports as a runtime dependency', () => {
    const builtins = new Set(builtinModules);
    const undeclared = [...importedPackages()].filter((name) => !(name in pkg.dependencies) && !builtins.has(name));
    expect(undeclared).toEqual([]);
  });

  it('installs on the oldest Node that engines allows: no locked package asks for a newer one', () => {
    const oldest = semver.minVersion(pkg.engines.node)!.version;
    const refusing = Object.entries(lock.packages)
      .map(([where, p]) => ({ where, wants: Array.isArray(p.engines) ? undefined : p.engines?.node }))
      .filter((p): p is { where: string; wants: string } => typeof p.wants === 'string' && !semver.satisfies(oldest, p.wants));
    expect(refusing).toEqual([]);
  });
});
