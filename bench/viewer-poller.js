'use strict';
// A client of the sidecar's viewer that behaves as its page does with somebody clicking through it:
// `GET /ui/api/now` every second, and for every recently closed episode it has not loaded yet, one
// `GET /ui/api/trajectory?id=` per trajectory segment (what opening each of them loads). The
// sidecar keeps closed episodes' trajectories only while somebody asks its /ui routes, so this is
// what makes it keep them. Everything is on 127.0.0.1 and bounded: polls, trajectories, time, and
// each request's own timeout.
const http = require('node:http');

/** One GET on 127.0.0.1; resolves with its status and body (a failure or timeout is status 0). */
function get(agent, port, urlPath, timeoutMs) {
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port, path: urlPath, method: 'GET', agent }, (res) => {
      const parts = [];
      res.on('data', (c) => parts.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(parts) }));
      res.on('error', () => resolve({ status: 0, body: null }));
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error('timeout')));
    req.on('error', () => resolve({ status: 0, body: null }));
    req.end();
  });
}

/**
 * Starts polling the viewer on telemetry port `port`: the first poll at once (as the page does on
 * opening), then one every `intervalMs` from the start of the last, never two at a time. It stops
 * by itself after `maxMs` or `maxPolls`, loads at most `maxTrajectories` trajectories, and stops
 * when told: `stop({ settle })` ends it and resolves with what it did; with `settle`, it first
 * waits for the next poll on its cadence (and the trajectories that poll loads), so that episodes
 * closed just before are loaded too: the poll it waits for is the first to start after the call.
 * `loaded` holds the closed episodes already loaded (by rollout, attempt and end time, the
 * viewer's own key); pollers that share it act as one page open throughout, loading each episode once.
 */
function startViewerPoller({
  port,
  intervalMs = 1000,
  maxMs = 600_000,
  maxPolls = 1000,
  maxTrajectories = 10_000,
  requestTimeoutMs = 10_000,
  loaded = new Set(),
}) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const deadline = performance.now() + maxMs;
  const stats = {
    polls: 0,
    now_bytes: 0,
    max_now_bytes: 0,
    max_open: 0,
    max_closed: 0,
    trajectories: 0,
    trajectory_bytes: 0,
    // Segments listed but gone from the viewer's ring by the time they were asked for (404).
    trajectories_missing: 0,
    // Trajectories whose JSON did not name the trajectory asked for.
    trajectories_wrong: 0,
    errors: 0,
    last_ring: null,
  };
  let stopping = false;
  let timer = null;
  let wake = null;
  // With `stop({ settle: true })`: the poll to wait for (the first to start after the call) and its waiter.
  let started = 0;
  let settleAfter = Infinity;
  let settleWaiter = null;

  const pollOnce = async () => {
    const r = await get(agent, port, '/ui/api/now', requestTimeoutMs);
    stats.polls++;
    if (r.status !== 200) {
      stats.errors++;
      return;
    }
    stats.now_bytes += r.body.length;
    stats.max_now_bytes = Math.max(stats.max_now_bytes, r.body.length);
    const now = JSON.parse(r.body.toString('utf8'));
    stats.max_open = Math.max(stats.max_open, now.open.length);
    stats.max_closed = Math.max(stats.max_closed, now.closed.length);
    stats.last_ring = now.ring;
    for (const e of now.closed) {
      const key = `${e.rollout_id}\u0000${e.attempt_id}\u0000${e.ended_at}`;
      if (loaded.has(key)) continue;
      loaded.add(key);
      for (const s of e.segments) {
        if (stats.trajectories >= maxTrajectories || performance.now() > deadline) return;
        const t = await get(agent, port, `/ui/api/trajectory?id=${encodeURIComponent(s.trajectory_id)}`, requestTimeoutMs);
        if (t.status === 404) stats.trajectories_missing++;
        else if (t.status !== 200) stats.errors++;
        else {
          stats.trajectories++;
          stats.trajectory_bytes += t.body.length;
          // The page parses it to draw every token; so does this client.
          if (JSON.parse(t.body.toString('utf8')).trajectory?.trajectory_id !== s.trajectory_id) stats.trajectories_wrong++;
        }
      }
    }
  };

  const loop = (async () => {
    while (!stopping && stats.polls < maxPolls && performance.now() < deadline) {
      const at = performance.now();
      const index = ++started;
      try {
        await pollOnce();
      } catch {
        stats.errors++;
      }
      if (index > settleAfter) {
        // A poll that began after `stop({ settle: true })` was called has run: stop here.
        settleWaiter();
        break;
      }
      if (stopping) break;
      await new Promise((resolve) => {
        wake = resolve;
        timer = setTimeout(resolve, Math.max(0, intervalMs - (performance.now() - at)));
      });
      wake = null;
    }
  })();

  return {
    stats,
    async stop({ settle = false } = {}) {
      if (settle && !stopping && stats.polls < maxPolls && performance.now() < deadline) {
        // Wait for the next poll on the cadence, unless the loop ends first (its bounds).
        settleAfter = started;
        await Promise.race([new Promise((resolve) => (settleWaiter = resolve)), loop]);
      }
      stopping = true;
      if (timer) clearTimeout(timer);
      if (wake) wake();
      await loop;
      agent.destroy();
      return { ...stats };
    },
  };
}

module.exports = { startViewerPoller };
