import type { ClosedEpisode } from '../../src/model/records';
import { createLogger } from '../../src/telemetry/logger';
import { beginCall, chatAnswer, endCall, startPipeline, tempDirs } from '../support/pipeline-calls';

/**
 * Shutdown closes the episodes still open (`service.drain_on_shutdown`) with `episode_status:
 * "shutdown"` and no final reward, and says so in its log, with what trainers should do about them.
 */

const dirs = tempDirs('lightning-shutdown-');
afterAll(() => dirs.remove());

type Log = { level: string; msg: string; [k: string]: unknown };

function openRollouts(service: Record<string, unknown>) {
  const logs: Log[] = [];
  const exported: ClosedEpisode[] = [];
  const logger = createLogger({ level: 'info', write: (l) => logs.push(JSON.parse(l) as Log) });
  const p = startPipeline(dirs.dir(), {}, (batch) => exported.push(...batch), service, { logger });
  return { p, logs, exported };
}

async function twoOpenRollouts(p: ReturnType<typeof startPipeline>): Promise<void> {
  await p.start();
  for (const rollout of ['a', 'b']) {
    const c = beginCall(p, rollout, 0, 'q');
    c.response(chatAnswer('x'));
    endCall(p, c);
  }
  await Promise.resolve();
  expect(p.assembler.openCount).toBe(2);
}

describe('shutdown with open episodes', () => {
  it('logs how many it closed and wrote with status shutdown and a null reward, and that trainers should filter them', async () => {
    const { p, logs, exported } = openRollouts({ drain_on_shutdown: true });
    await twoOpenRollouts(p);
    await p.shutdown();
    expect(exported.map((c) => [c.episode.rollout_id, c.episode.episode_status, c.episode.final_reward])).toEqual([
      ['a', 'shutdown', null],
      ['b', 'shutdown', null],
    ]);
    const line = logs.find((l) => /^shutdown closed/.test(l.msg));
    expect(line).toMatchObject({
      level: 'info',
      msg:
        'shutdown closed 2 open episodes, written with episode_status "shutdown" and a null final_reward: ' +
        'trainers should filter episode_status == "shutdown" (they become reward-0 rows otherwise)',
      shutdown_episodes: 2,
      exported: true,
    });
  });

  it('says the episodes were left for the next start when drain_on_shutdown is false', async () => {
    const { p, logs, exported } = openRollouts({ drain_on_shutdown: false });
    await twoOpenRollouts(p);
    await p.shutdown();
    expect(exported).toEqual([]);
    expect(logs.find((l) => /^shutdown left/.test(l.msg))?.msg).toBe(
      'shutdown left 2 open episodes in the journal; the next start resumes them (service.drain_on_shutdown is false)',
    );
  });

  it('says nothing about episodes when none was open', async () => {
    const { p, logs } = openRollouts({ drain_on_shutdown: true });
    await p.start();
    await p.shutdown();
    expect(logs.filter((l) => /^shutdown (closed|left)/.test(l.msg))).toEqual([]);
  });
});
