import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const MAIN = path.join(__dirname, '../../dist/main.js');

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
  cwd: string;
}

/** Runs the built CLI in an empty directory of its own, with no LIGHTNING_* variables. */
function cli(args: string[], timeoutMs = 10_000): Promise<Result> {
  const cwd = mkdtempSync(path.join(os.tmpdir(), 'lightning-cli-'));
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [MAIN, ...args],
      { cwd, env: { PATH: process.env.PATH ?? '' }, timeout: timeoutMs, killSignal: 'SIGKILL' },
      (err, stdout, stderr) => {
        const code = err ? ((err as { code?: number }).code ?? null) : 0;
        resolve({ code: typeof code === 'number' ? code : null, stdout, stderr, cwd });
      },
    );
  });
}

function writeRunConfig(yaml: string): string {
  const file = path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-cli-config-')), 'config.yaml');
  writeFileSync(file, yaml);
  return file;
}

/** A loopback port nothing listens on. */
function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

describe('lightning-sidecar command line', () => {
  it.each([
    [['--help'], /^usage: lightning-sidecar <command>/],
    [['-h'], /^usage: lightning-sidecar <command>/],
    [['help'], /^usage: lightning-sidecar <command>/],
    [['help', 'groups'], /^usage: lightning-sidecar groups --group-size N/],
    [['run', '--help'], /^usage: lightning-sidecar run \[--config FILE\]/],
    [['--config', 'x.yaml', '--help'], /^usage: lightning-sidecar run /],
    [['validate', '-h'], /^usage: lightning-sidecar validate FILE/],
    [['tail', '--help'], /^usage: lightning-sidecar tail .*\n\s+lightning-sidecar tail --kafka/],
    [['groups', '--help'], /^usage: lightning-sidecar groups /],
    [['run', '--bogus', '--help'], /^usage: lightning-sidecar run /],
    [['--version'], /^lightning-sidecar \d+\.\d+\.\d+\n$/],
    [['-V'], /^lightning-sidecar \d+\.\d+\.\d+\n$/],
  ])('%j prints to stdout and exits 0 without starting anything or creating ./data', async (args, pattern) => {
    const r = await cli(args);
    expect(r).toMatchObject({ code: 0, stderr: '' });
    expect(r.stdout).toMatch(pattern);
    expect(readdirSync(r.cwd)).toEqual([]);
  });

  it('lists every option of a command in its help, with --help itself', async () => {
    const r = await cli(['groups', '--help']);
    for (const flag of [
      '--group-size N',
      '--brokers',
      '--group-id ID',
      '--out FILE',
      '--to-topic T',
      '--state FILE',
      '--group-timeout-ms MS',
      '--max-groups N',
      '--idle-exit-ms MS',
      '--config FILE',
      '-h, --help',
    ])
      expect(r.stdout).toContain(flag);
  });

  it.each([
    // No command word: the option was meant for a command, or mistyped; not a run option.
    [['--bogus'], '<command>', "unknown option '--bogus' (no command given: run takes only --config)"],
    [['run', '--bogus'], 'run', "run: unknown option '--bogus'"],
    [['run', '--config'], 'run', "option '--config' wants a value"],
    [['run', 'extra'], 'run', "unexpected argument 'extra'"],
    [['validate', '--bogus'], 'validate', "unknown option '--bogus'"],
    [['validate', 'a.yaml', 'b.yaml'], 'validate', "unexpected argument 'b.yaml'"],
    [['tail', '--bogus'], 'tail', "unknown option '--bogus'"],
    [['tail', '--json=yes'], 'tail', "option '--json' takes no value"],
    [['tail', '--max', '3'], 'tail', '--max needs --kafka'],
    [['tail', '--kafka', '--follow'], 'tail', '--follow reads files, not Kafka'],
    [['tail', '--kafka', '--max', 'ten'], 'tail', "option --max wants a whole number, got 'ten'"],
    [['groups', '--bogus'], 'groups', "unknown option '--bogus'"],
    [['groups', '--group-size'], 'groups', "option '--group-size' wants a value"],
    [['groups', '--brokers', 'h:1'], 'groups', '--group-size N is required'],
    [['groups', '--group-size', '2', '--group-size', '3', '--brokers', 'h:1'], 'groups', 'option --group-size given more than once'],
    [['groups', '--group-size', '2', '--out', 'o', '--to-topic', 't', '--brokers', 'h:1'], 'groups', '--out and --to-topic exclude each other'],
  ])('%j exits 2 with the message and the usage on stderr, and starts nothing', async (args, command, message) => {
    const r = await cli(args);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain(message);
    expect(r.stderr).toContain(`usage: lightning-sidecar ${command} `);
    expect(existsSync(path.join(r.cwd, 'data'))).toBe(false);
  });

  it("names in run's help the settings a first run needs", async () => {
    const r = await cli(['run', '--help']);
    for (const name of [
      'LIGHTNING_UPSTREAM_URL',
      'LIGHTNING_UPSTREAM_FLAVOR',
      'LIGHTNING_DATA_DIR',
      'LIGHTNING_EXPORTER',
      'LIGHTNING_KAFKA_BROKERS',
      'OPENAI_BASE_URL',
    ])
      expect(r.stdout).toContain(name);
  });

  it('stops quietly, exit 0, when its reader closes the pipe (tail … | head -1)', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-pipe-'));
    mkdirSync(path.join(dir, 'transitions'));
    const t = {
      transition_id: 'r/0/0',
      rollout_id: 'r',
      api: 'chat.completions',
      model: 'm',
      status: 'ok',
      prompt_token_ids: [1],
      response_token_ids: [2],
      tool_calls: [],
      reward: 1,
      final_reward: 1,
      finish_reason: 'stop',
      streamed: false,
    };
    // Far more than a pipe holds, so the writer meets the closed pipe.
    writeFileSync(
      path.join(dir, 'transitions', 'transitions-0.ndjson'),
      Array.from({ length: 20_000 }, (_, i) => JSON.stringify({ ...t, transition_id: `r/0/${i}` })).join('\n') + '\n',
    );
    const tail = spawn(process.execPath, [MAIN, 'tail', '--data-dir', dir], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    tail.stderr.on('data', (c: Buffer) => (stderr += c));
    // The reader takes the first lines and goes away.
    const first = await new Promise<string>((resolve) => tail.stdout.once('data', (c: Buffer) => resolve(c.toString())));
    tail.stdout.destroy();
    const code = await new Promise<number | null>((resolve) => tail.once('exit', resolve));
    expect(first).toMatch(/^r\/0\/0 /);
    expect([code, stderr]).toEqual([0, '']);
  });

  it('run: a data directory it cannot use is one start-up error line and exit 1, not a stack trace', async () => {
    const file = path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-cli-')), 'not-a-dir');
    writeFileSync(file, '');
    const port = await closedPort();
    const r = await cli([
      'run',
      '--config',
      writeRunConfig(
        `service:\n  data_dir: ${JSON.stringify(file)}\n  telemetry:\n    endpoint: 127.0.0.1:0\nreceivers:\n  llm_proxy:\n    endpoint: 127.0.0.1:0\n    upstream_url: http://127.0.0.1:${port}/v1\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:0\n      http:\n        endpoint: 127.0.0.1:0\n`,
      ),
    ]);
    expect(r.code).toBe(1);
    const lines = r.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0])).toMatchObject({ level: 'error', msg: 'start-up failed', err: { code: 'ENOTDIR' }, data_dir: file });
  });

  it('answers an unknown command with the list of commands, exit 2', async () => {
    const r = await cli(['frobnicate']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("unknown command 'frobnicate'");
    expect(r.stderr).toContain('commands: run, validate, tail, groups');
  });

  it.each([
    ['groups', ['groups', '--group-size', '2']],
    ['tail', ['tail', '--kafka']],
  ])('%s against a broker that is down: one log line per retry round naming the broker, then one clear message and exit 1', async (command, args) => {
    const port = await closedPort();
    const broker = `127.0.0.1:${port}`;
    const r = await cli([...args, '--brokers', broker], 20_000);
    expect(r.code).toBe(1);
    const lines = r.stderr.trim().split('\n');
    const logs = lines.slice(0, -1).map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(logs.length).toBeGreaterThanOrEqual(2);
    for (const log of logs) {
      expect(log).toMatchObject({ level: 'warn', component: `${command}.kafka`, broker, error: `connect ECONNREFUSED ${broker}` });
      expect(log.msg).toMatch(new RegExp(`^kafka: cannot reach broker ${broker}: connect ECONNREFUSED`));
    }
    expect(logs.map((l) => l.attempt)).toEqual(logs.map((_, i) => i + 1));
    expect(lines.at(-1)).toBe(`${command}: gave up on Kafka at ${broker} after ${logs.length} tries: connect ECONNREFUSED ${broker}`);
    expect(r.stderr).not.toContain('"logger":"kafkajs"');
    expect(r.stderr).not.toMatch(/\n\s+at /);
    expect(r.stdout).toBe('');
  });
});
