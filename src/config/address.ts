/** `host:port` (IPv6 hosts in brackets) → [host, port], as listeners take them. */
export function splitAddress(addr: string): [string, number] {
  const i = addr.lastIndexOf(':');
  return [addr.slice(0, i).replace(/^\[|\]$/g, ''), Number(addr.slice(i + 1))];
}

/** `host:port` of a configured endpoint with the port actually bound. */
export function boundAddress(endpoint: string, port: number): string {
  return `${endpoint.slice(0, endpoint.lastIndexOf(':'))}:${port}`;
}
