import { buildEpisode } from '../../../src/processors/rewards/transitions';
import { classifySpan } from '../../../src/processors/spans/classify';
import type { AgentSpanRecord } from '../../../src/model/records';
import { globToRegExp } from '../../../src/processors/air/glob';
import { callRecord, corr } from '../../support/records';

const TRACE = 'a'.repeat(32);

function agentSpan(name: string, spanId: string, startedAt: number, endedAt: number, traceId = TRACE): AgentSpanRecord {
  return { type: 'agent_span', rolloutId: 'r', attemptId: '0', traceId, spanId, agentName: name, startedAt, endedAt, at: endedAt };
}

describe('agent names from GenAI agent spans', () => {
  it('classifies invoke_agent spans with gen_ai.agent.name, and nothing else, as agent spans', () => {
    const span = (attributes: Record<string, string>) =>
      ({
        traceId: TRACE,
        spanId: 'b'.repeat(16),
        name: 'x',
        kind: 1,
        startTimeUnixNano: '0',
        endTimeUnixNano: '1',
        attributes,
        resource: {},
        events: [],
        links: [],
        status: { code: 0 },
      }) as never;
    expect(classifySpan(span({ 'gen_ai.operation.name': 'invoke_agent', 'gen_ai.agent.name': 'writer' }))).toEqual({
      kind: 'agent',
      agent: { name: 'writer' },
    });
    expect(classifySpan(span({ 'gen_ai.operation.name': 'chat', 'gen_ai.agent.name': 'writer' })).kind).toBe('other');
    expect(classifySpan(span({ 'gen_ai.operation.name': 'invoke_agent' })).kind).toBe('other');
  });

  it('names the agent of each call from the innermost agent span of its trace that holds it, and selective capture uses it', () => {
    const calls = [
      callRecord('r', 0, 20, { traceId: TRACE, startedAt: 10 }),
      callRecord('r', 1, 130, { traceId: TRACE, startedAt: 120 }),
      callRecord('r', 2, 160, { traceId: TRACE, startedAt: 150, correlation: corr('r', { agentName: 'from-header' }) }),
      callRecord('r', 3, 320, { traceId: 'c'.repeat(32), startedAt: 310 }),
    ];
    // The orchestrator spans everything; the writer and the checker run inside it.
    const agentSpans = [agentSpan('orchestrator', 'o', 0, 400), agentSpan('writer', 'w', 5, 100), agentSpan('checker', 'k', 110, 200)];
    const build = (exclude: string[]) =>
      buildEpisode(
        { rolloutId: 'r', attemptId: '0', groupId: null, calls, toolSpans: [], agentSpans, rewards: [], finalReward: 1, startedAt: 0, endedAt: 400 },
        'completed',
        { credit: { mode: 'identical', gamma: 1 }, airWeight: 0, air: null, includeAgents: [], excludeAgents: exclude.map(globToRegExp) },
      );
    expect(build([]).transitions.map((t) => [t.seq, t.agent_name])).toEqual([
      [0, 'writer'],
      [1, 'checker'],
      [2, 'from-header'],
      [3, null],
    ]);
    expect(build(['checker']).transitions.map((t) => t.seq)).toEqual([0, 2, 3]);
  });
});
