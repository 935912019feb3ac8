import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createFileExporter } from '../../../src/exporters/file/file-exporter';
import { buildEpisode } from '../../../src/processors/rewards/transitions';
import { rebuildPrompt } from '../../../src/trainer/prompt-delta';
import type { CallRecord, Transition } from '../../../src/model/records';
import { callRecord } from '../../support/records';

const episode = (rolloutId: string, calls: number) =>
  buildEpisode(
    {
      rolloutId,
      attemptId: '0',
      groupId: 'g',
      calls: Array.from({ length: calls }, (_, i) => callRecord(rolloutId, i, 10 + i)),
      toolSpans: [],
      rewards: [],
      finalReward: 1,
      startedAt: 0,
      endedAt: 100,
    },
    'completed',
    { credit: { mode: 'identical', gamma: 1 }, airWeight: 0, air: null, includeAgents: [], excludeAgents: [] },
  );

describe('file exporter', () => {
  it('writes NDJSON transitions and episodes, rotating files by size without splitting a line', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-file-'));
    const exporter = createFileExporter({ dir, maxFileBytes: 4096 });
    await exporter.start();
    for (let i = 0; i < 10; i++) await exporter.export([episode(`r${i}`, 3)]);
    await exporter.shutdown();
    const files = readdirSync(path.join(dir, 'transitions')).sort();
    expect(files.length).toBeGreaterThan(2);
    const lines = files.flatMap((f) =>
      readFileSync(path.join(dir, 'transitions', f), 'utf8')
        .trimEnd()
        .split('\n'),
    );
    expect(lines).toHaveLength(30);
    expect(lines.map((l) => JSON.parse(l).transition_id)).toEqual(Array.from({ length: 10 }, (_, i) => [0, 1, 2].map((s) => `r${i}/0/${s}`)).flat());
    for (const f of files) expect(readFileSync(path.join(dir, 'transitions', f)).length).toBeLessThanOrEqual(4096 + 2048);
    const eps = readdirSync(path.join(dir, 'episodes')).flatMap((f) =>
      readFileSync(path.join(dir, 'episodes', f), 'utf8')
        .trimEnd()
        .split('\n'),
    );
    expect(eps.map((l) => JSON.parse(l).rollout_id)).toEqual(Array.from({ length: 10 }, (_, i) => `r${i}`));
  });

  it('writes journaled bodies bigger than its read buffer, many to a batch, each line with its own bytes', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-file-'));
    const exporter = createFileExporter({ dir, maxFileBytes: 64 << 20 });
    await exporter.start();
    // Each body is ~600 KB of its own letter: a body read over a previous one before that one was
    // written would show in the line.
    const bodyOf = (offset: number) => Buffer.from(JSON.stringify({ messages: [{ role: 'user', content: String.fromCharCode(97 + offset).repeat(600_000) }] }));
    const read = (offsets: readonly number[], scratch?: Buffer): Buffer => {
      const body = Buffer.concat(offsets.map(bodyOf));
      if (!scratch || scratch.length < body.length) return body;
      body.copy(scratch);
      return scratch.subarray(0, body.length);
    };
    const batch = Array.from({ length: 12 }, (_, i) => {
      const closed = episode(`big${i}`, 1);
      closed.transitions[0].request = { raw: 'journal', offsets: [i], encoding: null, cuts: [] };
      return closed;
    });
    await exporter.export(batch, read);
    await exporter.shutdown();
    const lines = readdirSync(path.join(dir, 'transitions')).flatMap((f) =>
      readFileSync(path.join(dir, 'transitions', f), 'utf8')
        .trimEnd()
        .split('\n'),
    );
    expect(lines).toHaveLength(12);
    lines.forEach((l, i) => expect(JSON.parse(l).request).toEqual(JSON.parse(bodyOf(i).toString())));
  });

  describe('with prompt_ids: delta', () => {
    const options = { credit: { mode: 'identical' as const, gamma: 1 }, airWeight: 0, air: null, includeAgents: [], excludeAgents: [] };
    const facts = (rolloutId: string, calls: CallRecord[]) => ({
      rolloutId,
      attemptId: '0',
      groupId: null,
      calls,
      toolSpans: [],
      rewards: [],
      finalReward: null,
      startedAt: 0,
      endedAt: 20,
    });
    const linesOf = (dir: string): Transition[] =>
      readdirSync(path.join(dir, 'transitions')).flatMap((f) =>
        readFileSync(path.join(dir, 'transitions', f), 'utf8')
          .trimEnd()
          .split('\n')
          .map((l) => JSON.parse(l) as Transition),
      );
    const exportBoth = async (episodes: ReturnType<typeof buildEpisode>[], read?: (offsets: readonly number[], scratch?: Buffer) => Buffer) => {
      const out: Record<'full' | 'delta', Transition[]> = { full: [], delta: [] };
      for (const promptIds of ['full', 'delta'] as const) {
        const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-file-'));
        const exporter = createFileExporter({ dir, maxFileBytes: 64 << 20, promptIds });
        await exporter.export(episodes, read);
        await exporter.shutdown();
        out[promptIds] = linesOf(dir);
      }
      return out;
    };
    /** Each delta made whole as a consumer does, from the transition it names. */
    const rebuilt = (lines: (Transition & { prompt_token_ids_delta?: Parameters<typeof rebuildPrompt>[0] })[]) => {
      const byId = new Map<string, Transition>();
      return lines.map((t) => {
        let whole: Transition = t;
        if (t.prompt_token_ids_delta) {
          const r = rebuildPrompt(t.prompt_token_ids_delta, byId.get(t.prompt_token_ids_delta.previous_transition_id));
          if (!r.ok) throw new Error(r.reason);
          const { prompt_token_ids_delta: _d, ...rest } = t;
          whole = { ...rest, prompt_token_ids: r.prompt_token_ids };
        }
        byId.set(t.transition_id, whole);
        return whole;
      });
    };

    it('writes only the new prompt ids of a call that continues the previous one; the full prompt otherwise', async () => {
      const choice = (ids: number[]) => [
        { index: 0, finishReason: 'stop', responseTokenIds: ids, responseLogprobs: null, promptTokenIds: null, toolCalls: [] },
      ];
      const ep = buildEpisode(
        facts('d', [
          callRecord('d', 0, 10, { promptTokenIds: [1, 2], choices: choice([3, 4]) }),
          callRecord('d', 1, 11, { promptTokenIds: [1, 2, 3, 4, 5, 6], choices: choice([7]) }),
          callRecord('d', 2, 12, { promptTokenIds: [1, 2, 3, 4, 5, 6, 7], choices: choice([8]) }),
          callRecord('d', 3, 13, { promptTokenIds: [9, 9], choices: choice([8]) }),
        ]),
        'completed',
        options,
      );
      const { full, delta } = await exportBoth([ep]);
      const [t0, t1, t2, t3] = delta as (Transition & { prompt_token_ids_delta?: unknown })[];
      expect(t0.prompt_token_ids).toEqual([1, 2]);
      expect(t0.prompt_token_ids_delta).toBeUndefined();
      expect(t1.prompt_token_ids).toBeNull();
      expect(t1.prompt_token_ids_delta).toEqual({ previous_transition_id: 'd/0/0', prefix_length: 4, suffix: [5, 6] });
      // Nothing new: an empty suffix.
      expect(t2.prompt_token_ids_delta).toEqual({ previous_transition_id: 'd/0/1', prefix_length: 7, suffix: [] });
      expect(t3).toMatchObject({ prompt_token_ids: [9, 9], continues_previous: false });
      expect(t3.prompt_token_ids_delta).toBeUndefined();
      expect(rebuilt(delta)).toEqual(full);
    });

    it('slices the suffix out of the journaled answers as the model server wrote them, choice by choice', async () => {
      // Three calls of a growing conversation with two choices each; ids are read from the bodies.
      const prompts = [
        [5, 6, 7],
        [5, 6, 7, 10, 11, 100, 200],
        [5, 6, 7, 10, 11, 100, 200, 20, 21, 300],
      ];
      const answers = [
        [
          [10, 11],
          [12, 13, 14],
        ],
        [[20, 21], [22]],
        [[30], [31, 32]],
      ];
      const bodies = prompts.map((p, i) =>
        Buffer.from(
          JSON.stringify({
            id: `c${i}`,
            model: 'm',
            prompt_token_ids: p,
            choices: answers[i].map((a, n) => ({ index: n, message: { role: 'assistant', content: 'x' }, finish_reason: 'stop', token_ids: a })),
          }),
        ),
      );
      const read = (offsets: readonly number[]) => (offsets[0] >= 100 ? Buffer.from('{}') : bodies[offsets[0]]);
      const calls = prompts.map((_, i) =>
        callRecord('b', i, 10 + i, { bodies: { request: [100 + i], response: [i], encoding: null }, promptTokenIds: undefined, choices: undefined }),
      );
      const ep = buildEpisode(facts('b', calls), 'completed', { ...options, read });
      const { full, delta } = await exportBoth([ep], read);
      expect(full.map((t) => t.prompt_token_ids)).toEqual([prompts[0], prompts[0], prompts[1], prompts[1], prompts[2], prompts[2]]);
      const d = delta as (Transition & { prompt_token_ids_delta?: { previous_transition_id: string; prefix_length: number; suffix: number[] } })[];
      // The prefix is the previous call's first choice: its prompt, then its answer.
      expect(d.map((t) => t.prompt_token_ids_delta ?? null)).toEqual([
        null,
        null,
        { previous_transition_id: 'b/0/0.0', prefix_length: 5, suffix: [100, 200] },
        { previous_transition_id: 'b/0/0.0', prefix_length: 5, suffix: [100, 200] },
        { previous_transition_id: 'b/0/1.0', prefix_length: 9, suffix: [300] },
        { previous_transition_id: 'b/0/1.0', prefix_length: 9, suffix: [300] },
      ]);
      expect(rebuilt(delta)).toEqual(full);
    });
  });
});
