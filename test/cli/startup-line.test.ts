import path from 'node:path';
import { boundAddress, noTokenIdsWarning, startupLine } from '../../src/cli/startup-line';
import { loadConfig } from '../../src/config/load';
import type { FlavorState } from '../../src/receivers/llm-proxy/flavor';

const facts = {
  version: '1.2.3',
  proxy: '127.0.0.1:4000',
  otlpGrpc: '127.0.0.1:4317',
  otlpHttp: null,
  telemetry: '0.0.0.0:9464',
  upstream: { url: 'http://vllm:8000/v1', flavor: 'vllm', detected: null },
};

describe('the run start-up line', () => {
  it('says where it listens, the upstream and its flavor, the exporter and the data dir, in one readable line', () => {
    const config = loadConfig({ env: { LIGHTNING_DATA_DIR: '/var/lib/ls', LIGHTNING_UPSTREAM_FLAVOR: 'vllm' } });
    const { msg, fields } = startupLine(config, facts);
    expect(msg).toBe(
      'lightning-sidecar 1.2.3 ready: proxy 127.0.0.1:4000 → http://vllm:8000/v1 (vllm, configured); routing sticky (1 replica); token-in off; ' +
        'exporter files under /var/lib/ls (trajectories, episodes); data /var/lib/ls; otlp grpc 127.0.0.1:4317; metrics http://0.0.0.0:9464/metrics',
    );
    expect(msg).not.toContain('\n');
    expect(fields).toMatchObject({
      proxy: '127.0.0.1:4000',
      upstream_flavor: 'vllm',
      upstream_detected: null,
      exporter: { kind: 'file', dir: '/var/lib/ls', records: ['trajectories', 'episodes'] },
      records: 'trajectories',
      routing: { policy: 'sticky', replicas: 1, urls: 1 },
      token_in: { enabled: false },
      data_dir: '/var/lib/ls',
    });
    expect(fields).not.toHaveProperty('warning');
  });

  it('names the brokers, topics and encoding of the Kafka exporter, and what detection found about the upstream', () => {
    const config = loadConfig({ env: { LIGHTNING_EXPORTER: 'kafka', LIGHTNING_KAFKA_BROKERS: 'k1:9092,k2:9092', LIGHTNING_DATA_DIR: 'rel' } });
    const { msg, fields } = startupLine(config, { ...facts, upstream: { ...facts.upstream, flavor: 'openai', detected: 'vllm 0.11 (token ids)' } });
    expect(msg).toContain(
      '→ http://vllm:8000/v1 (openai, detected: vllm 0.11 (token ids)); routing sticky (1 replica); token-in off; ' +
        'exporter kafka k1:9092,k2:9092 (json): trajectories → lightning.trajectories, episodes → lightning.episodes;',
    );
    expect(msg).toContain(`data ${path.resolve('rel')};`);
    expect(fields).toMatchObject({ upstream_detected: 'vllm 0.11 (token ids)', exporter: { kind: 'kafka', brokers: ['k1:9092', 'k2:9092'] } });
  });

  it('says whether token-in is on with its parsers, the routing policy over how many replicas and URLs, and which records go where', () => {
    const config = loadConfig({
      env: {
        LIGHTNING_TOKEN_IN: 'yes',
        LIGHTNING_UPSTREAM_ROUTING: 'round_robin',
        LIGHTNING_UPSTREAM_URL: 'http://a:8000/v1,http://b:8000/v1',
        LIGHTNING_EXPORT_RECORDS: 'both',
        LIGHTNING_DATA_DIR: '/d',
      },
    });
    const { msg, fields } = startupLine(config, { ...facts, routing: { replicas: 5, urls: 2 } });
    expect(msg).toContain(
      '; routing round_robin (5 replicas from 2 URLs); token-in on (tool-call parser hermes, reasoning parser qwen3); exporter files under /d (trajectories, transitions, episodes);',
    );
    expect(fields).toMatchObject({
      routing: { policy: 'round_robin', replicas: 5, urls: 2 },
      token_in: { enabled: true, tool_call_parser: 'hermes', reasoning_parser: 'qwen3' },
      records: 'both',
    });
    const kafka = loadConfig({ env: { LIGHTNING_EXPORTER: 'kafka', LIGHTNING_KAFKA_BROKERS: 'k:9092', LIGHTNING_EXPORT_RECORDS: 'transitions' } });
    expect(startupLine(kafka, { ...facts, routing: { replicas: 3, urls: 1 } }).msg).toContain(
      '; routing sticky (3 replicas); token-in off; exporter kafka k:9092 (json): transitions → lightning.transitions, episodes → lightning.episodes;',
    );
  });

  const state = (s: Partial<FlavorState>): FlavorState => ({ flavor: 'openai', source: 'unknown', evidence: '', serverVersion: null, rejected: null, ...s });

  it('warns, with the reason and the setting to change, when the model server is not identified as vLLM or SGLang', () => {
    const config = loadConfig({ env: {} });
    const unknown = state({ evidence: 'GET /v1/models: connect ECONNREFUSED 127.0.0.1:8000' });
    const { msg, fields, warning } = startupLine(config, {
      ...facts,
      upstream: { url: 'http://127.0.0.1:8000/v1', flavor: 'auto', detected: 'not identified', state: unknown },
    });
    expect(warning).not.toBeNull();
    expect(msg).toMatch(/; WARNING: the model server was not identified as vLLM or SGLang \(GET \/v1\/models: connect ECONNREFUSED 127\.0\.0\.1:8000\): /);
    expect(msg).toContain('calls will be recorded without token ids, so no trajectories will be written');
    expect(msg).toContain('set LIGHTNING_UPSTREAM_FLAVOR=vllm (or sglang; receivers.llm_proxy.upstream_flavor)');
    expect(msg).toContain('check LIGHTNING_UPSTREAM_URL (receivers.llm_proxy.upstream_url)');
    expect(msg).not.toContain('\n');
    expect(fields.warning).toBe(warning);
    // Answered as another server: the same consequence, and how to say it is intended.
    const other = noTokenIdsWarning(state({ source: 'detected', evidence: 'GET /v1/models: models owned by openai, not vllm or sglang' }));
    expect(other).toContain('answered as a server other than vLLM or SGLang (GET /v1/models: models owned by openai, not vllm or sglang)');
    expect(other).toContain('no trajectories will be written');
    expect(other).toContain('LIGHTNING_UPSTREAM_FLAVOR=openai says this is intended');
  });

  it('does not warn when the server is identified, or openai is configured on purpose', () => {
    expect(noTokenIdsWarning(state({ flavor: 'vllm', source: 'detected' }))).toBeNull();
    expect(noTokenIdsWarning(state({ flavor: 'sglang', source: 'detected' }))).toBeNull();
    expect(noTokenIdsWarning(state({ flavor: 'openai', source: 'config' }))).toBeNull();
    expect(noTokenIdsWarning(state({ flavor: 'vllm', source: 'config' }))).toBeNull();
  });

  it('puts the port actually bound into a configured endpoint', () => {
    expect(boundAddress('127.0.0.1:0', 43123)).toBe('127.0.0.1:43123');
    expect(boundAddress('[::1]:0', 5)).toBe('[::1]:5');
  });
});
