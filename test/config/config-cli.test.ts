import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { ConfigError, loadConfig } from '../../src/config/load';

const run = promisify(execFile);
const MAIN = path.join(__dirname, '../../dist/main.js');
const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-config-'));

function file(name: string, text: string): string {
  const p = path.join(dir, name);
  writeFileSync(p, text);
  return p;
}

async function cli(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [MAIN, ...args], { env: { PATH: process.env.PATH, ...env }, timeout: 10_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('configuration', () => {
  it('has the documented defaults', () => {
    const c = loadConfig({ env: {} });
    expect(c.receivers.llm_proxy).toMatchObject({
      endpoint: '127.0.0.1:4000',
      upstream_url: 'http://127.0.0.1:8000/v1',
      upstream_flavor: 'auto',
      translate: ['responses', 'anthropic.messages'],
      strip_injected: true,
    });
    expect(c.receivers.otlp.protocols.grpc.endpoint).toBe('127.0.0.1:4317');
    expect(c.receivers.otlp.protocols.http.endpoint).toBe('127.0.0.1:4318');
    expect(c.service).toMatchObject({ exporter: 'file', data_dir: './data', telemetry: { endpoint: '0.0.0.0:9464' }, heap_headroom_mib: 32 });
    expect(c.exporters.kafka.topic).toBe('lightning.transitions');
    // Trajectories are what a trainer trains on: exported by default, on their own topic.
    expect(c.exporters.records).toBe('trajectories');
    expect(c.exporters.kafka.trajectories_topic).toBe('lightning.trajectories');
    expect(c.processors.episodes).toMatchObject({ idle_timeout_ms: 120_000, tool_span_wait_ms: 5_000 });
  });

  it('lets env vars override the YAML file', () => {
    const f = file('base.yaml', 'receivers:\n  llm_proxy:\n    upstream_url: http://yaml:8000/v1\n    endpoint: 127.0.0.1:5000\n');
    const c = loadConfig({
      file: f,
      env: {
        LIGHTNING_UPSTREAM_URL: 'http://env:9000/v1',
        LIGHTNING_KAFKA_BROKERS: 'a:9092, b:9092',
        LIGHTNING_EXPORTER: 'kafka',
        LIGHTNING_TOOL_SPAN_WAIT_MS: '250',
        LIGHTNING_EXPORT_RECORDS: 'both',
        LIGHTNING_KAFKA_TRAJECTORIES_TOPIC: 'rl.trajectories',
      },
    });
    expect([c.exporters.records, c.exporters.kafka.trajectories_topic]).toEqual(['both', 'rl.trajectories']);
    expect(c.receivers.llm_proxy.upstream_url).toBe('http://env:9000/v1');
    expect(c.receivers.llm_proxy.endpoint).toBe('127.0.0.1:5000');
    expect(c.exporters.kafka.brokers).toEqual(['a:9092', 'b:9092']);
    expect(c.processors.episodes.tool_span_wait_ms).toBe(250);
  });

  it('lists every problem as path: message, naming the env var a bad value came from', () => {
    const f = file('bad.yaml', 'receivers:\n  llm_proxy:\n    endpoint: nowhere\n    bogus: 1\nprocessors:\n  credit:\n    mode: everything\n');
    let problems: string[] = [];
    try {
      loadConfig({ file: f, env: { LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: 'soon', LIGHTNING_EXPORTER: 'kafka', LIGHTNING_EXPORT_RECORDS: 'all' } });
    } catch (err) {
      problems = (err as ConfigError).problems;
    }
    expect(problems).toEqual(
      expect.arrayContaining([
        'receivers.llm_proxy.endpoint: must be host:port, e.g. 127.0.0.1:4000',
        'receivers.llm_proxy.bogus: unknown key',
        expect.stringMatching(/^processors\.credit\.mode: invalid option/),
        expect.stringMatching(/^processors\.episodes\.idle_timeout_ms \(from LIGHTNING_EPISODE_IDLE_TIMEOUT_MS\): /),
        expect.stringMatching(/^exporters\.records \(from LIGHTNING_EXPORT_RECORDS\): invalid option/),
      ]),
    );
    expect(problems.length).toBeGreaterThanOrEqual(5);
  });

  it('takes a heap headroom from 0 (V8 decides) to 1024 MiB, and refuses others as path: message', () => {
    expect(loadConfig({ file: file('hg0.yaml', 'service:\n  heap_headroom_mib: 0\n'), env: {} }).service.heap_headroom_mib).toBe(0);
    for (const bad of ['-5', '2048', '1.5', 'lots']) {
      let problems: string[] = [];
      try {
        loadConfig({ file: file('hg.yaml', `service:\n  heap_headroom_mib: ${bad}\n`), env: {} });
      } catch (err) {
        problems = (err as ConfigError).problems;
      }
      expect(problems).toEqual([expect.stringMatching(/^service\.heap_headroom_mib: \S/)]);
    }
  });

  it('validate prints ok and exits 0 for a good file', async () => {
    const f = file('good.yaml', 'service:\n  data_dir: /tmp/x\n');
    const r = await cli(['validate', f]);
    expect(r).toMatchObject({ code: 0 });
    expect(r.stdout).toContain('ok');
  });

  it('validate prints path: message lines and exits 2 for a bad file', async () => {
    const f = file('bad2.yaml', 'exporters:\n  kafka:\n    topic: ""\nreceivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: "127.0.0.1:99999"\n');
    const r = await cli(['validate', f]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('exporters.kafka.topic: ');
    expect(r.stderr).toContain('receivers.otlp.protocols.grpc.endpoint: port must be 0-65535');
  });

  it('validate reports YAML syntax errors with their line', async () => {
    const f = file('syntax.yaml', 'receivers:\n  llm_proxy: [unclosed\n');
    const r = await cli(['validate', f]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/syntax\.yaml:\d+:\d+: /);
  });

  it('run refuses a bad env var with exit 2 before opening any port', async () => {
    const r = await cli(['run'], { LIGHTNING_PROXY_ADDR: 'localhost', LIGHTNING_UPSTREAM_FLAVOR: 'tgi' });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('receivers.llm_proxy.endpoint (from LIGHTNING_PROXY_ADDR): must be host:port');
    expect(r.stderr).toContain('receivers.llm_proxy.upstream_flavor (from LIGHTNING_UPSTREAM_FLAVOR): ');
  });
});
