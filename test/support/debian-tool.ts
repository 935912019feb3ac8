import { spawnSync } from 'node:child_process';

/**
 * Whether tests that need a command from a Debian package run: when it is on PATH, and in CI even
 * when it is not (.ci/run installs it, so there its absence fails them instead of skipping them).
 * Elsewhere a missing command is said on stderr and the tests are skipped.
 */
export function needsDebianTool(command: string, pkg: string, testFile: string): boolean {
  const present = spawnSync(command, ['--version'], { encoding: 'utf8' }).status === 0;
  if (!present && !process.env.CI) process.stderr.write(`${testFile}: ${command} is not installed (apt-get install ${pkg}): SKIPPED\n`);
  return present || Boolean(process.env.CI);
}
