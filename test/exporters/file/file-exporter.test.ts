import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createFileExporter } from '../../../src/exporters/file/file-exporter';
import { buildEpisode } from '../../../src/processors/rewards/transitions';
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
});
