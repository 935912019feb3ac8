import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { errorMessage, sidecarProblem, type SidecarRun } from '../../examples/demo/run-demo';
import { API, startKafkaTestBroker } from '../support/kafka-broker';
import { requirementsMet } from './requirements';

/**
 * `npm run demo` and `npm run demo -- --kafka` (the Kafka exporter, the project's test broker),
 * each read back by the Python trainer client's `groups` command: the output is free of library
 * warnings, every command it prints works after it ends (placeholders filled in where it names
 * them), and it fails, in one line, when the sidecar did not stop cleanly.
 */
const ROOT = path.join(__dirname, '../..');
const DEMO = path.join(ROOT, 'build/examples/demo/run-demo.js');
const CLIENT = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python') };
const pythonFor = (imports: string) =>
  ['python3', '/usr/bin/python3'].find((p) => spawnSync(p, ['-c', `import ${imports}`], { env: CLIENT, stdio: 'ignore' }).status === 0);
const python = pythonFor('lightning_sidecar_client.cli');
const kafkaPython = pythonFor('lightning_sidecar_client.cli, confluent_kafka');
const FILE = 'test/python/demo-kafka.test.ts';
// Without a python3 that imports the client, the demo says it does not show the trainer side (the
// first test checks that it says so); the reading back, the point of this file, is then missing.
requirementsMet(FILE, python ? null : 'no python3 here imports clients/python (Debian: python3)', 'the demo, read back by the Python client');

/** What a library says when it warns (kafkajs' EoS notice, Node's process warnings), and our log's warn and error lines. */
const WARNING = /Limiting retries|EoS guarantees|\(node:\d+\) \w*Warning|"level":"(warn|error)"/;

function run(cmd: string, args: string[], timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (c: Buffer) => (out += c.toString()));
    p.stderr.on('data', (c: Buffer) => (out += c.toString()));
    const kill = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.once('close', (code) => {
      clearTimeout(kill);
      resolve({ code, out });
    });
  });
}

/** A command the demo printed, run as its reader would: by the shell, from where the demo ran. */
const shell = (command: string, timeoutMs = 60_000) => run('sh', ['-c', command], timeoutMs);

/** The printed command line that matches, without its indent. */
function printed(out: string, pattern: RegExp): string {
  const line = out.split('\n').find((l) => l.startsWith('  ') && pattern.test(l));
  expect(line).toBeDefined();
  return line!.trim();
}

const tmp = () => mkdtempSync(path.join(os.tmpdir(), 'lightning-demo-'));

describe('the demo', () => {
  beforeAll(async () => {
    // The demo runs from build/ (as `npm run demo` builds it).
    const built = await run(process.execPath, [path.join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], 120_000);
    expect(built.out).toBe('');
  }, 150_000);

  it('reads its group back from the files it leaves, with a command that works after it', async () => {
    const dir = tmp();
    const demo = await run(process.execPath, [DEMO, '--data-dir', dir], 150_000);
    expect(demo.out).toMatch(/sidecar stopped on SIGTERM with status 0 and logged no error/);
    expect(demo.out).not.toMatch(WARNING);
    expect(demo.code).toBe(0);
    // What it names as placeholders it says are.
    expect(demo.out).toMatch(/your-vllm:8000 stands for it/);
    const group = /\(group (demo-\d+)\)/.exec(demo.out)![1];
    if (!python) {
      expect(demo.out).toMatch(/the trainer side .* is not shown: no python3 here imports it/);
      return;
    }
    expect(demo.out).toMatch(/equal to the trajectories' token ids above: 3 of 3/);
    const command = printed(demo.out, /lightning_sidecar_client groups --data-dir/);
    const out = /--out (\S+)$/.exec(command)![1];
    // As printed: it runs again without complaint (the group is already in its output file) ...
    const again = await shell(command);
    expect(again.out).not.toMatch(/Traceback|Error/);
    expect(again.code).toBe(0);
    // ... and into a file of one's own it writes the group again, whole.
    const fresh = path.join(tmp(), 'groups.jsonl');
    expect(await shell(command.replace(`--out ${out}`, `--out ${fresh}`))).toMatchObject({ code: 0 });
    const groups = readFileSync(fresh, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { uid: string; batch: { trajectory_id: string[] } });
    expect(groups.find((g) => g.uid === group)?.batch.trajectory_id).toHaveLength(3);
    // The example trainer loop (examples/README.md says to run it after the demo) reads the same files.
    const trainer = await shell(
      `PYTHONPATH=clients/python ${python} examples/python-trainer/train.py --data-dir ${dir} --group-size 3 --state ${path.join(tmp(), 'trained.state')}`,
    );
    expect(trainer).toMatchObject({
      code: 0,
      out: expect.stringMatching(new RegExp(`group ${group}: 3 episodes, 3 rows x \\d+ tokens, .*calls left out of trajectories 0`)),
    });
  }, 300_000);

  describe('through Kafka, read by the Python client', () => {
    if (!requirementsMet(FILE, kafkaPython ? null : 'no python3 with confluent-kafka here (Debian: python3-confluent-kafka)', 'the Kafka demo')) return;

    it('prints the group with the exact token ids the model server returned, and a command for one’s own Kafka', async () => {
      const demo = await run(process.execPath, [DEMO, '--kafka', '--data-dir', tmp()], 150_000);
      expect(demo.out).toMatch(/read from Kafka by the Python client/);
      const m = /token ids equal to what the model server returned: (\d+) of (\d+)/.exec(demo.out);
      expect(m).not.toBeNull();
      expect(Number(m![1])).toBe(Number(m![2]));
      // One trajectory row per rollout: each rollout's calls continue each other.
      expect(Number(m![2])).toBe(3);
      expect(demo.out).toMatch(/sidecar stopped on SIGTERM with status 0 and logged no error/);
      expect(demo.out).not.toMatch(WARNING);
      expect(demo.code).toBe(0);

      // The test broker is gone: the only Kafka command printed is for one's own, and says so.
      expect(demo.out).toMatch(/your-kafka:9092 stands for your brokers/);
      const command = printed(demo.out, /lightning_sidecar_client groups --brokers/);
      expect(command).toMatch(/--brokers your-kafka:9092 /);
      // Filled in with a broker that stays, it joins and fetches, and stops cleanly on SIGTERM.
      const broker = await startKafkaTestBroker();
      try {
        for (const topic of ['lightning.trajectories', 'lightning.episodes']) broker.createTopic(topic);
        const out = path.join(tmp(), 'groups.jsonl');
        const filled = command.replace('your-kafka:9092', broker.brokers.join(',')).replace('--out groups.jsonl', `--out ${out}`);
        // `exec env`: the shell becomes the client (the command is `VAR=value program …`), so
        // SIGTERM reaches it and its exit status is the one seen here.
        const p = spawn('sh', ['-c', `exec env ${filled}`], { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
        let stderr = '';
        p.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
        const closed = new Promise<number | null>((resolve) => p.once('close', resolve));
        const until = Date.now() + 60_000;
        while (!broker.requestCounts.get(API.Fetch) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
        expect(broker.requestCounts.get(API.Fetch)).toBeGreaterThan(0);
        p.kill('SIGTERM');
        expect(await closed).toBe(0);
        expect(stderr).not.toMatch(/Traceback|gave up/);
      } finally {
        await broker.close();
      }
    }, 300_000);
  });

  describe('fails in one line when the sidecar did not run cleanly', () => {
    const lastLine = (out: string) => out.trim().split('\n').pop();

    it('when it exits before the demo stops it (its data directory is a file)', async () => {
      const file = path.join(tmp(), 'not-a-directory');
      writeFileSync(file, '');
      const demo = await run(process.execPath, [DEMO, '--data-dir', file], 60_000);
      expect(lastLine(demo.out)).toMatch(
        /^demo: the sidecar exited on its own before the demo stopped it \(status 1\); it logged an error, the first: start-up failed \(ENOTDIR: not a directory/,
      );
      expect(demo.code).toBe(1);
    }, 90_000);

    it('when it exits with status 0 but logged errors (it cannot write its trajectories)', async () => {
      const dir = tmp();
      writeFileSync(path.join(dir, 'trajectories'), '');
      mkdirSync(path.join(dir, 'episodes'));
      const demo = await run(process.execPath, [DEMO, '--data-dir', dir], 120_000);
      expect(lastLine(demo.out)).toMatch(/^demo: the sidecar exited with status 0 but logged \d+ errors?, the first: export failed/);
      expect(demo.code).toBe(1);
    }, 150_000);

    // A sidecar that exits non-zero after SIGTERM, or has to be killed, cannot be made without a
    // fake one; the verdict on those is checked here, on the record the demo keeps of the run.
    const clean: SidecarRun = { stopped: true, killed: false, code: 0, signal: null, errors: [] };
    it.each<[string, Partial<SidecarRun>, string | null]>([
      ['clean', {}, null],
      ['status 1 after SIGTERM', { code: 1 }, 'the sidecar exited with status 1 after SIGTERM'],
      ['killed', { killed: true, code: null, signal: 'SIGKILL' }, 'the sidecar did not exit within 30 s of SIGTERM and was killed'],
      ['an error line', { errors: ['shutdown failed'] }, 'the sidecar exited with status 0 but logged an error, the first: shutdown failed'],
      [
        'early, with errors',
        { stopped: false, code: 1, errors: ['start-up failed', 'x'] },
        'the sidecar exited on its own before the demo stopped it (status 1); it logged 2 errors, the first: start-up failed',
      ],
    ])('the verdict: %s', (_, how, verdict) => expect(sidecarProblem({ ...clean, ...how })).toBe(verdict));

    it('counts error-level log lines only', () => {
      expect(errorMessage('{"level":"error","msg":"shutdown failed","err":{"message":"EIO"}}')).toBe('shutdown failed (EIO)');
      expect(errorMessage('{"level":"warn","msg":"kafka: cannot reach broker"}')).toBeNull();
      expect(errorMessage('lightning-sidecar: Error: boom')).toBeNull();
    });
  });
});
