import { runSoak } from './soak';

describe('soak (short version; `npm run soak` runs the long one)', () => {
  it('mixed traffic through a Kafka outage, a retriable-error storm and a SIGKILL: the contract holds, RSS and fds stay bounded', async () => {
    const report = await runSoak({
      durationMs: 12_000,
      agents: 6,
      killsAt: [0.45, 0.6],
      kafkaDown: [0.15, 0.35],
      retryStorm: [0.7, 0.85],
      journalMaxBytes: 64 * 1024 * 1024,
      // Every rollout's calls start with 20 KiB of its own context: second calls are journaled as references.
      contextBytes: 20 * 1024,
    });
    const c = report.contract;
    expect({
      unknown: c.unknown,
      missing_calls: c.missing_calls,
      missing_episodes: c.missing_episodes,
      wrong_rewards: c.wrong_rewards,
      missing_span_joins: c.missing_span_joins,
      wrong_requests: c.wrong_requests,
    }).toEqual({ unknown: [], missing_calls: [], missing_episodes: [], wrong_rewards: [], missing_span_joins: [], wrong_requests: [] });
    expect(report.faults.kills).toBe(2);
    // No kill window: every call whose answer the agent received is exported.
    expect(c.missing_calls_in_kill_window).toEqual([]);
    expect(c.holds).toBe(true);
    expect(report.rollouts.rewarded).toBeGreaterThan(20);
    expect(report.calls.streamed).toBeGreaterThan(10);
    expect(report.spans.accepted).toBeGreaterThan(10);
    expect(report.kafka.distinct).toBeGreaterThanOrEqual(report.calls.accepted);
    // Bounded: no fd leak, RSS well under the memory bar.
    expect(report.peak.fds).toBeLessThan(200);
    expect(report.peak.rss_mib).toBeLessThan(300);
  }, 120_000);
});
