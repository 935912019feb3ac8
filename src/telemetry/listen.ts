import type { Server } from 'node:http';
import { splitAddress } from '../config/address';

/**
 * Listening and closing for the sidecar's HTTP servers (the LLM proxy, the OTLP receiver's HTTP
 * side, the telemetry server). Here, in the lowest layer that has a server, so that all three
 * can use it (test/architecture/layers.test.ts).
 */

/** Binds `server` to `address` (`host:port`); rejects with the bind error (EADDRINUSE, EACCES). Resolves to the host. */
export async function listen(server: Server, address: string): Promise<string> {
  const [host, port] = splitAddress(address);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
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
