import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startChildSidecar, type ChildSidecar } from '../support/child-sidecar';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { requirementsMet } from './requirements';

/**
 * The Python client as a trainer installs it: `pip install ./clients/python` in a fresh venv of
 * Debian's python3, offline (no index, no pip configuration) and without protoc on PATH, then its
 * installed `lightning-sidecar-client groups` on what a real sidecar's file exporter wrote. The
 * venv has neither confluent-kafka nor protobuf: a file consumer needs neither, and asking for
 * Kafka says which extra to install, in one line.
 */

const ROOT = path.join(__dirname, '../..');
const PACKAGE = path.join(ROOT, 'clients/python');
const PYTHON = '/usr/bin/python3';
const GROUP_SIZE = 2;
const STATE_FILE = 'lightning-groups.state';

/** Why no venv with pip can be made here, or null. */
function venvMissing(): string | null {
  const probe = spawnSync(PYTHON, ['-c', 'import venv, ensurepip'], { encoding: 'utf8' });
  if (probe.error) return `${PYTHON} is not installed (Debian: python3)`;
  if (probe.status !== 0) return `${PYTHON} cannot make a venv with pip (Debian: python3-venv)`;
  return null;
}

function run(
  cmd: string,
  args: string[],
  opts: { cwd: string; env: Record<string, string>; timeoutMs: number },
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { cwd: opts.cwd, env: opts.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c));
    p.stderr.on('data', (c: Buffer) => (stderr += c));
    const kill = setTimeout(() => p.kill('SIGKILL'), opts.timeoutMs);
    p.once('error', reject);
    p.once('exit', (code) => {
      clearTimeout(kill);
      resolve({ code, stdout, stderr });
    });
  });
}

const TITLE = 'pip install ./clients/python in a fresh venv, offline';
const runs = requirementsMet('test/python/packaging.test.ts', venvMissing(), TITLE);

(runs ? describe : describe.skip)(TITLE, () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-packaging-'));
  const venv = path.join(dir, 'venv');
  const data = path.join(dir, 'data');
  // Only the venv's own programs: no protoc, no system python packages.
  const env = { PATH: path.join(venv, 'bin'), HOME: dir, TMPDIR: dir, LANG: 'C.UTF-8' };
  const cli = path.join(venv, 'bin', 'lightning-sidecar-client');
  let upstream: FakeModelServer;
  let sidecar: ChildSidecar | null = null;
  let install: { code: number | null; stdout: string; stderr: string };
  /** Per rollout, the prompt ids the model server saw and the ids it answered. */
  const served = new Map<string, { prompt: number[]; response: number[] }>();

  /** Two rollouts of one group through a real sidecar exporting files, trajectories (the product's default records). */
  async function recordGroup(): Promise<void> {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startChildSidecar({
      LIGHTNING_UPSTREAM_URL: upstream.url,
      LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
      LIGHTNING_EXPORTER: 'file',
      LIGHTNING_EXPORT_RECORDS: 'trajectories',
      LIGHTNING_DATA_DIR: data,
      LIGHTNING_TOOL_SPAN_WAIT_MS: '0',
      LIGHTNING_LOG_LEVEL: 'warn',
    });
    for (const [id, reward] of [
      ['pkg-a', 1],
      ['pkg-b', 0],
    ] as const) {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${id}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': 'pkg-g' } });
      const index = upstream.requests.length;
      await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `rollout ${id}: say something` }] });
      const body = JSON.parse(upstream.responses[index].toString('utf8')) as { prompt_token_ids: number[]; choices: { token_ids: number[] }[] };
      served.set(id, { prompt: body.prompt_token_ids, response: body.choices[0].token_ids });
      const res = await fetch(`${sidecar.origin}/lightning/v1/rollouts/${id}/reward`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ value: reward }),
      });
      expect(res.status).toBe(202);
    }
    const episodes = () =>
      existsSync(path.join(data, 'episodes'))
        ? readdirSync(path.join(data, 'episodes'))
            .map((f) => readFileSync(path.join(data, 'episodes', f), 'utf8'))
            .join('')
            .split('\n')
            .filter(Boolean).length
        : 0;
    for (let i = 0; i < 400 && episodes() < GROUP_SIZE; i++) await new Promise((r) => setTimeout(r, 25));
    expect(episodes()).toBe(GROUP_SIZE);
    // Stopped, so that every line it wrote is whole.
    expect((await sidecar.kill()).code).toBe(0);
  }

  async function installPackage(): Promise<void> {
    const made = await run(PYTHON, ['-m', 'venv', venv], { cwd: dir, env, timeoutMs: 60_000 });
    if (made.code !== 0) throw new Error(`python3 -m venv failed: ${made.stderr}`);
    install = await run(
      path.join(venv, 'bin', 'python'),
      ['-m', 'pip', 'install', '--no-index', '--no-cache-dir', '--disable-pip-version-check', PACKAGE],
      // No pip configuration (this machine's may name local indexes); no bytecode left in the source tree.
      { cwd: dir, env: { ...env, PIP_CONFIG_FILE: os.devNull, PYTHONDONTWRITEBYTECODE: '1' }, timeoutMs: 60_000 },
    );
  }

  beforeAll(async () => {
    await Promise.all([installPackage(), recordGroup()]);
  }, 90_000);

  afterAll(async () => {
    await sidecar?.kill();
    await upstream?.close();
    // The venv only: what the sidecar wrote stays for the suite's secrets scan, which then removes it.
    rmSync(venv, { recursive: true, force: true });
  });

  it('installs with nothing from an index, no protoc, and no protobuf or Kafka client', () => {
    expect(install.stderr).not.toMatch(/ERROR/);
    expect(install.code).toBe(0);
    expect(existsSync(cli)).toBe(true);
    // The checks below mean something: the venv lacks all three.
    expect(spawnSync('protoc', ['--version'], { env }).error).toBeDefined();
    for (const mod of ['google.protobuf', 'confluent_kafka'])
      expect(spawnSync(path.join(venv, 'bin', 'python'), ['-c', `import ${mod}`], { env }).status).not.toBe(0);
  });

  it("emits the sidecar's group from its files, then a second run says the state file has it and emits nothing", async () => {
    const work = path.join(dir, 'work');
    mkdirSync(work);
    const first = await run(cli, ['groups', '--group-size', String(GROUP_SIZE), '--data-dir', data], { cwd: work, env, timeoutMs: 30_000 });
    expect(first.stderr).toBe('groups: emitted pkg-g (2 episodes, 2 rows)\n');
    expect(first.code).toBe(0);
    const lines = first.stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const group = JSON.parse(lines[0]) as {
      uid: string;
      rows: string;
      episodes: { rollout_id: string; final_reward: number }[];
      batch: { rollout_id: string[]; prompt_ids: number[][]; response_ids: number[][]; response_mask: number[][] };
    };
    expect(group.uid).toBe('pkg-g');
    expect(group.rows).toBe('trajectories');
    expect(group.episodes.map((e) => [e.rollout_id, e.final_reward])).toEqual([
      ['pkg-a', 1],
      ['pkg-b', 0],
    ]);
    // Each row is exactly the call the model server answered.
    group.batch.rollout_id.forEach((id, i) => {
      expect(group.batch.prompt_ids[i]).toEqual(served.get(id)!.prompt);
      expect(group.batch.response_ids[i]).toEqual(served.get(id)!.response);
      expect(group.batch.response_mask[i]).toEqual(served.get(id)!.response.map(() => 1));
    });
    expect(existsSync(path.join(work, STATE_FILE))).toBe(true);

    const second = await run(cli, ['groups', '--group-size', String(GROUP_SIZE), '--data-dir', data], { cwd: work, env, timeoutMs: 30_000 });
    expect(second.code).toBe(0);
    expect(second.stdout).toBe('');
    const said = second.stderr.split('\n').filter(Boolean);
    expect(said[0]).toBe(
      `groups: state file ${STATE_FILE} lists 1 groups already emitted and 0 given up on; they are not emitted again (delete it or pass --state FILE to start over)`,
    );
    expect(said[said.length - 1]).toBe(`groups: emitted no group: 1 complete groups were already emitted (listed in ${STATE_FILE})`);
  }, 60_000);

  it('refuses --brokers without the Kafka extra in one line naming it', async () => {
    const r = await run(cli, ['groups', '--group-size', '2', '--brokers', '127.0.0.1:1'], { cwd: dir, env, timeoutMs: 30_000 });
    expect(r.stderr).toBe("groups: --brokers needs the Kafka extra (confluent-kafka): pip install './clients/python[kafka]'\n");
    expect(r.code).not.toBe(0);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
  }, 30_000);
});
