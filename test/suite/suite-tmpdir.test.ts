import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * The suite's own temporary directory (test/support/secrets-scan.js, Jest's globalSetup and
 * globalTeardown): made under the machine's, handed to everything through TMPDIR, scanned for the
 * tests' secrets and removed at the end; kept when the scan finds one. Run in a child process
 * against a scratch "machine" directory, as Jest runs it.
 */
const SCAN = path.join(__dirname, '../support/secrets-scan.js');

function suiteRun(
  machine: string,
  write: 'nothing secret' | 'a secret',
): { code: number | null; out: { suite: string; machine: string } | null; stderr: string } {
  const script = `
    const fs = require('node:fs'); const path = require('node:path'); const os = require('node:os');
    const s = require(${JSON.stringify(SCAN)});
    s.setup();
    const suite = os.tmpdir();
    fs.mkdirSync(path.join(suite, 'lightning-data-x'));
    const text = ${JSON.stringify(write)} === 'a secret' ? 'key=' + s.secrets()[0] : 'nothing secret';
    fs.writeFileSync(path.join(suite, 'lightning-data-x', 'journal.bin'), text);
    process.stdout.write(JSON.stringify({ suite, machine: process.env.LIGHTNING_TEST_MACHINE_TMPDIR }));
    s.teardown();
  `;
  const r = spawnSync(process.execPath, ['-e', script], { env: { PATH: process.env.PATH ?? '', TMPDIR: machine }, encoding: 'utf8' });
  return { code: r.status, out: r.stdout ? (JSON.parse(r.stdout) as { suite: string; machine: string }) : null, stderr: r.stderr };
}

describe('the suite temporary directory', () => {
  const machine = mkdtempSync(path.join(os.tmpdir(), 'lightning-machine-'));
  afterAll(() => rmSync(machine, { recursive: true, force: true }));

  it('is made under the machine directory, handed on through TMPDIR, and removed when the scan is clean', () => {
    const r = suiteRun(machine, 'nothing secret');
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(path.dirname(r.out!.suite)).toBe(machine);
    expect(path.basename(r.out!.suite)).toMatch(/^lightning-suite-/);
    expect(r.out!.machine).toBe(machine);
    expect(existsSync(r.out!.suite)).toBe(false);
    expect(readdirSync(machine)).toEqual([]);
  });

  it('fails the run and keeps the directory when a file in it holds a secret the tests use', () => {
    const r = suiteRun(machine, 'a secret');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain('secrets found in files the sidecar wrote during the suite');
    expect(r.stderr).toContain(path.join(r.out!.suite, 'lightning-data-x', 'journal.bin'));
    expect(existsSync(r.out!.suite)).toBe(true);
    rmSync(r.out!.suite, { recursive: true, force: true });
  });
});
