import { configSchema } from '../../../src/config/schema';
import { EpisodeAssembler } from '../../../src/processors/episodes/assembler';
import { callRecord, corr, toolSpan } from '../../support/records';

function assembler(extra: Record<string, unknown> = {}) {
  const c = configSchema.parse({ processors: { episodes: { tool_span_wait_ms: 100 }, ...extra } }).processors;
  return new EpisodeAssembler({ episodes: c.episodes, credit: c.credit, air: c.air, capture: c.capture });
}

describe('AIR on closed episodes', () => {
  it('gives each call the rewards of its tool calls and adds them to the credited final reward', () => {
    const a = assembler();
    a.apply(callRecord('r', 0, 10, { toolCalls: [{ id: 'ok1', name: 'calc', arguments: '{}' }] }));
    a.apply(
      callRecord('r', 1, 20, {
        toolCalls: [
          { id: 'bad1', name: 'sql', arguments: '{}' },
          { id: 'lost', name: 'sql', arguments: '{}' },
        ],
      }),
    );
    a.apply(callRecord('r', 2, 30));
    a.apply(toolSpan('r', 'sp-ok', 12, { toolCallId: 'ok1', toolName: 'calc' }));
    a.apply(toolSpan('r', 'sp-bad', 22, { toolCallId: 'bad1', toolName: 'sql', outcome: 'error' }));
    a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'primary', final: true, at: 40, source: 'rollout_api' });
    const [closed] = a.apply({ type: 'tick', at: 200 });
    const [t0, t1, t2] = closed.transitions;
    expect(t0.tool_calls).toEqual([{ id: 'ok1', name: 'calc', status: 'ok', reward: 0.1, span_id: 'sp-ok', join: 'tool_call_id' }]);
    expect(t1.tool_calls.map((t) => [t.status, t.reward])).toEqual([
      ['error', -0.5],
      ['missing', -0.25],
    ]);
    expect([t0.intermediate_reward, t1.intermediate_reward, t2.intermediate_reward]).toEqual([0.1, -0.75, null]);
    expect([t0.reward, t1.reward, t2.reward]).toEqual([1.1, 0.25, 1]);
    expect(t1.credit).toBe(1);
  });

  it('leaves tool outcomes unknown (null), not missing, when the rollout sent no tool span at all', () => {
    const a = assembler();
    a.apply(callRecord('r', 0, 10, { toolCalls: [{ id: 'x', name: 'calculator', arguments: '{}' }] }));
    a.apply({ type: 'end', rolloutId: 'r', attemptId: '0', at: 20 });
    const [closed] = a.apply({ type: 'tick', at: 200 });
    expect(closed.transitions[0].tool_calls[0]).toMatchObject({ status: null, reward: null });
    expect(closed.transitions[0].intermediate_reward).toBeNull();
  });

  it('honours the AIR weight and can be turned off', () => {
    for (const [air, expected] of [
      [{ weight: 2 }, 1.2],
      [{ enabled: false }, 1],
    ] as const) {
      const a = assembler({ air });
      a.apply(callRecord('r', 0, 10, { toolCalls: [{ id: 'x', name: 'calculator', arguments: '{}' }] }));
      a.apply(toolSpan('r', 's', 12, { toolCallId: 'x' }));
      a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'p', final: true, at: 20, source: 'rollout_api' });
      const [closed] = a.apply({ type: 'tick', at: 200 });
      expect(closed.transitions[0].reward).toBeCloseTo(expected);
    }
  });

  it('waits tool_span_wait_ms after the final reward for late tool spans', () => {
    const a = assembler();
    a.apply(callRecord('r', 0, 10, { toolCalls: [{ id: 'x', name: 'calculator', arguments: '{}' }] }));
    a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'p', final: true, at: 20, source: 'rollout_api' });
    expect(a.apply({ type: 'tick', at: 100 })).toEqual([]);
    a.apply(toolSpan('r', 'late', 12, { toolCallId: 'x', outcome: 'error', at: 110 }));
    const [closed] = a.apply({ type: 'tick', at: 120 });
    expect(closed.transitions[0].tool_calls[0]).toMatchObject({ status: 'error', span_id: 'late' });
  });

  it('emits only captured agents (selective capture) while excluded calls still count as activity', () => {
    const a = assembler({ capture: { include_agents: ['writer', 're*'], exclude_agents: ['rewriter-frozen'] } });
    const agents = ['writer', 'checker', 'rewriter', 'rewriter-frozen', null];
    agents.forEach((name, seq) => a.apply(callRecord('r', seq, 10 + seq, { correlation: corr('r', { agentName: name }) })));
    a.apply({ type: 'reward', rolloutId: 'r', attemptId: '0', value: 1, name: 'p', final: true, at: 30, source: 'rollout_api' });
    const [closed] = a.apply({ type: 'tick', at: 200 });
    expect(closed.transitions.map((t) => [t.seq, t.agent_name, t.is_last])).toEqual([
      [0, 'writer', false],
      [2, 'rewriter', true],
    ]);
    const b = assembler({ capture: { exclude_agents: ['checker'] }, episodes: { idle_timeout_ms: 1000 } });
    b.apply(callRecord('q', 0, 0, { correlation: corr('q', { agentName: 'writer' }) }));
    b.apply(callRecord('q', 1, 900, { correlation: corr('q', { agentName: 'checker' }) }));
    expect(b.apply({ type: 'tick', at: 1500 })).toEqual([]); // the checker's call kept the episode alive
  });
});
