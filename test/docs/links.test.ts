import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';

/**
 * A fresh clone has no dead reference: every relative link in the repository's Markdown resolves
 * to a file (and heading) inside it, nothing points outside the repository, to a design file
 * that is not in it, or to an issue number; every docs/ page says what it is for first.
 */

const ROOT = path.join(__dirname, '../..');
const SKIP_DIRS = new Set(['.git', 'node_modules', 'dist', 'build', 'data', 'coverage', '__pycache__']);

/** Markdown files a clone has: tracked and new ones (git), or every one under the root when git is not at hand. */
function markdownFiles(): string[] {
  try {
    const out = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard', '--', '*.md'], { cwd: ROOT, encoding: 'utf8' });
    return out
      .split('\n')
      .filter((f) => f !== '' && existsSync(path.join(ROOT, f)))
      .sort();
  } catch {
    const found: string[] = [];
    const walk = (dir: string): void => {
      for (const entry of readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
        const rel = path.posix.join(dir, entry.name);
        if (entry.isDirectory() && !SKIP_DIRS.has(entry.name)) walk(rel);
        else if (entry.isFile() && entry.name.endsWith('.md')) found.push(rel);
      }
    };
    walk('.');
    return found.map((f) => f.replace(/^\.\//, '')).sort();
  }
}

/** The text outside fenced code blocks and code spans, line numbers kept. */
function prose(text: string): string {
  let inFence = false;
  return text
    .split('\n')
    .map((line) => {
      if (/^\s*(```|~~~)/.test(line)) {
        inFence = !inFence;
        return '';
      }
      return inFence ? '' : line.replace(/`[^`]*`/g, '``');
    })
    .join('\n');
}

interface Link {
  line: number;
  target: string;
}

/** Inline links and images `[text](target "title")`, reference definitions `[id]: target`, and `href`/`src` attributes. */
function links(text: string): Link[] {
  const out: Link[] = [];
  prose(text)
    .split('\n')
    .forEach((line, i) => {
      for (const m of line.matchAll(/\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)/g)) out.push({ line: i + 1, target: m[1] });
      const def = /^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/.exec(line);
      if (def) out.push({ line: i + 1, target: def[1] });
      for (const m of line.matchAll(/\b(?:href|src)="([^"]+)"/g)) out.push({ line: i + 1, target: m[1] });
    });
  return out;
}

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats. */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  let inFence = false;
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) inFence = !inFence;
    const h = inFence ? null : /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!h) continue;
    const base = h[1]
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

const files = markdownFiles();
const text = new Map(files.map((f) => [f, readFileSync(path.join(ROOT, f), 'utf8')]));

function deadLinks(file: string): string[] {
  const problems: string[] = [];
  for (const { line, target } of links(text.get(file)!)) {
    const where = `${file}:${line}: ${target}`;
    if (target === '' || /^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
    if (target.startsWith('/')) {
      problems.push(`${where}: absolute path (links are relative to the file)`);
      continue;
    }
    const [rawPath, anchor] = target.split('#', 2);
    const resolved = rawPath === '' ? path.join(ROOT, file) : path.resolve(path.dirname(path.join(ROOT, file)), decodeURIComponent(rawPath));
    const rel = path.relative(ROOT, resolved);
    if (rel.startsWith('..') || path.isAbsolute(rel)) {
      problems.push(`${where}: outside the repository`);
      continue;
    }
    if (!existsSync(resolved)) {
      problems.push(`${where}: no such file`);
      continue;
    }
    if (anchor !== undefined && anchor !== '' && resolved.endsWith('.md') && statSync(resolved).isFile()) {
      const targetText = text.get(rel.split(path.sep).join('/')) ?? readFileSync(resolved, 'utf8');
      if (!anchors(targetText).has(decodeURIComponent(anchor).toLowerCase())) problems.push(`${where}: no heading for #${anchor}`);
    }
  }
  return problems;
}

/** References that are dead for anyone who clones the repository, in prose or code alike. */
const FORBIDDEN: [RegExp, string][] = [
  [/\.\.\/shared\b/, 'a path outside the repository'],
  [/\bDESIGN(\.md)?\s*§/, 'a design file that is not in the repository'],
  [/\bDESIGN\.md\b/, 'a design file that is not in the repository'],
  [/\bissues?\s+#\d+/i, 'an issue number'],
  [/\(#\d+\)/, 'an issue number'],
];

function forbidden(file: string, body: string): string[] {
  const problems: string[] = [];
  body.split('\n').forEach((line, i) => {
    for (const [re, what] of FORBIDDEN) if (re.test(line)) problems.push(`${file}:${i + 1}: ${what}: ${line.trim().slice(0, 120)}`);
  });
  return problems;
}

describe('Markdown links', () => {
  it('finds the front page, the docs and the examples', () => {
    for (const f of ['README.md', 'CONTRIBUTING.md', 'docs/architecture.md', 'examples/README.md', 'bench/README.md']) expect(files).toContain(f);
  });

  it('the link checker resolves files and headings, and refuses what leaves the repository', () => {
    const sample =
      '# A page\n## Run it `now`!\n## Run it now\nSee [x](README.md#lightning-sidecar), [y](#run-it-now-1), ![z](../../etc/passwd).\n```\n[not a link](nowhere.md)\n```\n';
    expect([...anchors(sample)]).toEqual(['a-page', 'run-it-now', 'run-it-now-1']);
    expect(links(sample).map((l) => l.target)).toEqual(['README.md#lightning-sidecar', '#run-it-now-1', '../../etc/passwd']);
  });

  it.each(files)('every relative link in %s resolves inside the repository', (file) => {
    expect(deadLinks(file)).toEqual([]);
  });

  it.each(files)('%s names no path outside the repository, no design section and no issue number', (file) => {
    expect(forbidden(file, text.get(file)!)).toEqual([]);
  });
});

describe('docs pages', () => {
  const pages = files.filter((f) => /^docs\/[^/]+\.md$/.test(f));

  it.each(pages)('%s starts with a title, then a paragraph saying what it is for', (file) => {
    const lines = text.get(file)!.split('\n');
    expect(lines[0]).toMatch(/^# \S/);
    const first = lines.slice(1).find((l) => l.trim() !== '') ?? '';
    // Prose, not a heading, list, table, fence, quote or HTML.
    expect(first).toMatch(/^(?![#>|<]|```|~~~|[*+-]\s|\d+\.\s)\S/);
  });
});

describe('source files', () => {
  const roots = ['src', 'test', 'bench', 'examples', 'clients', 'deploy', 'helm', 'proto', '.ci'];
  const sources: string[] = [];
  const walk = (dir: string): void => {
    if (!existsSync(path.join(ROOT, dir))) return;
    for (const entry of readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = path.posix.join(dir, entry.name);
      if (entry.isDirectory() && !SKIP_DIRS.has(entry.name) && rel !== 'bench/results') walk(rel);
      else if (entry.isFile() && /\.(ts|js|mjs|py|proto|ya?ml|tpl|txt|json)$|^run$|Dockerfile$/.test(entry.name) && rel !== 'test/docs/links.test.ts')
        sources.push(rel);
    }
  };
  for (const r of roots) walk(r);

  it('name no path outside the repository, no design section and no issue number', () => {
    expect(sources.flatMap((f) => forbidden(f, readFileSync(path.join(ROOT, f), 'utf8')))).toEqual([]);
  });

  it('cite docs/ pages that exist', () => {
    const missing = sources.flatMap((f) =>
      [...readFileSync(path.join(ROOT, f), 'utf8').matchAll(/\bdocs\/[\w./-]*?\.md\b/g)]
        .map((m) => m[0])
        .filter((doc) => !existsSync(path.join(ROOT, doc)))
        .map((doc) => `${f}: ${doc}`),
    );
    expect(missing).toEqual([]);
  });
});
