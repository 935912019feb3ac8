import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { OTLPTraceExporter as GrpcExporter } from '@opentelemetry/exporter-trace-otlp-grpc';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, type SpanExporter } from '@opentelemetry/sdk-trace-base';
import { Metadata } from '@grpc/grpc-js';
import OpenAI from 'openai';
import { ConfigError, loadConfig } from '../../src/config/load';
import { startFakeModelServer, type FakeModelServer } from '../support/fake-model-server';
import { startSidecar, type TestSidecar } from '../support/sidecar';

const TOKEN = 'lightning-test-token-0123456789';

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = path.join(dir, f);
    return statSync(p).isDirectory() ? filesUnder(p) : [p];
  });
}

/** Exports one span through a real OTel exporter; resolves with the export result code (0 = success). */
function exportOnce(exporter: SpanExporter): Promise<number> {
  return new Promise((resolve) => {
    const provider = new BasicTracerProvider({ resource: resourceFromAttributes({ 'lightning.rollout_id': 'auth-r' }), spanProcessors: [] });
    const span = provider
      .getTracer('t')
      .startSpan('execute_tool calc', { attributes: { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 'calc' } });
    span.end();
    exporter.export([span as never], (r) => resolve(r.code));
  });
}

describe('the optional API token (service.api_token)', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, { service: { api_token: TOKEN } });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  it('guards the rollout API (Bearer or x-api-key), with an OpenAI-shaped 401', async () => {
    // A call of the rollout first: a reward for a rollout that made none is a 404.
    const call = await fetch(`${sidecar.origin}/rollout/auth-r/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'policy', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(call.status).toBe(200);
    const post = (headers: Record<string, string>) =>
      fetch(`${sidecar.origin}/lightning/v1/rollouts/auth-r/reward`, { method: 'POST', headers, body: '{"value": 1, "final": false}' });
    const none = await post({});
    expect(none.status).toBe(401);
    expect(none.headers.get('www-authenticate')).toBe('Bearer');
    expect(((await none.json()) as { error: { type: string } }).error.type).toBe('authentication_error');
    expect((await post({ authorization: `Bearer ${TOKEN}x` })).status).toBe(401);
    expect((await post({ authorization: TOKEN })).status).toBe(401);
    expect((await post({ authorization: `Bearer ${TOKEN}` })).status).toBe(202);
    expect((await post({ 'x-api-key': TOKEN })).status).toBe(202);
    const events = await fetch(`${sidecar.origin}/api/rollouts/auth-r/attempt/0/events`, {
      method: 'POST',
      body: '{"event_type":"reward","data":{"value":1}}',
    });
    expect(events.status).toBe(401);
  });

  it('guards OTLP/HTTP and OTLP/gRPC: real exporters fail without the token and succeed with it', async () => {
    const httpUrl = `http://127.0.0.1:${sidecar.app.otlp!.httpPort()}/v1/traces`;
    const grpcUrl = `http://127.0.0.1:${sidecar.app.otlp!.grpcPort()}`;
    const raw = await fetch(httpUrl, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"resourceSpans":[]}' });
    expect(raw.status).toBe(401);
    expect(await exportOnce(new ProtoExporter({ url: httpUrl }))).toBe(1);
    expect(await exportOnce(new ProtoExporter({ url: httpUrl, headers: { authorization: `Bearer ${TOKEN}` } }))).toBe(0);
    expect(await exportOnce(new GrpcExporter({ url: grpcUrl }))).toBe(1);
    const md = new Metadata();
    md.set('authorization', `Bearer ${TOKEN}`);
    expect(await exportOnce(new GrpcExporter({ url: grpcUrl, metadata: md }))).toBe(0);
  });

  it('does not touch proxied calls: the agent’s Authorization is the upstream key, passed through', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/auth-r/v1`, apiKey: 'sk-upstream-key', maxRetries: 0 });
    await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
    expect(upstream.requests.at(-1)!.headers.authorization).toBe('Bearer sk-upstream-key');
  });

  it('never writes the token to a file or a log line', async () => {
    const written =
      filesUnder(sidecar.dataDir)
        .map((f) => readFileSync(f, 'latin1'))
        .join('\n') + sidecar.logs.join('\n');
    for (const form of [TOKEN, Buffer.from(TOKEN).toString('base64')]) expect(written).not.toContain(form);
  });

  it('is refused by config validation when short', () => {
    expect(() => loadConfig({ env: { LIGHTNING_API_TOKEN: 'short' } })).toThrow(ConfigError);
    expect(() => loadConfig({ env: { LIGHTNING_API_TOKEN: 'short' } })).toThrow(
      /service\.api_token \(from LIGHTNING_API_TOKEN\): must be at least 16 characters/,
    );
  });
});

describe('redaction of request-body fields (processors.capture.redact_request_fields)', () => {
  let upstream: FakeModelServer;
  let sidecar: TestSidecar;
  beforeAll(async () => {
    upstream = await startFakeModelServer({ flavor: 'vllm' });
    sidecar = await startSidecar(upstream.url, {
      receivers: { llm_proxy: { upstream_flavor: 'vllm' } },
      processors: { capture: { redact_request_fields: ['user', 'metadata.email', '**.ssn'] } },
    });
  });
  afterAll(async () => {
    await sidecar.stop();
    await upstream.close();
  });

  it('forwards the body untouched but never journals or exports the redacted values', async () => {
    const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/pii/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create({
      model: 'm',
      user: 'alice@example.org',
      metadata: { email: 'alice@example.org', team: 'rl' },
      messages: [{ role: 'user', content: 'hi' }],
      tools: [
        { type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { ssn: { type: 'string', description: '555-12-3456' } } } } },
      ],
    } as never);
    expect(upstream.requests[0].body.toString()).toContain('alice@example.org');
    expect((await fetch(`${sidecar.origin}/lightning/v1/rollouts/pii/reward`, { method: 'POST', body: '{"value":1}' })).status).toBe(202);
    await sidecar.waitForEpisodes(1);
    const [t] = sidecar.transitions();
    expect(t.request).toMatchObject({ user: '[REDACTED]', metadata: { email: '[REDACTED]', team: 'rl' } });
    expect(JSON.stringify(t.request)).toContain('"ssn":"[REDACTED]"');
    // Token ids are still exact: redaction only touches the recorded request.
    expect(t.prompt_token_ids!.length).toBeGreaterThan(0);
    const written = filesUnder(sidecar.dataDir)
      .map((f) => readFileSync(f, 'utf8'))
      .join('\n');
    expect(written).not.toContain('alice@example.org');
    expect(written).not.toContain('555-12-3456');
  });
});
