import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { freePort, startChildSidecar, type ChildSidecar } from '../support/child-sidecar';
import { needsDebianTool } from '../support/debian-tool';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';

const RULES = path.join(__dirname, '../../helm/lightning-sidecar/files/prometheus-rules.yaml');

/** A real Prometheus server (Debian package `prometheus`). */
const describeLive = needsDebianTool('prometheus', 'prometheus', 'test/deploy/alerts-live.test.ts') ? describe : describe.skip;

interface Alert {
  labels: Record<string, string>;
  state: string;
}

async function until<T>(what: string, probe: () => Promise<T | null>, ms: number): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const got = await probe().catch(() => null);
    if (got !== null) return got;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

describeLive('the alerting rules in a real Prometheus, scraping a real sidecar', () => {
  let upstream: FakeModelServer;
  let sidecar: ChildSidecar;
  let server: ChildProcess;
  let api: string;

  beforeAll(async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-alerts-'));
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    // A small capture cap, so one call with a long prompt is recorded truncated (capture_cap), and
    // a small journal that an open episode fills to its watermark (journal_full).
    writeFileSync(
      path.join(dir, 'sidecar.yaml'),
      [
        'receivers: { llm_proxy: { max_capture_bytes: 4096 } }',
        'service: { journal: { max_bytes: 40000, segment_bytes: 4096, high_watermark: 0.5 } }',
        '',
      ].join('\n'),
    );
    sidecar = await startChildSidecar({ LIGHTNING_UPSTREAM_URL: upstream.url, LIGHTNING_UPSTREAM_FLAVOR: 'vllm', LIGHTNING_DATA_DIR: path.join(dir, 'data') }, [
      '--config',
      path.join(dir, 'sidecar.yaml'),
    ]);
    const port = await freePort();
    api = `http://127.0.0.1:${port}`;
    // The labels a PodMonitor scrape would add, set by hand on a static target.
    writeFileSync(
      path.join(dir, 'prometheus.yml'),
      [
        'global: { scrape_interval: 1s, evaluation_interval: 1s }',
        `rule_files: [${JSON.stringify(RULES)}]`,
        'scrape_configs:',
        '  - job_name: sidecar',
        `    static_configs: [{ targets: [${JSON.stringify(new URL(sidecar.telemetryOrigin).host)}], labels: { namespace: agents, pod: agent-0 } }]`,
        '',
      ].join('\n'),
    );
    server = spawn(
      'prometheus',
      [
        `--config.file=${path.join(dir, 'prometheus.yml')}`,
        `--storage.tsdb.path=${path.join(dir, 'tsdb')}`,
        `--web.listen-address=127.0.0.1:${port}`,
        '--log.level=error',
      ],
      { stdio: ['ignore', 'ignore', 'inherit'] },
    );
    await until('Prometheus ready', async () => ((await fetch(`${api}/-/ready`)).ok ? true : null), 20_000);
  }, 40_000);

  afterAll(async () => {
    if (server && server.exitCode === null) {
      const exited = new Promise((r) => server.once('exit', r));
      server.kill('SIGTERM');
      await exited;
    }
    await sidecar?.kill();
    await upstream?.close();
  });

  async function query(expr: string): Promise<{ metric: Record<string, string>; value: [number, string] }[]> {
    const res = (await (await fetch(`${api}/api/v1/query?query=${encodeURIComponent(expr)}`)).json()) as { data: { result: [] } };
    return res.data.result;
  }

  async function alerts(): Promise<Alert[]> {
    return ((await (await fetch(`${api}/api/v1/alerts`)).json()) as { data: { alerts: Alert[] } }).data.alerts;
  }

  it("the first truncated capture after a start fires LightningSidecarCapturesTruncated for the sidecar's pod, and nothing else fires", async () => {
    // Scraped at 0 before anything happens: the counter's first event is an increase.
    await until(
      'two scrapes of the capture_cap counter at 0',
      async () => {
        const r = await query('count_over_time(lightning_sidecar_capture_drops_total{reason="capture_cap"}[1m])');
        return r.length === 1 && Number(r[0].value[1]) >= 2 ? true : null;
      },
      20_000,
    );
    expect(await alerts()).toEqual([]);

    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/alerts-1/v1`, apiKey: 'k', maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(16_384) }] });
    expect(answer.choices[0].message.content).toBeTruthy();

    const firing = await until(
      'the alert',
      async () => {
        const a = (await alerts()).filter((x) => x.state === 'firing');
        return a.length > 0 ? a : null;
      },
      20_000,
    );
    expect(firing.map((a) => a.labels)).toEqual([{ alertname: 'LightningSidecarCapturesTruncated', namespace: 'agents', pod: 'agent-0', severity: 'warning' }]);
  }, 60_000);

  it('captures dropped at a full journal fire LightningSidecarCapturesDropped (critical, journal_full); the journal alert is pending', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/fill/v1`, apiKey: 'k', maxRetries: 0 });
    const dropped = async () =>
      Number(
        (await (await fetch(`${sidecar.telemetryOrigin}/metrics`)).text()).match(
          /^lightning_sidecar_capture_drops_total\{reason="journal_full"\} (\d+)$/m,
        )?.[1],
      );
    // Captures of an open episode: nothing can leave the journal while it is open. Calls are served throughout.
    for (let i = 0; i < 200 && (await dropped()) === 0; i++) {
      const answer = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'y'.repeat(400) }] });
      expect(answer.choices[0].message.content).toBeTruthy();
    }
    expect(await dropped()).toBeGreaterThan(0);

    const byName = await until(
      'the critical alert',
      async () => {
        const a = await alerts();
        return a.some((x) => x.labels.alertname === 'LightningSidecarCapturesDropped' && x.state === 'firing') ? a : null;
      },
      20_000,
    );
    expect(byName.find((a) => a.labels.alertname === 'LightningSidecarCapturesDropped')!.labels).toEqual({
      alertname: 'LightningSidecarCapturesDropped',
      namespace: 'agents',
      pod: 'agent-0',
      reason: 'journal_full',
      severity: 'critical',
    });
    // The journal is past half its watermark; the alert waits its 2 minutes.
    await until(
      'the journal alert pending',
      async () => ((await alerts()).some((x) => x.labels.alertname === 'LightningSidecarJournalFilling') ? true : null),
      10_000,
    );
    const states = Object.fromEntries((await alerts()).map((a) => [a.labels.alertname, a.state]));
    expect(states).toEqual({
      LightningSidecarCapturesTruncated: 'firing',
      LightningSidecarCapturesDropped: 'firing',
      LightningSidecarJournalFilling: 'pending',
    });
  }, 60_000);
});
