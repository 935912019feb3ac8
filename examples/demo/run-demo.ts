/**
 * `npm run demo`: the sidecar built from dist/, on its defaults, in front of a scripted
 * DEMO model server, with a small tool-using agent written with the real `openai` SDK.
 * Runs a GRPO-style group of rollouts, reports rewards, prints the transitions, exits 0.
 *
 * It reads the sidecar's output as any consumer does: NDJSON lines, parsed with JSON.parse
 * (fields in docs/output-contract.md). The stand-in model server is the test suite's
 * (examples/README.md says why).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { SpanStatusCode, type Tracer } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import OpenAI from 'openai';
import { startFakeModelServer, type ReceivedRequest, type Turn } from '../../test/support/fake-model-server';
import { startKafkaTestBroker, type KafkaTestBroker } from '../../test/support/kafka-broker';

/**
 * `npm run demo -- --kafka`: the same run with the Kafka exporter, against the project's own
 * Kafka test broker (no Kafka cluster is needed), read back by the Python trainer client's
 * `groups` command (clients/python; Debian's python3-confluent-kafka).
 */
const KAFKA = process.argv.includes('--kafka');

/** The fields of a `lightning.trajectory.v1` line this demo prints. */
interface Trajectory {
  trajectory_id: string;
  group_id: string | null;
  start_reason: string;
  prompt_length: number;
  token_ids: number[];
  loss_mask: number[];
  logprobs: number[] | null;
  turns: {
    seq: number;
    response_start: number;
    response_end: number;
    has_logprobs: boolean;
    finish_reason: string | null;
    tool_calls: { name: string | null; status: string | null }[];
    intermediate_reward: number | null;
  }[];
  token_rewards: { position: number; value: number }[];
  reward: number;
  [field: string]: unknown;
}

/** The fields of a `lightning.episode.v1` line this demo reads. */
interface EpisodeSummary {
  group_id: string | null;
}

const ROOT = path.resolve(__dirname, '../../..');
const DATA_DIR = path.join(ROOT, 'data');
const POPULATION: Record<string, number> = { Lisbon: 545_000, Porto: 232_000 };
const AREA_KM2: Record<string, number> = { Lisbon: 100, Porto: 41 };

/**
 * The demo model's script: look the city up, compute the density, answer. Sample 2 first asks for
 * a misspelt city (the tool fails: an AIR penalty on that call), recovers, then slips (multiplies).
 */
function demoScript(r: ReceivedRequest): Turn {
  const body = r.json as { messages: { role: string; content?: string }[] };
  const toolResults = body.messages.filter((m) => m.role === 'tool');
  const sample = Number(r.headers['x-rollout-id']?.toString().split('-').pop() ?? 0);
  const facts = toolResults.filter((m) => !m.content?.startsWith('error'));
  if (sample === 2 && toolResults.length === 0) return { toolCalls: [{ name: 'lookup_city', arguments: { city: 'Lisboa' } }] };
  if (facts.length === 0) return { toolCalls: [{ name: 'lookup_city', arguments: { city: 'Lisbon' } }] };
  if (facts.length === 1) {
    const f = JSON.parse(facts[0].content ?? '{}') as { population: number; area_km2: number };
    const expression = sample === 2 ? `${f.population} * ${f.area_km2}` : `${f.population} / ${f.area_km2}`;
    return { toolCalls: [{ name: 'calculator', arguments: { expression } }] };
  }
  return { content: `Lisbon has about ${facts[1].content} people per km².` };
}

const tools: OpenAI.Chat.ChatCompletionTool[] = [
  {
    type: 'function',
    function: {
      name: 'lookup_city',
      description: 'population and area of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  },
  {
    type: 'function',
    function: {
      name: 'calculator',
      description: 'evaluates a * b or a / b',
      parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
    },
  },
];

function runTool(name: string, args: string): string {
  const a = JSON.parse(args) as { city?: string; expression?: string };
  if (name === 'lookup_city') {
    const city = a.city ?? '';
    if (!Object.hasOwn(POPULATION, city)) throw new Error(`unknown city ${JSON.stringify(city)}`);
    return JSON.stringify({ population: POPULATION[city], area_km2: AREA_KM2[city] });
  }
  const m = /^\s*([\d.]+)\s*([*/])\s*([\d.]+)\s*$/.exec(a.expression ?? '');
  if (!m) throw new Error('cannot parse the expression');
  const v = m[2] === '*' ? Number(m[1]) * Number(m[3]) : Number(m[1]) / Number(m[3]);
  return String(Math.round(v));
}

/**
 * Tools run inside OTel GenAI `execute_tool` spans, exported over OTLP to the sidecar: the usual
 * instrumentation of an agent. The sidecar joins each span to the call that asked for the tool
 * (by `gen_ai.tool.call.id`) and turns its status into an intermediate (AIR) reward.
 */
function tracedTool(tracer: Tracer, call: { id: string; name: string; args: string }): string {
  const attributes = { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': call.name, 'gen_ai.tool.call.id': call.id };
  return tracer.startActiveSpan(`execute_tool ${call.name}`, { attributes }, (span) => {
    try {
      return runTool(call.name, call.args);
    } catch (err) {
      // A failed tool: status ERROR (and the exception) is what the sidecar reads as an error outcome.
      span.recordException(err as Error);
      span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
      return `error: ${(err as Error).message}`;
    } finally {
      span.end();
    }
  });
}

/** The agent: plain openai SDK code; the only sidecar-specific thing is the base URL and headers. */
async function agent(tracer: Tracer, baseURL: string, rolloutId: string, groupId: string, stream: boolean): Promise<string> {
  const client = new OpenAI({
    baseURL,
    apiKey: 'sk-demo-not-a-real-key',
    maxRetries: 0,
    defaultHeaders: { 'x-rollout-id': rolloutId, 'x-group-id': groupId, 'x-agent-name': 'density-agent' },
  });
  const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
    { role: 'system', content: 'You answer questions about cities using tools.' },
    { role: 'user', content: 'What is the population density of Lisbon?' },
  ];
  for (let step = 0; step < 8; step++) {
    const message = stream
      ? (await client.chat.completions.stream({ model: 'demo-policy', messages, tools }).finalChatCompletion()).choices[0].message
      : (await client.chat.completions.create({ model: 'demo-policy', messages, tools })).choices[0].message;
    messages.push(message);
    if (!message.tool_calls?.length) return message.content ?? '';
    for (const tc of message.tool_calls) {
      if (tc.type !== 'function') continue;
      messages.push({ role: 'tool', tool_call_id: tc.id, content: tracedTool(tracer, { id: tc.id, name: tc.function.name, args: tc.function.arguments }) });
    }
  }
  return '';
}

async function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

async function pickPort(preferred: number): Promise<number> {
  if (await portFree(preferred)) return preferred;
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

async function waitFor<T>(what: string, fn: () => T | null | Promise<T | null>, timeoutMs = 15_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== null) return v;
    if (Date.now() > until) throw new Error(`demo: timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function readNdjson<T>(dir: string): T[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith('.ndjson'))
    .sort()
    .flatMap((f) =>
      readFileSync(path.join(dir, f), 'utf8')
        .split('\n')
        .filter((l) => l.trim() !== ''),
    )
    .map((l) => JSON.parse(l) as T);
}

async function main(): Promise<void> {
  const model = await startFakeModelServer({ flavor: 'vllm', script: demoScript, model: 'demo-policy', chunkDelayMs: 1 });
  const proxyPort = await pickPort(4000);
  const grpcPort = await pickPort(4317);
  const httpPort = await pickPort(4318);
  const telemetryPort = await pickPort(9464);
  const runId = new Date()
    .toISOString()
    .replace(/[-:.TZ]/g, '')
    .slice(0, 14);
  const before = new Set(readNdjson<Trajectory>(path.join(DATA_DIR, 'trajectories')).map((t) => t.trajectory_id));

  console.log('lightning-sidecar demo');
  console.log(`  DEMO MODEL: a scripted stand-in that answers like vLLM (token ids, logprobs, tool calls, SSE) at ${model.url}`);
  console.log('  it is not a language model; its answers come from a script in examples/demo/run-demo.ts\n');

  const broker: KafkaTestBroker | null = KAFKA ? await startKafkaTestBroker() : null;
  const env = {
    ...process.env,
    ...(broker ? { LIGHTNING_EXPORTER: 'kafka', LIGHTNING_KAFKA_BROKERS: broker.brokers.join(',') } : {}),
    LIGHTNING_UPSTREAM_URL: model.url,
    LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
    LIGHTNING_PROXY_ADDR: `127.0.0.1:${proxyPort}`,
    LIGHTNING_OTLP_GRPC_ADDR: `127.0.0.1:${grpcPort}`,
    LIGHTNING_OTLP_HTTP_ADDR: `127.0.0.1:${httpPort}`,
    LIGHTNING_TELEMETRY_ADDR: `127.0.0.1:${telemetryPort}`,
    LIGHTNING_DATA_DIR: DATA_DIR,
    LIGHTNING_TOOL_SPAN_WAIT_MS: '200',
    LIGHTNING_LOG_LEVEL: 'warn',
  };
  const sidecar: ChildProcess = spawn(process.execPath, [path.join(ROOT, 'dist/main.js'), 'run'], { env, stdio: ['ignore', 'inherit', 'inherit'] });
  let exited = false;
  sidecar.once('exit', () => (exited = true));
  const origin = `http://127.0.0.1:${proxyPort}`;
  try {
    await waitFor('the sidecar to listen', async () => {
      if (exited) throw new Error('demo: the sidecar exited during start-up');
      try {
        return (await fetch(`http://127.0.0.1:${telemetryPort}/readyz`)).ok ? true : null;
      } catch {
        return null;
      }
    });
    console.log(`sidecar up: proxy ${origin}/v1, OTLP grpc :${grpcPort} http :${httpPort}, metrics http://127.0.0.1:${telemetryPort}/metrics`);
    console.log(`the agent runs a GRPO group of 3 rollouts of one task (group demo-${runId}), streamed and not\n`);

    const group = `demo-${runId}`;
    for (let i = 0; i < 3; i++) {
      const rolloutId = `${group}-${i}`;
      // One tracer per rollout: the rollout id rides on the OTel resource, as an agent-lightning
      // runner or a per-rollout worker sets it (instrumented HTTP clients can instead propagate
      // traceparent, which the sidecar also uses).
      const provider = new BasicTracerProvider({
        resource: resourceFromAttributes({ 'service.name': 'density-agent', 'lightning.rollout_id': rolloutId, 'lightning.group_id': group }),
        spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: `http://127.0.0.1:${httpPort}/v1/traces` }))],
      });
      const answer = await agent(provider.getTracer('density-agent'), `${origin}/v1`, rolloutId, group, i % 2 === 1);
      await provider.shutdown();
      const correct = /about 5450 people/.test(answer);
      const reward = correct ? 1 : 0;
      console.log(`  rollout ${rolloutId}: "${answer}" → reward ${reward}`);
      const res = await fetch(`${origin}/lightning/v1/rollouts/${rolloutId}/reward`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ value: reward }),
      });
      if (res.status !== 202) throw new Error(`demo: reward was not accepted (${res.status})`);
    }

    if (broker) {
      await printGroupsFromKafka(broker, group, model.responses);
      return;
    }
    const episodes = await waitFor('3 closed episodes', () => {
      const eps = readNdjson<EpisodeSummary>(path.join(DATA_DIR, 'episodes')).filter((e) => e.group_id === group);
      return eps.length >= 3 ? eps : null;
    });
    const trajectories = readNdjson<Trajectory>(path.join(DATA_DIR, 'trajectories')).filter((t) => !before.has(t.trajectory_id) && t.group_id === group);
    const short = (id: string) => id.replace(`${group}-`, '…-');
    console.log(`\n${trajectories.length} trajectories in ${episodes.length} episodes, one row per call:\n`);
    console.table(
      trajectories.flatMap((t) =>
        t.turns.map((turn) => ({
          trajectory: short(t.trajectory_id),
          call: turn.seq,
          'sampled ids at': `${turn.response_start}–${turn.response_end}`,
          logprobs: turn.has_logprobs ? 'yes' : 'no',
          finish: turn.finish_reason ?? '-',
          'tool (span status)': turn.tool_calls.map((c) => `${c.name} (${c.status ?? 'no span'})`).join(', ') || '-',
          AIR: turn.intermediate_reward ?? '-',
        })),
      ),
    );
    console.log("\nwhat a trainer gets, one row per trajectory (each rollout's calls continued each other: one segment each):\n");
    console.table(
      trajectories.map((t) => ({
        trajectory: short(t.trajectory_id),
        segment: t.start_reason,
        'token ids': t.token_ids.length,
        prompt: t.prompt_length,
        'sampled (mask 1)': t.loss_mask.reduce((a, b) => a + b, 0),
        'rewards at': t.token_rewards.map((r) => `${Number(r.value.toFixed(3))}@${r.position}`).join(' '),
        reward: Number(t.reward.toFixed(3)),
      })),
    );
    console.log(
      '\nrewards sit on sampled tokens: the final reward on the last one; AIR (weight 0.5) on the last token of the call that asked for the tool: a failed tool span costs it 0.5, a successful one earns 0.1.',
    );
    const sample = trajectories[0];
    console.log('\nfirst trajectory, abridged:');
    console.log(
      JSON.stringify(
        {
          ...sample,
          token_ids: `[${sample.token_ids.slice(0, 6).join(', ')}, …] (${sample.token_ids.length})`,
          loss_mask: `[${sample.loss_mask.slice(0, sample.prompt_length + 4).join(', ')}, …] (${sample.loss_mask.length})`,
          logprobs:
            sample.logprobs &&
            `[${sample.logprobs
              .slice(sample.prompt_length, sample.prompt_length + 4)
              .map((x) => Number(x.toFixed(3)))
              .join(', ')}, …] (from ${sample.prompt_length})`,
          turns: `${sample.turns.length} turns`,
        },
        null,
        2,
      ),
    );
    console.log(
      `\nwritten to ${path.relative(process.cwd(), path.join(DATA_DIR, 'trajectories')) || '.'}/*.ndjson and ${path.relative(process.cwd(), path.join(DATA_DIR, 'episodes'))}/*.ndjson`,
    );
    console.log('per-call transitions with request and response bodies too: LIGHTNING_EXPORT_RECORDS=both (docs/output-contract.md)');
    console.log('');
    console.log('point your own agent at it:');
    console.log('  export OPENAI_BASE_URL=http://127.0.0.1:4000/rollout/<rollout-id>/v1   # or send x-rollout-id');
    console.log('  export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318');
    console.log(`  curl -XPOST ${'http://127.0.0.1:4000'}/lightning/v1/rollouts/<rollout-id>/reward -d '{"value": 1.0}'`);
  } finally {
    if (!exited) {
      sidecar.kill('SIGTERM');
      await waitFor('the sidecar to stop', () => (exited ? true : null), 30_000);
    }
    await model.close();
    await broker?.close();
  }
  if (sidecar.exitCode !== 0) throw new Error(`demo: the sidecar exited with ${sidecar.exitCode}`);
  console.log('\nsidecar stopped cleanly (SIGTERM → drained → exit 0). demo done.');
}

/** The Python client reads the group from Kafka; its rows' ids are checked against the model server's answers. */
async function printGroupsFromKafka(broker: KafkaTestBroker, group: string, answers: Buffer[]): Promise<void> {
  await waitFor('3 episodes in Kafka', () =>
    broker.records('lightning.episodes').filter((r) => r.value?.toString().includes(group)).length >= 3 ? true : null,
  );
  const python = ['python3', '/usr/bin/python3'].find((p) => spawnSync(p, ['-c', 'import confluent_kafka'], { stdio: 'ignore' }).status === 0);
  if (!python) throw new Error('demo --kafka: needs python3 with confluent_kafka (Debian: apt-get install python3-confluent-kafka)');
  const out = path.join(mkdtempSync(path.join(os.tmpdir(), 'lightning-demo-')), 'groups.jsonl');
  const args = [
    '-m',
    'lightning_sidecar_client',
    'groups',
    '--brokers',
    broker.brokers.join(','),
    '--group-size',
    '3',
    '--group-id',
    `demo-${group}`,
    '--out',
    out,
    '--max-groups',
    '1',
  ];
  console.log(`
the trainer side: python3 ${args.join(' ')}`);
  // Not spawnSync: the test broker runs in this process and must keep answering meanwhile.
  const r = await new Promise<{ status: number | null; stderr: string }>((resolve) => {
    const p = spawn(python, args, { env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python') }, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    p.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const kill = setTimeout(() => p.kill('SIGKILL'), 60_000);
    p.once('exit', (status) => {
      clearTimeout(kill);
      resolve({ status, stderr });
    });
  });
  if (r.status !== 0) throw new Error(`demo --kafka: the Python client failed (${r.status}): ${r.stderr}`);
  if (!existsSync(out)) throw new Error(`demo --kafka: the Python client emitted no group: ${r.stderr}`);
  const [line] = readFileSync(out, 'utf8').trim().split('\n');
  const g = JSON.parse(line) as {
    uid: string;
    batch: { trajectory_id: string[]; prompt_ids: number[][]; response_ids: number[][]; response_mask: number[][]; reward: number[] };
  };
  // What the model server returned, call by call: each row must be exactly one call's prompt ids
  // followed by its answer's ids (its rollout's last call), its prompt the rollout's first.
  const served = answers.map(servedIds);
  const exact = g.batch.trajectory_id.filter((_, i) => {
    const ids = JSON.stringify([...g.batch.prompt_ids[i], ...g.batch.response_ids[i]]);
    return (
      served.some((c) => JSON.stringify([...c.prompt, ...c.answer]) === ids) &&
      served.some((c) => JSON.stringify(c.prompt) === JSON.stringify(g.batch.prompt_ids[i]))
    );
  }).length;
  console.log(`
group ${g.uid}: ${g.batch.trajectory_id.length} rows (one per trajectory), read from Kafka by the Python client
`);
  console.table(
    g.batch.trajectory_id.map((id, i) => ({
      trajectory: id.replace(`${group}-`, '…-'),
      'prompt ids': `[${g.batch.prompt_ids[i].slice(0, 4).join(', ')}, …] (${g.batch.prompt_ids[i].length})`,
      'response ids': `[${g.batch.response_ids[i].slice(0, 4).join(', ')}, …] (${g.batch.response_ids[i].length})`,
      'sampled (mask 1)': g.batch.response_mask[i].reduce((a, b) => a + b, 0),
      reward: Number(g.batch.reward[i].toFixed(3)),
    })),
  );
  console.log(`token ids equal to what the model server returned: ${exact} of ${g.batch.trajectory_id.length}`);
  if (exact !== g.batch.trajectory_id.length) throw new Error('demo --kafka: token ids differ from the model server’s');
}

/** A model server answer's prompt and answer ids, from its JSON body or its SSE events. */
function servedIds(body: Buffer): { prompt: number[]; answer: number[] } {
  const text = body.toString('utf8');
  const events = text.trimStart().startsWith('{')
    ? [text]
    : text
        .split('\n')
        .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
        .map((l) => l.slice(6));
  const out = { prompt: [] as number[], answer: [] as number[] };
  for (const e of events) {
    const x = JSON.parse(e) as { prompt_token_ids?: number[]; choices?: { token_ids?: number[] }[] };
    if (x.prompt_token_ids) out.prompt = x.prompt_token_ids;
    out.answer.push(...(x.choices?.[0]?.token_ids ?? []));
  }
  return out;
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  },
);
