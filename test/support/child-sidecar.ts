import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

/** The repository root, from test/support (ts-jest) or build/test/support (compiled scripts). */
const ROOT = [path.join(__dirname, '../..'), path.join(__dirname, '../../..')].find((d) => existsSync(path.join(d, 'package.json')))!;
const MAIN = path.join(ROOT, 'dist/main.js');

export interface ChildSidecar {
  proc: ChildProcess;
  origin: string;
  telemetryOrigin: string;
  otlpHttpPort: number;
  otlpGrpcPort: number;
  stderr: string[];
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/**
 * Runs the built sidecar (`dist/main.js run`) as a child process and waits until /readyz answers
 * 200. A free port can be taken by someone else's outgoing connection before the child binds it:
 * then it starts again on new ports (a few times).
 */
export async function startChildSidecar(env: Record<string, string>, args: string[] = [], readyTimeoutMs = 15_000): Promise<ChildSidecar> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(env, args, readyTimeoutMs);
    } catch (err) {
      if (attempt >= 3 || !/EADDRINUSE/.test((err as Error).message)) throw err;
    }
  }
}

async function startOnce(env: Record<string, string>, args: string[], readyTimeoutMs: number): Promise<ChildSidecar> {
  const [proxy, telemetry, grpc, http] = [await freePort(), await freePort(), await freePort(), await freePort()];
  const proc = spawn(process.execPath, [MAIN, 'run', ...args], {
    env: {
      PATH: process.env.PATH ?? '',
      LIGHTNING_PROXY_ADDR: `127.0.0.1:${proxy}`,
      LIGHTNING_TELEMETRY_ADDR: `127.0.0.1:${telemetry}`,
      LIGHTNING_OTLP_GRPC_ADDR: `127.0.0.1:${grpc}`,
      LIGHTNING_OTLP_HTTP_ADDR: `127.0.0.1:${http}`,
      // The suite reads transitions as well as trajectories; a test of the product default says so.
      LIGHTNING_EXPORT_RECORDS: 'both',
      ...env,
    },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const stderr: string[] = [];
  proc.stderr!.on('data', (c: Buffer) => stderr.push(c.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once('exit', (code, signal) => {
      // What the child logged, for the suite-wide secrets scan (test/support/secrets-scan.js).
      writeFileSync(path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-test-child-')), 'stderr.log'), stderr.join(''));
      resolve({ code, signal });
    }),
  );
  const child: ChildSidecar = {
    proc,
    origin: `http://127.0.0.1:${proxy}`,
    telemetryOrigin: `http://127.0.0.1:${telemetry}`,
    otlpHttpPort: http,
    otlpGrpcPort: grpc,
    stderr,
    exited,
    async kill(signal = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
  const until = Date.now() + readyTimeoutMs;
  let done = false;
  void exited.then(() => (done = true));
  for (;;) {
    if (done) throw new Error(`sidecar exited during start-up: ${stderr.join('')}`);
    try {
      // Ready, and the proxy port is this child's: a port can be taken by another test's
      // sidecar between freePort and the bind, and its /readyz would answer for a child that
      // exited with EADDRINUSE.
      if ((await fetch(`${child.telemetryOrigin}/readyz`)).ok && (await accepts(proxy)) && !done) return child;
    } catch {
      // not listening yet
    }
    if (Date.now() > until) {
      proc.kill('SIGKILL');
      throw new Error(`sidecar not ready after ${readyTimeoutMs / 1000} s: ${stderr.join('')}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Whether something accepts TCP connections on the port (no request is sent). */
function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}
