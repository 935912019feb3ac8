import { readFileSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { postReward, startSidecar } from '../support/sidecar';

/**
 * Every field a record carries is in docs/output-contract.md: the top-level fields of each record
 * in its own section's table, every nested field named somewhere on the page. Records come from
 * a real sidecar (vLLM-like and OpenAI-like upstreams, a failed call), so a field added to the
 * code without a line in the contract fails here.
 */
const DOC = readFileSync(path.join(__dirname, '../../docs/output-contract.md'), 'utf8');

/** The names in the first column of the tables under the heading that starts with `heading`. */
function documented(heading: string): Set<string> {
  const start = DOC.indexOf(`\n## ${heading}`);
  expect(start).toBeGreaterThanOrEqual(0);
  const end = DOC.indexOf('\n## ', start + 1);
  const names = new Set<string>();
  for (const line of DOC.slice(start, end < 0 ? undefined : end).split('\n')) {
    const first = /^\| ([^|]+) \|/.exec(line)?.[1];
    if (first) for (const m of first.matchAll(/`([a-z_]+)`/g)) names.add(m[1]);
  }
  return names;
}

/** Keys of nested objects (in arrays too), with where they were found. */
function nestedKeys(value: unknown, at: string, out: Map<string, string>): void {
  if (Array.isArray(value)) for (const v of value) nestedKeys(v, at, out);
  else if (value !== null && typeof value === 'object')
    for (const [k, v] of Object.entries(value)) {
      out.set(k, `${at}.${k}`);
      nestedKeys(v, `${at}.${k}`, out);
    }
}

describe('docs/output-contract.md documents every field', () => {
  const servers: FakeModelServer[] = [];
  afterAll(async () => {
    for (const s of servers) await s.close();
  });

  it('of trajectories, transitions and episodes from a real sidecar, and says why ids are missing whenever they are', async () => {
    const records: { kind: string; record: Record<string, unknown> }[] = [];
    for (const flavor of ['vllm', 'openai'] as const) {
      const upstream = await startFakeModelServer({
        flavor,
        fault: (r) =>
          (r.json?.messages as { content: string }[])[0].content === 'fail' ? { kind: 'status', status: 500, body: '{"error":{"message":"boom"}}' } : null,
      });
      servers.push(upstream);
      const sidecar = await startSidecar(upstream.url, { receivers: { llm_proxy: { upstream_flavor: flavor } }, exporters: { records: 'both' } });
      try {
        const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/c-${flavor}/v1`, apiKey: 'k', maxRetries: 0, defaultHeaders: { 'x-group-id': 'g' } });
        await client.chat.completions.create({
          model: 'm',
          messages: [{ role: 'user', content: 'hi' }],
          tools: [{ type: 'function', function: { name: 'calculator', parameters: {} } }],
        });
        await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'fail' }] }).catch(() => {});
        expect((await postReward(sidecar.origin, `c-${flavor}`, 1)).status).toBe(202);
        await sidecar.waitForEpisodes(1);
        for (const t of sidecar.transitions()) {
          records.push({ kind: 'Transition', record: t as unknown as Record<string, unknown> });
          if (t.prompt_token_ids === null || t.response_token_ids === null) expect(t.token_ids_missing).toEqual(expect.any(String));
          else expect(t.token_ids_missing).toBeNull();
        }
        for (const t of sidecar.trajectories()) records.push({ kind: 'Trajectory', record: t as unknown as Record<string, unknown> });
        for (const e of sidecar.episodes()) records.push({ kind: 'Episode', record: e as unknown as Record<string, unknown> });
      } finally {
        await sidecar.stop();
      }
    }
    expect(new Set(records.map((r) => r.kind))).toEqual(new Set(['Transition', 'Trajectory', 'Episode']));
    const undocumented: string[] = [];
    for (const { kind, record } of records) {
      const names = documented(kind);
      for (const key of Object.keys(record)) if (!names.has(key)) undocumented.push(`${kind}.${key}`);
      const nested = new Map<string, string>();
      for (const [key, value] of Object.entries(record)) if (!['request', 'response', 'usage'].includes(key)) nestedKeys(value, `${kind}.${key}`, nested);
      for (const [key, where] of nested) if (!DOC.includes(`\`${key}\``) && !DOC.includes(`{${key}`) && !DOC.includes(`, ${key}`)) undocumented.push(where);
    }
    expect([...new Set(undocumented)]).toEqual([]);
  });
});
