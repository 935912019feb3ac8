import path from 'node:path';
import { boundAddress, startupLine } from '../../src/cli/startup-line';
import { loadConfig } from '../../src/config/load';

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
      'lightning-sidecar 1.2.3 ready: proxy 127.0.0.1:4000 → http://vllm:8000/v1 (vllm, configured); exporter files under /var/lib/ls; data /var/lib/ls; otlp grpc 127.0.0.1:4317; metrics http://0.0.0.0:9464/metrics',
    );
    expect(msg).not.toContain('\n');
    expect(fields).toMatchObject({
      proxy: '127.0.0.1:4000',
      upstream_flavor: 'vllm',
      upstream_detected: null,
      exporter: { kind: 'file', dir: '/var/lib/ls' },
      data_dir: '/var/lib/ls',
    });
  });

  it('names the brokers, topics and encoding of the Kafka exporter, and what detection found about the upstream', () => {
    const config = loadConfig({ env: { LIGHTNING_EXPORTER: 'kafka', LIGHTNING_KAFKA_BROKERS: 'k1:9092,k2:9092', LIGHTNING_DATA_DIR: 'rel' } });
    const { msg, fields } = startupLine(config, { ...facts, upstream: { ...facts.upstream, flavor: 'openai', detected: 'vllm 0.11 (token ids)' } });
    expect(msg).toContain(
      '→ http://vllm:8000/v1 (openai, detected: vllm 0.11 (token ids)); exporter kafka k1:9092,k2:9092 topics lightning.transitions, lightning.episodes (json);',
    );
    expect(msg).toContain(`data ${path.resolve('rel')};`);
    expect(fields).toMatchObject({ upstream_detected: 'vllm 0.11 (token ids)', exporter: { kind: 'kafka', brokers: ['k1:9092', 'k2:9092'] } });
  });

  it('puts the port actually bound into a configured endpoint', () => {
    expect(boundAddress('127.0.0.1:0', 43123)).toBe('127.0.0.1:43123');
    expect(boundAddress('[::1]:0', 5)).toBe('[::1]:5');
  });
});
