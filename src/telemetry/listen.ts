import type { Server } from 'node:http';
import { splitAddress } from '../config/address';
import type { ListenerSetting } from '../config/listeners';

/**
 * Listening and closing for the sidecar's HTTP servers (the LLM proxy, the OTLP receiver's HTTP
 * side, the telemetry server). Here, in the lowest layer that has a server, so that all three
 * can use it (test/architecture/layers.test.ts).
 */

/**
 * A listening socket that could not be bound, said in one line with the setting that moves it
 * and, when it can be, the one that turns it off:
 * `cannot listen on 127.0.0.1:4318 for the OTLP/HTTP receiver: the address is already in use
 * (EADDRINUSE; …); move it with receivers.otlp.protocols.http.endpoint (LIGHTNING_OTLP_HTTP_ADDR), …`
 */
export class ListenError extends Error {
  readonly code: string;
  constructor(
    readonly address: string,
    readonly setting: ListenerSetting,
    cause: unknown,
  ) {
    const code = bindCode(cause);
    const env = setting.env ? ` (${setting.env})` : '';
    const off = setting.off ? `, or turn it off with ${setting.off}` : '';
    super(`cannot listen on ${address} for ${setting.what}: ${bindReason(code, cause, setting)}; move it with ${setting.key}${env}${off}`, { cause });
    this.name = 'ListenError';
    this.code = code ?? 'LISTEN_FAILED';
  }
}

/** The errno of a bind failure (gRPC only says it in its message). */
function bindCode(err: unknown): string | null {
  const code = (err as NodeJS.ErrnoException | null)?.code;
  if (typeof code === 'string') return code;
  return /\b(EADDRINUSE|EACCES|EADDRNOTAVAIL)\b/.exec(String((err as Error | null)?.message ?? err))?.[1] ?? null;
}

function bindReason(code: string | null, err: unknown, setting: ListenerSetting): string {
  switch (code) {
    case 'EADDRINUSE':
      return `the address is already in use (EADDRINUSE${setting.usual ? `; ${setting.usual}` : ''})`;
    case 'EACCES':
      return 'permission denied (EACCES; ports below 1024 need privileges)';
    case 'EADDRNOTAVAIL':
      return 'the host is not an address of this machine (EADDRNOTAVAIL)';
    default:
      return err instanceof Error ? err.message : String(err);
  }
}

/**
 * Binds `server` to `address` (`host:port`); resolves to the host. Rejects with the bind error
 * (EADDRINUSE, EACCES), as a `ListenError` naming the setting when `setting` is given.
 */
export async function listen(server: Server, address: string, setting?: ListenerSetting): Promise<string> {
  const [host, port] = splitAddress(address);
  await new Promise<void>((resolve, reject) => {
    const failed = (err: Error): void => reject(setting ? new ListenError(address, setting, err) : err);
    server.once('error', failed);
    server.listen(port, host, () => {
      server.off('error', failed);
      resolve();
    });
  });
  return host;
}

/** The port `server` listens on (0 when it does not). */
export function boundPort(server: Server): number {
  const a = server.address();
  return typeof a === 'object' && a ? a.port : 0;
}

/**
 * Stops accepting and resolves once the server has closed: idle connections close at once, busy
 * ones are cut after `graceMs` (at once when 0). Resolves at once when it was not listening.
 */
export function closeServer(server: Server, graceMs: number): Promise<void> {
  return new Promise<void>((resolve) => {
    if (!server.listening) return resolve();
    server.close(() => resolve());
    if (graceMs <= 0) {
      server.closeAllConnections();
      return;
    }
    server.closeIdleConnections();
    setTimeout(() => server.closeAllConnections(), graceMs).unref();
  });
}
