import { h, render, type ComponentChildren } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { tokensHtml, type TrajectoryView } from './tokens';

/**
 * The viewer's page (docs/operations.md#the-viewer): three views chosen by the address's hash:
 * `#/` the sidecar now (open and recently closed episodes, gauges; polled every second),
 * `#/t/<trajectory id>` one trajectory, `#/g/<group id>` a GRPO group. It asks only the sidecar.
 */

type Json = Record<string, unknown>;

async function getJson<T>(url: string): Promise<T> {
  const r = await fetch(url, { credentials: 'same-origin' });
  if (!r.ok) throw new Error(`${r.status} ${await r.text()}`);
  return (await r.json()) as T;
}

function useHash(): string {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = () => setHash(location.hash);
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return hash;
}

function fmt(v: unknown): string {
  if (v === null || v === undefined) return '–';
  if (typeof v === 'number') return Number.isInteger(v) ? String(v) : v.toFixed(3);
  return String(v);
}

function table(cls: string, head: string[], rows: ComponentChildren[][]) {
  return h(
    'table',
    { class: cls },
    h('thead', null, h('tr', null, ...head.map((x) => h('th', null, x)))),
    h('tbody', null, ...rows.map((r) => h('tr', null, ...r.map((c) => h('td', null, c))))),
  );
}

interface Gauge {
  labels: Record<string, string>;
  value: number;
  /** A histogram's `_sum` or `_count`. */
  name?: string;
}

/** A histogram's mean (sum over count), null before its first observation. */
function mean(g: Gauge[] | undefined): number | null {
  const sum = gaugeSum(g, () => true, '_sum');
  const count = gaugeSum(g, () => true, '_count');
  return sum === null || !count ? null : sum / count;
}

function gaugeSum(g: Gauge[] | undefined, pick: (l: Record<string, string>) => boolean = () => true, suffix?: string): number | null {
  if (!g) return null;
  return g.filter((x) => pick(x.labels) && (suffix === undefined || (x.name ?? '').endsWith(suffix))).reduce((a, x) => a + x.value, 0);
}

function Gauges({ gauges }: { gauges: Record<string, Gauge[]> }) {
  const items: [string, string][] = [
    ['open episodes', fmt(gaugeSum(gauges.open_episodes))],
    ['journal bytes', fmt(gaugeSum(gauges.journal_bytes))],
    ['export backlog', fmt(gaugeSum(gauges.export_backlog_records))],
    ['export lag, mean (s)', fmt(mean(gauges.export_lag_seconds))],
    ['late records', fmt(gaugeSum(gauges.late_records))],
    ['rewards applied', fmt(gaugeSum(gauges.rewards, (l) => l.outcome === 'applied'))],
    ['rewards late (episode closed)', fmt(gaugeSum(gauges.rewards, (l) => l.outcome === 'episode_closed'))],
    ['rewards for unknown rollouts', fmt(gaugeSum(gauges.rewards, (l) => l.outcome === 'unknown_rollout'))],
    ['token-in fallbacks', fmt(gaugeSum(gauges.token_in_calls, (l) => l.result === 'fallback'))],
    ['replicas up', fmt(gaugeSum(gauges.replicas_up))],
  ];
  return h(
    'div',
    { class: 'gauges' },
    ...items.map(([k, v]) => h('div', { class: 'gauge' }, h('span', { class: 'gk' }, k), h('span', { class: 'gv', 'data-gauge': k }, v))),
  );
}

const STATUSES = ['', 'open', 'completed', 'timed_out', 'evicted', 'shutdown'];

function Now() {
  const [filter, setFilter] = useState({ rollout: '', group: '', agent: '', status: '' });
  const [data, setData] = useState<Json | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    let live = true;
    const q = new URLSearchParams(Object.entries(filter).filter(([, v]) => v !== ''));
    const poll = () =>
      getJson<Json>(`/ui/api/now?${q.toString()}`)
        .then((d) => live && (setData(d), setError(null)))
        .catch((e: Error) => live && setError(e.message));
    void poll();
    const timer = setInterval(poll, 1000);
    return () => {
      live = false;
      clearInterval(timer);
    };
  }, [filter.rollout, filter.group, filter.agent, filter.status]);
  const input = (key: keyof typeof filter) =>
    h(
      'label',
      null,
      key,
      ' ',
      h('input', { name: key, value: filter[key], onInput: (e: Event) => setFilter({ ...filter, [key]: (e.target as HTMLInputElement).value }) }),
    );
  const open = (data?.open as Json[] | undefined) ?? [];
  const closed = (data?.closed as Json[] | undefined) ?? [];
  const ring = data?.ring as Json | undefined;
  return h(
    'main',
    { class: 'now' },
    h('h1', null, 'lightning-sidecar · now'),
    error ? h('p', { class: 'error' }, error) : null,
    data ? h(Gauges, { gauges: data.gauges as Record<string, Gauge[]> }) : null,
    h(
      'form',
      { class: 'filters', onSubmit: (e: Event) => e.preventDefault() },
      input('rollout'),
      input('group'),
      input('agent'),
      h(
        'label',
        null,
        'status ',
        h(
          'select',
          { name: 'status', value: filter.status, onChange: (e: Event) => setFilter({ ...filter, status: (e.target as HTMLSelectElement).value }) },
          ...STATUSES.map((s) => h('option', { value: s }, s === '' ? 'any' : s)),
        ),
      ),
    ),
    h('h2', null, `Open episodes (${open.length})`),
    table(
      'open',
      ['rollout', 'attempt', 'group', 'agents', 'calls', 'in flight', 'tool spans', 'rewards', 'closing', 'started'],
      open.map((e) => [
        e.rollout_id as string,
        e.attempt_id as string,
        fmt(e.group_id),
        (e.agents as string[]).join(', '),
        fmt(e.calls),
        fmt(e.in_flight),
        fmt(e.tool_spans),
        fmt(e.rewards),
        e.closing ? 'yes' : '',
        fmt(e.started_at),
      ]),
    ),
    h('h2', null, `Recently closed (${closed.length})`),
    h(
      'p',
      { class: 'note' },
      `Kept while this page is open (the sidecar keeps nothing for the viewer while nobody looks): ${fmt(ring?.episodes)} episodes, ${fmt(ring?.bytes)} of ${fmt(ring?.max_bytes)} bytes.`,
    ),
    table(
      'closed',
      ['rollout', 'attempt', 'group', 'agents', 'status', 'final reward', 'calls', 'segments', 'tokens', 'left out', 'export'],
      closed.map((e) => [
        e.rollout_id as string,
        e.attempt_id as string,
        e.group_id ? h('a', { href: `#/g/${encodeURIComponent(e.group_id as string)}` }, e.group_id as string) : '–',
        (e.agents as string[]).join(', '),
        e.status as string,
        fmt(e.final_reward),
        fmt(e.calls),
        h(
          'span',
          null,
          ...(e.segments as Json[]).map((s) =>
            h(
              'a',
              { class: 'segment', href: `#/t/${encodeURIComponent(s.trajectory_id as string)}` },
              `${fmt(s.segment)}: ${s.start_reason as string} (${fmt(s.tokens)})`,
            ),
          ),
        ),
        fmt(e.tokens),
        fmt((e.unmerged_calls as unknown[]).length),
        h('span', { title: (e.export_error as string | null) ?? '' }, e.export as string),
      ]),
    ),
  );
}

function Trajectory({ id }: { id: string }) {
  const [data, setData] = useState<{ episode: Json; trajectory: TrajectoryView & Json } | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    getJson<{ episode: Json; trajectory: TrajectoryView & Json }>(`/ui/api/trajectory?id=${encodeURIComponent(id)}`)
      .then(setData)
      .catch((e: Error) => setError(e.message));
  }, [id]);
  if (error) return h('main', null, h('p', { class: 'error' }, error), h('a', { href: '#/' }, 'back'));
  if (!data) return h('main', null, h('p', null, 'loading…'));
  const t = data.trajectory;
  const e = data.episode;
  const sampled = t.loss_mask.reduce((a, b) => a + b, 0);
  const facts: [string, unknown][] = [
    ['rollout', t.rollout_id],
    ['attempt', t.attempt_id],
    ['group', t.group_id],
    ['segment', `${fmt(t.segment)} of ${fmt(t.segments)}`],
    ['started because', t.start_reason],
    ['parent', t.parent_trajectory_id],
    ['tokens', `${t.token_ids.length} (${sampled} sampled, prompt ${fmt(t.prompt_length)})`],
    ['final reward', t.final_reward],
    ['episode status', t.episode_status],
    ['policy versions', (t.policy_versions as string[] | undefined)?.join(', ')],
    ['routing coverage', t.routing_coverage],
    ['sampling-mask coverage', t.sampling_mask_coverage],
    ['weight versions', t.weight_versions ? t.weight_versions.map((w) => `${w.version} [${w.start}, ${w.end})`).join(', ') : null],
  ];
  const unmerged = (e.unmerged_calls as { transition_id: string; reason: string }[]) ?? [];
  return h(
    'main',
    { class: 'trajectory' },
    h('p', null, h('a', { href: '#/' }, '← now')),
    h('h1', null, `Trajectory ${t.trajectory_id}`),
    h('dl', { class: 'facts' }, ...facts.flatMap(([k, v]) => [h('dt', null, k), h('dd', { 'data-fact': k }, fmt(v))])),
    unmerged.length > 0
      ? h(
          'div',
          { class: 'unmerged' },
          h('h2', null, 'Calls left out'),
          table(
            'unmerged',
            ['transition', 'reason'],
            unmerged.map((u) => [u.transition_id, u.reason]),
          ),
        )
      : null,
    h(
      'p',
      { class: 'legend' },
      h('span', { class: 't c' }, 'context (loss mask 0)'),
      ' ',
      h('span', { class: 't s h0' }, 'sampled, logprob ≈ 0'),
      ' ',
      h('span', { class: 't s h9' }, 'sampled, logprob ≤ −4.5'),
      ' ',
      h('span', { class: 'reward' }, 'reward'),
    ),
    h('div', {
      class: 'tokens',
      dangerouslySetInnerHTML: { __html: tokensHtml(t) },
      // A context token's position and id, given on hover (not written on each of them).
      onMouseOver: (e: Event) => {
        const el = e.target as HTMLElement;
        if (!el.classList.contains('c') || el.title) return;
        const i = Number(el.dataset.i);
        el.title = `#${i} id ${t.token_ids[i]}`;
      },
    }),
  );
}

function Group({ id }: { id: string }) {
  const [data, setData] = useState<Json | null>(null);
  useEffect(() => {
    let live = true;
    const poll = () => getJson<Json>(`/ui/api/group?id=${encodeURIComponent(id)}`).then((d) => live && setData(d));
    void poll();
    const timer = setInterval(poll, 2000);
    return () => {
      live = false;
      clearInterval(timer);
    };
  }, [id]);
  if (!data) return h('main', null, h('p', null, 'loading…'));
  const eps = data.episodes as Json[];
  const longest = Math.max(1, ...eps.map((e) => e.tokens as number));
  return h(
    'main',
    { class: 'group' },
    h('p', null, h('a', { href: '#/' }, '← now')),
    h('h1', null, `GRPO group ${id}`),
    h(
      'p',
      null,
      `${eps.length} episodes · mean reward ${fmt(data.mean)} · std ${fmt(data.std)} · advantage = (reward − mean) / (std + 1e-6), a missing reward as 0`,
    ),
    table(
      'group',
      ['rollout', 'attempt', 'status', 'final reward', 'advantage', 'calls', 'segments', 'tokens'],
      eps.map((e) => [
        e.rollout_id as string,
        e.attempt_id as string,
        e.status as string,
        fmt(e.final_reward),
        h('span', { class: (e.advantage as number) >= 0 ? 'adv pos' : 'adv neg', 'data-advantage': String(e.advantage) }, fmt(e.advantage)),
        fmt(e.calls),
        h(
          'span',
          null,
          ...(e.segments as Json[]).map((s) => h('a', { class: 'segment', href: `#/t/${encodeURIComponent(s.trajectory_id as string)}` }, `${fmt(s.segment)}`)),
        ),
        h('span', { class: 'len' }, h('meter', { min: 0, max: longest, value: e.tokens as number }), ` ${fmt(e.tokens)}`),
      ]),
    ),
  );
}

function App() {
  const hash = useHash();
  const [, view, arg] = /^#\/(t|g)\/(.+)$/.exec(hash) ?? [];
  if (view === 't') return h(Trajectory, { id: decodeURIComponent(arg) });
  if (view === 'g') return h(Group, { id: decodeURIComponent(arg) });
  return h(Now, null);
}

render(h(App, null), document.getElementById('app')!);
