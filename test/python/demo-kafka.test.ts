import { spawn, spawnSync } from 'node:child_process';
import path from 'node:path';

/**
 * `npm run demo -- --kafka`: the demo with the Kafka exporter (the project's test broker), read by
 * the Python trainer client's `groups` command, every row's ids checked against the model server.
 */
const ROOT = path.join(__dirname, '../..');
const python = ['python3', '/usr/bin/python3'].find((p) => spawnSync(p, ['-c', 'import confluent_kafka'], { stdio: 'ignore' }).status === 0);

function run(cmd: string, args: string[], timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { cwd: ROOT, env: { ...process.env, LIGHTNING_PYTHON: python ?? '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString()));
    p.stderr.on('data', (c: Buffer) => (out += c.toString()));
    const kill = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.once('exit', (code) => {
      clearTimeout(kill);
      resolve({ code, out });
    });
  });
}

describe('the demo through Kafka, read by the Python client', () => {
  if (!python) {
    if (process.env.CI) it('has python3 with confluent-kafka (CI installs python3-confluent-kafka)', () => expect(python).toBeDefined());
    else it.skip('skipped: no python3 with confluent-kafka here (Debian: python3-confluent-kafka)', () => {});
    return;
  }

  it('prints the demo’s group with the exact token ids the model server returned', async () => {
    // The demo runs from build/ (as `npm run demo` builds it).
    const built = await run(process.execPath, [path.join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], 120_000);
    expect(built.code).toBe(0);
    const demo = await run(process.execPath, [path.join(ROOT, 'build/examples/demo/run-demo.js'), '--kafka'], 150_000);
    expect(demo.out).toMatch(/read from Kafka by the Python client/);
    const m = /token ids equal to what the model server returned: (\d+) of (\d+)/.exec(demo.out);
    expect(m).not.toBeNull();
    expect(Number(m![1])).toBe(Number(m![2]));
    // One trajectory row per rollout: each rollout's calls continue each other.
    expect(Number(m![2])).toBe(3);
    expect(demo.code).toBe(0);
  }, 300_000);
});
