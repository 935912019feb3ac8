import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';

interface PollerStats {
  polls: number;
  max_open: number;
  max_closed: number;
  trajectories: number;
  trajectory_bytes: number;
  trajectories_missing: number;
  trajectories_wrong: number;
  errors: number;
  last_ring: { episodes: number } | null;
}
interface Poller {
  stats: PollerStats;
  stop: (o?: { settle?: boolean }) => Promise<PollerStats>;
}
// The bench is plain JavaScript run by node; its viewer client is loaded as it runs there.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { startViewerPoller } = require(path.join(__dirname, '../../bench/viewer-poller.js')) as {
  startViewerPoller: (o: { port: number; intervalMs?: number; maxMs?: number; maxPolls?: number; maxTrajectories?: number; loaded?: Set<string> }) => Poller;
};

interface Closed {
  rollout_id: string;
  attempt_id: string;
  ended_at: string;
  segments: { trajectory_id: string }[];
}

/** A stand-in for the sidecar's viewer routes: `/ui/api/now` lists `closed`; trajectories in `kept` answer, others 404. */
async function fakeViewer(): Promise<{
  port: number;
  closed: Closed[];
  kept: Set<string>;
  asked: string[];
  close: () => Promise<void>;
}> {
  const closed: Closed[] = [];
  const kept = new Set<string>();
  const asked: string[] = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    asked.push(url.pathname + url.search);
    if (url.pathname === '/ui/api/now') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ring: { episodes: closed.length }, open: [{}, {}], closed }));
      return;
    }
    const id = url.searchParams.get('id') ?? '';
    if (url.pathname === '/ui/api/trajectory' && kept.has(id)) {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ episode: {}, trajectory: { trajectory_id: id } }));
      return;
    }
    res.writeHead(404).end('{}');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    closed,
    kept,
    asked,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

const episode = (rollout: string, segments: string[]): Closed => ({
  rollout_id: rollout,
  attempt_id: 'a',
  ended_at: '2026-01-01T00:00:00Z',
  segments: segments.map((trajectory_id) => ({ trajectory_id })),
});

describe('bench viewer client', () => {
  it('polls at once and on its cadence, and loads every segment of each closed episode once', async () => {
    const v = await fakeViewer();
    v.closed.push(episode('r0', ['t0', 't1']));
    for (const id of ['t0', 't1']) v.kept.add(id);
    const p = startViewerPoller({ port: v.port, intervalMs: 40 });
    await new Promise((r) => setTimeout(r, 150));
    const s = await p.stop();
    await v.close();
    expect(s.polls).toBeGreaterThanOrEqual(3);
    expect(s.trajectories).toBe(2);
    expect(v.asked.filter((a) => a.startsWith('/ui/api/trajectory'))).toEqual(['/ui/api/trajectory?id=t0', '/ui/api/trajectory?id=t1']);
    expect(s).toMatchObject({ max_open: 2, max_closed: 1, trajectories_missing: 0, trajectories_wrong: 0, errors: 0, last_ring: { episodes: 1 } });
  });

  it('with settle, waits for a poll begun after the call, so an episode closed just before is loaded', async () => {
    const v = await fakeViewer();
    const p = startViewerPoller({ port: v.port, intervalMs: 100 });
    await new Promise((r) => setTimeout(r, 20));
    v.closed.push(episode('r1', ['t2']));
    v.kept.add('t2');
    const s = await p.stop({ settle: true });
    await v.close();
    expect(s.polls).toBe(2);
    expect(s.trajectories).toBe(1);
  });

  it('counts segments gone from the ring, shares what it loaded, and keeps to its bounds', async () => {
    const v = await fakeViewer();
    v.closed.push(episode('r2', ['t3', 'gone']), episode('r3', ['t4', 't5']));
    for (const id of ['t3', 't4', 't5']) v.kept.add(id);
    const loaded = new Set<string>();
    const first = await startViewerPoller({ port: v.port, intervalMs: 20, maxPolls: 2, maxTrajectories: 2, loaded }).stop({ settle: true });
    expect(first.polls).toBe(2);
    expect(first.trajectories).toBe(2);
    expect(first.trajectories_missing).toBe(1);
    // A second client sharing `loaded` asks nothing already loaded (r2 and r3 were both begun).
    const before = v.asked.length;
    const second = await startViewerPoller({ port: v.port, intervalMs: 20, maxPolls: 1, loaded }).stop({ settle: true });
    await v.close();
    expect(second.polls).toBe(1);
    expect(second.trajectories).toBe(0);
    expect(v.asked.slice(before)).toEqual(['/ui/api/now']);
  });
});
