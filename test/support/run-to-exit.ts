import { spawn } from 'node:child_process';

export interface Exited {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs a command to its exit, asynchronously (a server under test in this process keeps
 * answering), with only PATH from this environment plus `env`; killed after `timeoutMs`.
 */
export function runToExit(cmd: string, args: string[], options: { cwd?: string; env?: Record<string, string>; timeoutMs?: number } = {}): Promise<Exited> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { cwd: options.cwd, env: { PATH: process.env.PATH ?? '', ...options.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c));
    p.stderr.on('data', (c: Buffer) => (stderr += c));
    const kill = setTimeout(() => p.kill('SIGKILL'), options.timeoutMs ?? 30_000);
    p.once('error', reject);
    p.once('exit', (code) => {
      clearTimeout(kill);
      resolve({ code, stdout, stderr });
    });
  });
}
