import { mkdtempSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { LISTENERS } from '../../src/config/listeners';
import { ListenError } from '../../src/telemetry/listen';
import { runToExit } from '../support/run-to-exit';

/**
 * A listening port already taken (an OpenTelemetry Collector on 4317/4318 beside the sidecar on a
 * GPU node, another sidecar) stops the start with one error line that names the setting and the
 * env var that move it, and the one that turns it off when there is one; exit 1, no stack trace.
 */

const MAIN = path.join(__dirname, '../../dist/main.js');

/** A server holding a loopback port, as another process would. */
function occupy(): Promise<{ port: number; close: () => Promise<void> }> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      resolve({ port: (s.address() as net.AddressInfo).port, close: () => new Promise<void>((r) => s.close(() => r())) });
    });
  });
}

/** A loopback port nothing listens on (the model server: the flavor is configured, nothing probes it). */
async function closedPort(): Promise<number> {
  const { port, close } = await occupy();
  await close();
  return port;
}

const CASES = [
  ['LIGHTNING_PROXY_ADDR', 'the LLM proxy (and the rollout API)', 'receivers.llm_proxy.endpoint (LIGHTNING_PROXY_ADDR)', ''],
  [
    'LIGHTNING_OTLP_GRPC_ADDR',
    'the OTLP/gRPC receiver',
    'receivers.otlp.protocols.grpc.endpoint (LIGHTNING_OTLP_GRPC_ADDR)',
    ', or turn it off with receivers.otlp.protocols.grpc.enabled: false',
  ],
  [
    'LIGHTNING_OTLP_HTTP_ADDR',
    'the OTLP/HTTP receiver',
    'receivers.otlp.protocols.http.endpoint (LIGHTNING_OTLP_HTTP_ADDR)',
    ', or turn it off with receivers.otlp.protocols.http.enabled: false',
  ],
  ['LIGHTNING_TELEMETRY_ADDR', 'the telemetry server (/metrics, /healthz, /readyz)', 'service.telemetry.endpoint (LIGHTNING_TELEMETRY_ADDR)', ''],
] as const;

describe('a listening port already in use', () => {
  it.each(CASES)(
    '%s: one error line naming the setting that moves it, exit 1',
    async (env, what, setting, off) => {
      const taken = await occupy();
      try {
        const ports = {
          LIGHTNING_PROXY_ADDR: '127.0.0.1:0',
          LIGHTNING_OTLP_GRPC_ADDR: '127.0.0.1:0',
          LIGHTNING_OTLP_HTTP_ADDR: '127.0.0.1:0',
          LIGHTNING_TELEMETRY_ADDR: '127.0.0.1:0',
          [env]: `127.0.0.1:${taken.port}`,
        };
        const r = await runToExit(process.execPath, [MAIN, 'run'], {
          env: {
            ...ports,
            LIGHTNING_DATA_DIR: mkdtempSync(path.join(os.tmpdir(), 'lightning-port-clash-')),
            LIGHTNING_UPSTREAM_URL: `http://127.0.0.1:${await closedPort()}/v1`,
            LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
          },
          timeoutMs: 20_000,
        });
        expect(r.code).toBe(1);
        const lines = r.stderr
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l) as { level: string; msg: string });
        const errors = lines.filter((l) => l.level === 'error');
        const usual = env.startsWith('LIGHTNING_OTLP') ? '; an OpenTelemetry Collector or agent on this node?' : '';
        expect(errors).toEqual([
          expect.objectContaining({
            msg: `start-up failed: cannot listen on 127.0.0.1:${taken.port} for ${what}: the address is already in use (EADDRINUSE${usual}); move it with ${setting}${off}`,
            err: expect.objectContaining({ code: 'EADDRINUSE' }) as unknown,
          }),
        ]);
        expect(r.stderr).not.toMatch(/\n\s+at /);
        expect(r.stderr).not.toContain('ready:');
      } finally {
        await taken.close();
      }
    },
    30_000,
  );

  it('names the reason for a port it may not bind', () => {
    const denied = Object.assign(new Error('listen EACCES: permission denied 0.0.0.0:80'), { code: 'EACCES' });
    expect(new ListenError('0.0.0.0:80', LISTENERS.proxy, denied).message).toBe(
      'cannot listen on 0.0.0.0:80 for the LLM proxy (and the rollout API): permission denied (EACCES; ports below 1024 need privileges); move it with receivers.llm_proxy.endpoint (LIGHTNING_PROXY_ADDR)',
    );
    // gRPC says the errno only in its message.
    const grpc = new Error('No address added out of total 1 resolved errors: [listen EADDRINUSE: address already in use 127.0.0.1:4317]');
    expect(new ListenError('127.0.0.1:4317', LISTENERS.otlpGrpc, grpc).code).toBe('EADDRINUSE');
  });
});
