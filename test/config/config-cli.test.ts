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
        // Nothing near 'bogus': the keys valid at that level.
        expect.stringMatching(
          /^receivers\.llm_proxy\.bogus: unknown key; valid keys here: endpoint, upstream_url, routing, upstream_flavor, .*, secret_headers, token_in$/,
        ),
        expect.stringMatching(/^processors\.credit\.mode: invalid option/),
        expect.stringMatching(/^processors\.episodes\.idle_timeout_ms \(from LIGHTNING_EPISODE_IDLE_TIMEOUT_MS\): /),
        expect.stringMatching(/^exporters\.records \(from LIGHTNING_EXPORT_RECORDS\): invalid option/),
      ]),
    );
    expect(problems.length).toBeGreaterThanOrEqual(5);
  });

  function problemsOf(options: Parameters<typeof loadConfig>[0]): string[] {
    try {
      loadConfig(options);
    } catch (err) {
      return (err as ConfigError).problems;
    }
    return [];
  }

  it('takes true/false, 1/0, yes/no, on/off in any case for boolean env vars, and names the accepted words otherwise', () => {
    for (const [text, value] of [
      ['yes', true],
      ['ON', true],
      ['1', true],
      ['True', true],
      ['no', false],
      ['off', false],
      ['0', false],
      ['FALSE', false],
    ] as const) {
      expect(loadConfig({ env: { LIGHTNING_TOKEN_IN: text } }).receivers.llm_proxy.token_in.enabled).toBe(value);
      expect(loadConfig({ env: { LIGHTNING_KAFKA_TLS: text } }).exporters.kafka.tls?.enabled).toBe(value);
    }
    expect(problemsOf({ env: { LIGHTNING_TOKEN_IN: 'maybe', LIGHTNING_KAFKA_TLS: 'enabled', LIGHTNING_EXPORT_RECORDS: 'all' } })).toEqual([
      "receivers.llm_proxy.token_in.enabled (from LIGHTNING_TOKEN_IN): expected true or false (also 1/0, yes/no, on/off), got 'maybe'",
      "exporters.kafka.tls.enabled (from LIGHTNING_KAFKA_TLS): expected true or false (also 1/0, yes/no, on/off), got 'enabled'",
      expect.stringMatching(/^exporters\.records \(from LIGHTNING_EXPORT_RECORDS\): invalid option/),
    ]);
  });

  it('suggests the nearest valid key for an unknown one, or lists the keys valid there', () => {
    const f = file(
      'typos.yaml',
      [
        'recievers:',
        '  llm_proxy: {}',
        'receivers:',
        '  llm_proxy:',
        '    upstream_urll: http://vllm:8000/v1',
        '    Token-In: {}',
        '    colour: blue',
        'processors:',
        '  air:',
        '    rules:',
        '      - { outcome: ok, rewrd: 1, reward: 1 }',
        '',
      ].join('\n'),
    );
    const problems = problemsOf({ file: f, env: {} });
    expect(problems).toEqual(
      expect.arrayContaining([
        'recievers: unknown key; did you mean receivers?',
        'receivers.llm_proxy.upstream_urll: unknown key; did you mean upstream_url?',
        'receivers.llm_proxy.Token-In: unknown key; did you mean token_in?',
        expect.stringMatching(/^receivers\.llm_proxy\.colour: unknown key; valid keys here: endpoint, upstream_url, routing, .*, token_in$/),
        'processors.air.rules[0].rewrd: unknown key; did you mean reward?',
      ]),
    );
    expect(problems).toHaveLength(5);
  });

  it('names exporters.kafka.brokers and LIGHTNING_KAFKA_BROKERS when brokers are missing or malformed', () => {
    expect(problemsOf({ env: { LIGHTNING_EXPORTER: 'kafka' } })).toEqual([
      'exporters.kafka.brokers: at least one broker is required when service.exporter is kafka: set exporters.kafka.brokers, or LIGHTNING_KAFKA_BROKERS=host:port,host:port',
    ]);
    expect(problemsOf({ env: { LIGHTNING_EXPORTER: 'kafka', LIGHTNING_KAFKA_BROKERS: 'kafka-0:9092,kafka-1' } })).toEqual([
      'exporters.kafka.brokers[1] (from LIGHTNING_KAFKA_BROKERS): must be host:port, e.g. kafka-0:9092 (exporters.kafka.brokers, or LIGHTNING_KAFKA_BROKERS=host:port,host:port)',
    ]);
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
