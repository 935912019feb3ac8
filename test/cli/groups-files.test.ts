import { spawnSync } from 'node:child_process';
import { appendFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import OpenAI from 'openai';
import type { GroupBatch, TrajectoryGroupBatch } from '../../src/trainer/groups';
import { startFakeModelServer, type FakeModelServer, type ReceivedRequest } from '../support/fake-model-server';
import { startKafkaTestBroker, type KafkaTestBroker } from '../support/kafka-broker';
import { runToExit, type Exited } from '../support/run-to-exit';
import { postReward, startSidecar, type TestSidecar } from '../support/sidecar';

/**
 * `groups --data-dir`: the file exporter's output of a real sidecar (rotated files, prompt deltas)
 * read by the built CLI and by the Python client, which must print the same group lines byte for
 * byte; the state file lines of a run that emits nothing, from files and from Kafka.
 */

const ROOT = path.join(__dirname, '../..');
const MAIN = path.join(ROOT, 'dist/main.js');
const PACKAGE = path.join(ROOT, 'clients/python');
// Debian's python3 (python3-protobuf); a pyenv python3 on PATH may lack the client's imports.
const PYTHON = '/usr/bin/python3';
const GROUP_SIZE = 2;

/** g1 and g2 complete at group size 2; g3 never does. */
const ROLLOUTS = [
  { id: 'g1-a', group: 'g1', calls: 3, reward: 1 },
  { id: 'g1-b', group: 'g1', calls: 1, reward: 0 },
  { id: 'g2-a', group: 'g2', calls: 2, reward: 0.5 },
  { id: 'g2-b', group: 'g2', calls: 2, reward: -0.25 },
  { id: 'g3-a', group: 'g3', calls: 1, reward: 1 },
];

const scratch = (): string => mkdtempSync(path.join(os.tmpdir(), 'lightning-groups-files-'));
const groups = (args: string[], cwd = scratch()): Promise<Exited> => runToExit(process.execPath, [MAIN, 'groups', ...args], { cwd });
const pythonGroups = (args: string[], cwd = scratch()): Promise<Exited> =>
  runToExit(PYTHON, ['-m', 'lightning_sidecar_client', 'groups', ...args], { cwd, env: { PYTHONPATH: PACKAGE } });

/** Why the Python half cannot run here, or null. */
function pythonMissing(): string | null {
  const probe = spawnSync(PYTHON, ['-c', 'import lightning_sidecar_client.cli, lightning_sidecar_client.files'], {
    env: { PATH: process.env.PATH ?? '', PYTHONPATH: PACKAGE },
    encoding: 'utf8',
  });
  if (probe.error) return `${PYTHON} is not installed`;
  if (probe.status !== 0) return `${PYTHON} cannot import the client (${probe.stderr.trim().split('\n').at(-1)}; Debian: python3-protobuf)`;
  return null;
}

const uids = (stdout: string): string[] =>
  stdout
    .trim()
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => (JSON.parse(l) as { uid: string }).uid);

describe('groups --data-dir (the file exporter, against the Python client)', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  let dataDir: string;

  beforeAll(async () => {
    upstream = await startFakeModelServer({
      flavor: 'vllm',
      script: (req: ReceivedRequest) => ({ content: `answer ${((req.json?.messages as unknown[]) ?? []).length}` }),
    });
    // Small files, so the exporter rotates; prompt deltas, so the reader has to make prompts whole.
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      exporters: { records: 'both', file: { max_file_bytes: 4096, prompt_ids: 'delta' } },
    });
    dataDir = sidecar.dataDir;
    for (const [i, r] of ROLLOUTS.entries()) {
      const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${r.id}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': r.group } });
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'system', content: `You are agent ${r.id}.` }];
      for (let step = 0; step < r.calls; step++) {
        messages.push({ role: 'user', content: `${r.id} step ${step}: ${'tell me more. '.repeat(10 * step)}` });
        const reply = await client.chat.completions.create({ model: 'm', messages });
        messages.push({ role: 'assistant', content: reply.choices[0].message.content });
      }
      expect((await postReward(sidecar.origin, r.id, r.reward)).status).toBe(202);
      // One export (one append) per rollout, so the small files rotate however busy the machine is.
      await sidecar.waitForEpisodes(i + 1);
    }
  }, 60_000);

  afterAll(async () => {
    await sidecar?.stop();
    await upstream?.close();
  });

  const missing = pythonMissing();
  if (missing && process.env.CI) it('has a python3 that imports the client in CI', () => expect(missing).toBeNull());
  if (missing && !process.env.CI) process.stderr.write(`test/cli/groups-files: the Python comparison is skipped: ${missing}\n`);

  it.each(['trajectories', 'transitions'])('emits, with --rows %s, the complete groups once each, byte for byte as the Python client', async (rows) => {
    // What the exporter wrote: rotated files, and prompt deltas the reader has to make whole.
    expect(readdirSync(path.join(dataDir, rows)).length).toBeGreaterThan(1);
    expect(sidecar.transitions().some((t) => (t as { prompt_token_ids_delta?: unknown }).prompt_token_ids_delta)).toBe(true);
    const args = ['--group-size', String(GROUP_SIZE), '--rows', rows, '--data-dir', dataDir];
    const node = await groups(args);
    expect(node.code).toBe(0);
    expect(uids(node.stdout)).toEqual(['g1', 'g2']);
    expect(node.stderr).toContain(`groups: 1 groups still incomplete at the end of ${dataDir}\n`);
    expect(node.stderr).not.toMatch(/skipping|cannot be made whole|emitted no group/);
    const [g1] = node.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as GroupBatch | TrajectoryGroupBatch);
    // Every call of g1 is a row of its own with transition rows; one trajectory each otherwise.
    expect(g1.batch.uid).toHaveLength(rows === 'transitions' ? 4 : 2);
    if (rows === 'transitions') for (const prompt of g1.batch.prompt_ids) expect(prompt.length).toBeGreaterThan(0);
    if (missing) return;
    const python = await pythonGroups(args);
    expect(python.code).toBe(0);
    expect(python.stdout).toBe(node.stdout);
  });

  it('emits nothing on a second run with the same state file, and says the groups were already emitted', async () => {
    const cwd = scratch();
    const out = path.join(cwd, 'groups.jsonl');
    const args = ['--group-size', String(GROUP_SIZE), '--data-dir', dataDir, '--out', out];
    const first = await groups(args, cwd);
    expect(first.code).toBe(0);
    expect(uids(readFileSync(out, 'utf8'))).toEqual(['g1', 'g2']);
    // g3 was not given up on: its episodes may be in files not written yet.
    expect(existsSync(`${out}.state`)).toBe(false);
    const second = await groups(args, cwd);
    expect(second.code).toBe(0);
    expect(second.stdout).toBe('');
    expect(uids(readFileSync(out, 'utf8'))).toEqual(['g1', 'g2']);
    expect(second.stderr).toContain(`groups: emitted no group: 2 complete groups were already emitted (listed in ${out})\n`);

    // The same through a state file (stdout output): the state file is named at start.
    const state = path.join(cwd, 'groups.state');
    const withState = ['--group-size', String(GROUP_SIZE), '--data-dir', dataDir, '--state', state];
    expect(uids((await groups(withState, cwd)).stdout)).toEqual(['g1', 'g2']);
    const again = await groups(withState, cwd);
    expect(again).toMatchObject({ code: 0, stdout: '' });
    expect(again.stderr.split('\n')[0]).toBe(
      `groups: state file ${state} lists 2 groups already emitted and 0 given up on; they are not emitted again (delete it or pass --state FILE to start over)`,
    );
    expect(again.stderr.trimEnd().split('\n').at(-1)).toBe(`groups: emitted no group: 2 complete groups were already emitted (listed in ${state})`);
  });

  it('says no group was complete when none was, and that no episode was read from an empty directory', async () => {
    const incomplete = await groups(['--group-size', '3', '--data-dir', dataDir]);
    expect(incomplete).toMatchObject({ code: 0, stdout: '' });
    expect(incomplete.stderr).toContain(`groups: 3 groups still incomplete at the end of ${dataDir}\n`);
    expect(incomplete.stderr.trimEnd().split('\n').at(-1)).toBe('groups: emitted no group: 5 episodes read in 3 groups, none complete (--group-size 3)');

    const empty = await groups(['--group-size', '2', '--data-dir', scratch()]);
    expect(empty).toMatchObject({ code: 0, stdout: '', stderr: 'groups: emitted no group: no episodes read\n' });
  });

  it('follows the files with --follow: a line is read once whole, and the run ends after --idle-exit-ms without a new one', async () => {
    const dir = scratch();
    const cwd = scratch();
    const follow = groups(['--group-size', String(GROUP_SIZE), '--data-dir', dir, '--follow', '--idle-exit-ms', '1500'], cwd);
    await new Promise((r) => setTimeout(r, 300));
    cpSync(path.join(dataDir, 'trajectories'), path.join(dir, 'trajectories'), { recursive: true });
    // The episodes arrive in two writes, g2's last episode line cut in the middle: g2 is emitted
    // once the line is whole, and the half line is not taken for an undecodable one.
    mkdirSync(path.join(dir, 'episodes'));
    const files = readdirSync(path.join(dataDir, 'episodes')).map((f) => [f, readFileSync(path.join(dataDir, 'episodes', f))] as const);
    const [file, episodes] = files.find(([, bytes]) => bytes.includes('"rollout_id":"g2-b"'))!;
    const cut = episodes.indexOf('"rollout_id":"g2-b"');
    for (const [f, bytes] of files) writeFileSync(path.join(dir, 'episodes', f), f === file ? episodes.subarray(0, cut) : bytes);
    await new Promise((r) => setTimeout(r, 600));
    appendFileSync(path.join(dir, 'episodes', file), episodes.subarray(cut));
    const r = await follow;
    expect(r.code).toBe(0);
    expect(r.stderr).not.toMatch(/skipping/);
    expect(r.stdout).toBe((await groups(['--group-size', String(GROUP_SIZE), '--data-dir', dataDir])).stdout);
    expect(uids(r.stdout)).toEqual(['g1', 'g2']);
  });

  it.each([
    [['--brokers', 'h:1'], '--data-dir and --brokers exclude each other'],
    [['--group-id', 'trainer'], '--data-dir and --group-id exclude each other'],
    [['--to-topic', 'groups'], '--data-dir and --to-topic exclude each other'],
    [['--idle-exit-ms', '1000'], '--idle-exit-ms needs --follow with --data-dir'],
  ])('refuses %j with --data-dir: exit 2, the message and the usage, and nothing written', async (extra, message) => {
    const cwd = scratch();
    const r = await groups(['--group-size', '2', '--data-dir', dataDir, ...extra], cwd);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain(`lightning-sidecar: groups: ${message}`);
    expect(r.stderr).toContain('usage: lightning-sidecar groups ');
    expect(readdirSync(cwd)).toEqual([]);
  });

  it('names a --data-dir that does not exist, and --follow without --data-dir', async () => {
    const typo = await groups(['--group-size', '2', '--data-dir', 'dtaa']);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain('groups: --data-dir dtaa is not a directory');
    const follow = await groups(['--group-size', '2', '--follow', '--brokers', 'h:1']);
    expect(follow.code).toBe(2);
    expect(follow.stderr).toContain('groups: --follow needs --data-dir');
  });

  describe('on Kafka', () => {
    let broker: KafkaTestBroker;

    beforeAll(async () => {
      broker = await startKafkaTestBroker();
      // What the sidecar wrote to files, as its Kafka exporter would have sent it.
      const kafka = new Kafka({ brokers: broker.brokers, logLevel: logLevel.NOTHING });
      const producer = kafka.producer();
      await producer.connect();
      for (const [topic, records] of [
        ['lightning.trajectories', sidecar.trajectories()],
        ['lightning.episodes', sidecar.episodes()],
      ] as const)
        await producer.send({
          topic,
          messages: records.map((r) => ({ key: r.rollout_id, value: JSON.stringify(r), headers: { 'content-type': 'application/json' } })),
        });
      await producer.disconnect();
    });
    afterAll(async () => {
      await broker?.close();
    });

    it('says the same when a run emits nothing: the state file at start, then why', async () => {
      const cwd = scratch();
      const state = path.join(cwd, 'groups.state');
      const args = (groupId: string, stateFile: string): string[] => [
        '--group-size',
        String(GROUP_SIZE),
        '--brokers',
        broker.brokers.join(','),
        '--group-id',
        groupId,
        '--state',
        stateFile,
        '--idle-exit-ms',
        '1500',
        '--group-timeout-ms',
        '800',
      ];
      const first = await groups(args('first', state), cwd);
      expect(first.code).toBe(0);
      expect(uids(first.stdout)).toEqual(['g1', 'g2']);
      expect(first.stderr).toContain('groups: gave up on g3: 1 of 2 episodes');
      // Another consumer group reads everything again; the state file holds the groups back.
      const second = await groups(args('second', state), cwd);
      expect(second).toMatchObject({ code: 0, stdout: '' });
      expect(second.stderr).toContain(
        `groups: state file ${state} lists 2 groups already emitted and 1 given up on; they are not emitted again (delete it or pass --state FILE to start over)\n`,
      );
      expect(second.stderr.trimEnd().split('\n').at(-1)).toBe(`groups: emitted no group: 2 complete groups were already emitted (listed in ${state})`);
      // The first consumer group has committed past everything: nothing is read.
      const third = await groups(args('first', path.join(cwd, 'fresh.state')), cwd);
      expect(third).toMatchObject({ code: 0, stdout: '' });
      expect(third.stderr.trimEnd().split('\n').at(-1)).toBe('groups: emitted no group: no episodes read');
    }, 30_000);
  });
});
