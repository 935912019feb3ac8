/**
 * `npm run demo`: the sidecar built from dist/, on its defaults, in front of a scripted
 * DEMO model server, with a small tool-using agent written with the real `openai` SDK.
 * Runs a GRPO-style group of rollouts, reports rewards, prints the trajectories, reads the group
 * back with the Python trainer client when a python3 here runs it, and exits 0 only when the
 * sidecar stopped on SIGTERM with status 0 and logged no error.
 *
 * It reads the sidecar's output as any consumer does: NDJSON lines, parsed with JSON.parse
 * (fields in docs/output-contract.md). The stand-in model server is the test suite's
 * (examples/README.md says why).
 *
 * Every command it prints either ran during the demo and works after it (the trainer side over
 * the files it leaves), or names its placeholders (your-vllm, your-kafka, ROLLOUT_ID).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { SpanStatusCode, type Tracer } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import OpenAI from 'openai';
import { loadConfig } from '../../src/config/load';
import { startFakeModelServer, type ReceivedRequest, type Turn } from '../../test/support/fake-model-server';
import { startKafkaTestBroker, type KafkaTestBroker } from '../../test/support/kafka-broker';

const USAGE = 'usage: npm run demo -- [--kafka] [--data-dir DIR]';

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

/** The fields of a `lightning.group.v1` line (the Python client's output) this demo reads. */
interface Group {
  uid: string;
  batch: { trajectory_id: string[]; prompt_ids: number[][]; response_ids: number[][]; response_mask: number[][]; reward: number[] };
}

const ROOT = path.resolve(__dirname, '../../..');
const POPULATION: Record<string, number> = { Lisbon: 545_000, Porto: 232_000 };
const AREA_KM2: Record<string, number> = { Lisbon: 100, Porto: 41 };
/** How long the sidecar has to stop after SIGTERM before the demo kills it (and fails). */
const STOP_MS = 30_000;

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

/** The agent: plain openai SDK code; the only sidecar-specific things are the base URL and headers. */
async function agent(tracer: Tracer, baseURL: string, headers: Record<string, string>, stream: boolean): Promise<string> {
  const client = new OpenAI({ baseURL, apiKey: 'sk-demo-not-a-real-key', maxRetries: 0, defaultHeaders: headers });
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

/** `fn`'s first value that is not null; stops at once when `stopWaiting` says the sidecar logged an error. */
async function waitFor<T>(what: string, fn: () => T | null | Promise<T | null>, stopWaiting?: () => boolean, timeoutMs = 15_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (stopWaiting?.()) throw new Error(`demo: the sidecar logged an error while the demo waited for ${what}`);
    const v = await fn();
    if (v !== null) return v;
    if (Date.now() > until) throw new Error(`demo: timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function readNdjson<T>(dir: string): T[] {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith('.ndjson'))
    .sort()
    .flatMap((f) => readLines(path.join(dir, f)))
    .map((l) => JSON.parse(l) as T);
}

function readLines(file: string): string[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '');
}

/** The last line of a program's stderr: its reason, when it failed, in the demo's one line. */
function lastLine(text: string): string {
  return text.trim().split('\n').pop() ?? '';
}

/** A path as the printed commands name it: relative to the working directory when inside it. */
function shown(p: string): string {
  const rel = path.relative(process.cwd(), p);
  return quote(rel === '' ? '.' : rel.startsWith('..') || path.isAbsolute(rel) ? p : rel);
}

/** One shell word. */
function quote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/** How the sidecar's run ended, as the demo saw it. */
export interface SidecarRun {
  /** The demo asked it to stop (SIGTERM): it had not exited before. */
  stopped: boolean;
  /** It did not exit within STOP_MS of SIGTERM and was killed. */
  killed: boolean;
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The messages of its error-level log lines. */
  errors: string[];
}

/**
 * Why the sidecar's run was not clean, or null: it must exit on the demo's SIGTERM, with status
 * 0, having logged no error. A drain that failed or lost records shows in one of these.
 */
export function sidecarProblem(run: SidecarRun): string | null {
  const status = run.signal ? `signal ${run.signal}` : `status ${run.code}`;
  const n = run.errors.length;
  const logged = n === 0 ? '' : `${n === 1 ? 'an error' : `${n} errors`}, the first: ${run.errors[0]}`;
  const also = logged && `; it logged ${logged}`;
  if (!run.stopped) return `the sidecar exited on its own before the demo stopped it (${status})${also}`;
  if (run.killed) return `the sidecar did not exit within ${STOP_MS / 1000} s of SIGTERM and was killed${also}`;
  if (run.code !== 0) return `the sidecar exited with ${status} after SIGTERM${also}`;
  if (n > 0) return `the sidecar exited with status 0 but logged ${logged}`;
  return null;
}

/** The message of an error-level line of the sidecar's JSON log, or null for any other line. */
export function errorMessage(line: string): string | null {
  let entry: unknown;
  try {
    entry = JSON.parse(line);
  } catch {
    return null;
  }
  if (typeof entry !== 'object' || entry === null || (entry as { level?: unknown }).level !== 'error') return null;
  const { msg, err } = entry as { msg?: unknown; err?: { message?: unknown } };
  return `${String(msg)}${typeof err?.message === 'string' ? ` (${err.message})` : ''}`;
}

/** The sidecar from dist/, its output passed through as it comes and its error lines kept. */
function startSidecar(env: NodeJS.ProcessEnv): { exited: () => boolean; errored: () => boolean; stop: () => Promise<SidecarRun> } {
  const child: ChildProcess = spawn(process.execPath, [path.join(ROOT, 'dist/main.js'), 'run'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const run: SidecarRun = { stopped: false, killed: false, code: null, signal: null, errors: [] };
  for (const [from, to] of [
    [child.stdout!, process.stdout],
    [child.stderr!, process.stderr],
  ] as const)
    createInterface({ input: from }).on('line', (line) => {
      to.write(`${line}\n`);
      const error = errorMessage(line);
      if (error !== null) run.errors.push(error);
    });
  // 'close', not 'exit': its last lines are read by then.
  let closed = false;
  const done = new Promise<void>((resolve) =>
    child.once('close', (code, signal) => {
      closed = true;
      run.code = code;
      run.signal = signal;
      resolve();
    }),
  );
  return {
    exited: () => closed,
    errored: () => run.errors.length > 0,
    async stop() {
      if (!closed) {
        run.stopped = true;
        child.kill('SIGTERM');
        const timer = setTimeout(() => {
          run.killed = true;
          child.kill('SIGKILL');
        }, STOP_MS);
        await done;
        clearTimeout(timer);
      }
      return run;
    },
  };
}

/** The first interpreter here that imports the client (from clients/python) and the modules given. */
function findPython(modules: string[]): string | null {
  const imports = ['lightning_sidecar_client.cli', ...modules].join(', ');
  const env = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python') };
  return ['python3', '/usr/bin/python3'].find((p) => spawnSync(p, ['-c', `import ${imports}`], { env, stdio: 'ignore' }).status === 0) ?? null;
}

/** The Python client's command line, as printed and as run (by the shell, from this directory). */
function pythonClient(python: string, args: string[]): string {
  return `PYTHONPATH=${shown(path.join(ROOT, 'clients/python'))} ${quote(python)} -m lightning_sidecar_client ${args.join(' ')}`;
}

/** Runs a printed command as the reader would. Not spawnSync: the test broker runs in this process. */
function sh(command: string, timeoutMs: number): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve) => {
    // Its own process group, so that a timeout ends the client too, not only the shell.
    const p = spawn('sh', ['-c', command], { detached: true, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    p.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const kill = setTimeout(() => process.kill(-p.pid!, 'SIGKILL'), timeoutMs);
    p.once('close', (code) => {
      clearTimeout(kill);
      resolve({ code, stderr });
    });
  });
}

async function main(argv: string[]): Promise<void> {
  let kafka = false;
  let dataDir = path.join(ROOT, 'data');
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--kafka') kafka = true;
    else if (argv[i] === '--data-dir' && argv[i + 1]) dataDir = path.resolve(argv[++i]);
    else throw new Error(`demo: unknown argument ${JSON.stringify(argv[i])}\n${USAGE}`);
  }
  // --kafka needs the client's Kafka side; without it the demo reads the group back only when it can.
  const python = findPython(kafka ? ['confluent_kafka'] : []);
  if (kafka && !python)
    throw new Error('demo --kafka: needs a python3 with confluent_kafka for the trainer client (Debian: apt-get install python3-confluent-kafka)');

  const model = await startFakeModelServer({ flavor: 'vllm', script: demoScript, model: 'demo-policy', chunkDelayMs: 1 });
  const proxyPort = await pickPort(4000);
  const grpcPort = await pickPort(4317);
  const httpPort = await pickPort(4318);
  const telemetryPort = await pickPort(9464);
  const runId = new Date()
    .toISOString()
    .replace(/[-:.TZ]/g, '')
    .slice(0, 14);
  const group = `demo-${runId}`;
  const before = new Set(readNdjson<Trajectory>(path.join(dataDir, 'trajectories')).map((t) => t.trajectory_id));

  console.log('lightning-sidecar demo');
  console.log(`  DEMO MODEL: a scripted stand-in that answers like vLLM (token ids, logprobs, tool calls, SSE) at ${model.url}`);
  console.log('  it is not a language model; its answers come from a script in examples/demo/run-demo.ts\n');

  const broker: KafkaTestBroker | null = kafka ? await startKafkaTestBroker() : null;
  const sidecar = startSidecar({
    ...process.env,
    ...(broker ? { LIGHTNING_EXPORTER: 'kafka', LIGHTNING_KAFKA_BROKERS: broker.brokers.join(',') } : {}),
    LIGHTNING_UPSTREAM_URL: model.url,
    LIGHTNING_UPSTREAM_FLAVOR: 'vllm',
    LIGHTNING_PROXY_ADDR: `127.0.0.1:${proxyPort}`,
    LIGHTNING_OTLP_GRPC_ADDR: `127.0.0.1:${grpcPort}`,
    LIGHTNING_OTLP_HTTP_ADDR: `127.0.0.1:${httpPort}`,
    LIGHTNING_TELEMETRY_ADDR: `127.0.0.1:${telemetryPort}`,
    LIGHTNING_DATA_DIR: dataDir,
    LIGHTNING_TOOL_SPAN_WAIT_MS: '200',
    LIGHTNING_LOG_LEVEL: 'warn',
  });
  const origin = `http://127.0.0.1:${proxyPort}`;
  let failure: string | null = null;
  try {
    await waitFor('the sidecar to listen', async () => {
      if (sidecar.exited()) throw new Error('demo: the sidecar exited during start-up');
      try {
        return (await fetch(`http://127.0.0.1:${telemetryPort}/readyz`)).ok ? true : null;
      } catch {
        return null;
      }
    });
    console.log(`sidecar up: proxy ${origin}/v1, OTLP grpc :${grpcPort} http :${httpPort}, metrics http://127.0.0.1:${telemetryPort}/metrics`);
    console.log(`the agent runs a GRPO group of 3 rollouts of one task (group ${group}), streamed and not\n`);

    for (let i = 0; i < 3; i++) {
      const rolloutId = `${group}-${i}`;
      // One tracer per rollout: the rollout id rides on the OTel resource, as an agent-lightning
      // runner or a per-rollout worker sets it (instrumented HTTP clients can instead propagate
      // traceparent, which the sidecar also uses).
      const provider = new BasicTracerProvider({
        resource: resourceFromAttributes({ 'service.name': 'density-agent', 'lightning.rollout_id': rolloutId, 'lightning.group_id': group }),
        spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: `http://127.0.0.1:${httpPort}/v1/traces` }))],
      });
      // Rollout 1 names itself in the base URL, the others in a header: the two ways the closing
      // lines offer an agent (the script reads the header, and treats its absence as sample 0).
      const headers = { 'x-group-id': group, 'x-agent-name': 'density-agent' };
      const answer =
        i === 1
          ? await agent(provider.getTracer('density-agent'), `${origin}/rollout/${rolloutId}/v1`, headers, true)
          : await agent(provider.getTracer('density-agent'), `${origin}/v1`, { ...headers, 'x-rollout-id': rolloutId }, false);
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

    // Waiting on is pointless once the sidecar logged an error (the demo fails on it anyway).
    const stopWaiting = sidecar.errored;
    if (broker) await readGroupFromKafka(broker, python!, dataDir, group, model.responses, stopWaiting);
    else await showFiles(dataDir, group, before, python, stopWaiting);
    printOwnSetup(kafka);
  } catch (err) {
    failure = err instanceof Error ? err.message : String(err);
  } finally {
    const run = await sidecar.stop();
    await model.close();
    await broker?.close();
    // The sidecar's own trouble first: a demo step that failed after it is likely its consequence.
    const problem = sidecarProblem(run);
    if (problem !== null) failure = `demo: ${problem}`;
  }
  if (failure !== null) throw new Error(failure);
  console.log('\nsidecar stopped on SIGTERM with status 0 and logged no error. demo done.');
}

/** The file exporter's output for this group, and the Python client's group read from those files. */
async function showFiles(dataDir: string, group: string, before: Set<string>, python: string | null, stopWaiting: () => boolean): Promise<void> {
  const episodes = await waitFor(
    '3 closed episodes',
    () => {
      const eps = readNdjson<EpisodeSummary>(path.join(dataDir, 'episodes')).filter((e) => e.group_id === group);
      return eps.length >= 3 ? eps : null;
    },
    stopWaiting,
  );
  const trajectories = readNdjson<Trajectory>(path.join(dataDir, 'trajectories')).filter((t) => !before.has(t.trajectory_id) && t.group_id === group);
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
  console.log(`\nwritten to ${shown(path.join(dataDir, 'trajectories'))}/*.ndjson and ${shown(path.join(dataDir, 'episodes'))}/*.ndjson`);
  const both = { LIGHTNING_UPSTREAM_URL: 'http://your-vllm:8000/v1', LIGHTNING_EXPORT_RECORDS: 'both' };
  if (loadConfig({ env: both }).exporters.records === 'both')
    console.log('per-call transitions with request and response bodies too: LIGHTNING_EXPORT_RECORDS=both (docs/output-contract.md)');

  if (!python) {
    console.log('\nthe trainer side (the Python client, clients/python) is not shown: no python3 here imports it');
    return;
  }
  // The command printed is the one run, so it works after the demo: over files that stay.
  const out = path.join(dataDir, 'groups.jsonl');
  const command = pythonClient(python, ['groups', '--data-dir', shown(dataDir), '--group-size', '3', '--out', shown(out)]);
  const r = await sh(command, 60_000);
  if (r.code !== 0) throw new Error(`demo: the Python client failed (status ${r.code}): ${lastLine(r.stderr)}`);
  const g = readLines(out)
    .map((l) => JSON.parse(l) as Group)
    .find((x) => x.uid === group);
  if (!g) throw new Error(`demo: the Python client did not write group ${group} to ${out}: ${lastLine(r.stderr)}`);
  const ids = new Map(trajectories.map((t) => [t.trajectory_id, JSON.stringify(t.token_ids)]));
  const equal = g.batch.trajectory_id.filter((id, i) => ids.get(id) === JSON.stringify([...g.batch.prompt_ids[i], ...g.batch.response_ids[i]])).length;
  console.log(
    `\nthe trainer side: the Python client read these files and appended the group to ${shown(out)} (run again, it appends only groups not there yet):`,
  );
  console.log(`  ${command}`);
  console.log(
    `group ${g.uid}: ${g.batch.trajectory_id.length} rows (prompt ids, response ids); equal to the trajectories' token ids above: ${equal} of ${trajectories.length}`,
  );
  if (equal !== trajectories.length || g.batch.trajectory_id.length !== trajectories.length)
    throw new Error('demo: the group’s rows differ from the trajectories');
}

/**
 * The Python client reads the group from the test broker (gone when the demo ends, so its command
 * is not printed); its rows' ids are checked against the model server's answers.
 */
async function readGroupFromKafka(
  broker: KafkaTestBroker,
  python: string,
  dataDir: string,
  group: string,
  answers: Buffer[],
  stopWaiting: () => boolean,
): Promise<void> {
  await waitFor(
    '3 episodes in Kafka',
    () => (broker.records('lightning.episodes').filter((r) => r.value?.toString().includes(group)).length >= 3 ? true : null),
    stopWaiting,
  );
  const out = path.join(dataDir, 'groups.jsonl');
  const r = await sh(
    pythonClient(python, ['groups', '--brokers', broker.brokers.join(','), '--group-size', '3', '--out', shown(out), '--max-groups', '1']),
    60_000,
  );
  if (r.code !== 0) throw new Error(`demo --kafka: the Python client failed (status ${r.code}): ${lastLine(r.stderr)}`);
  const g = readLines(out)
    .map((l) => JSON.parse(l) as Group)
    .find((x) => x.uid === group);
  if (!g) throw new Error(`demo --kafka: the Python client did not write group ${group} to ${out}: ${lastLine(r.stderr)}`);
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
  console.log(
    `\nthe trainer side: group ${g.uid}, ${g.batch.trajectory_id.length} rows (one per trajectory), read from Kafka by the Python client (clients/python) and appended to ${shown(out)}\n`,
  );
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
  // The same command against a cluster of one's own, with the demo's stopping point left out.
  console.log('\nagainst your own Kafka (your-kafka:9092 stands for your brokers), the same client, until stopped:');
  console.log(`  ${pythonClient(python, ['groups', '--brokers', 'your-kafka:9092', '--group-size', '3', '--out', 'groups.jsonl'])}`);
}

/**
 * How to run the sidecar in front of one's own model server. The addresses are the defaults the
 * config gives with just these settings; the rollout-in-the-URL form is the one rollout 1 used.
 */
function printOwnSetup(kafka: boolean): void {
  const env: Record<string, string> = {
    ...(kafka ? { LIGHTNING_EXPORTER: 'kafka', LIGHTNING_KAFKA_BROKERS: 'your-kafka:9092' } : {}),
    LIGHTNING_UPSTREAM_URL: 'http://your-vllm:8000/v1',
  };
  const config = loadConfig({ env });
  const proxy = `http://${config.receivers.llm_proxy.endpoint}`;
  const otlp = `http://${config.receivers.otlp.protocols.http.endpoint}`;
  console.log('\nin front of your own model server (your-vllm:8000 stands for it), on the default addresses:');
  console.log(
    `  ${Object.entries(env)
      .map(([k, v]) => `${k}=${v}`)
      .join(' ')} node ${shown(path.join(ROOT, 'dist/main.js'))} run`,
  );
  console.log(`  your agent: OPENAI_BASE_URL=${proxy}/rollout/ROLLOUT_ID/v1 (or the header x-rollout-id), OTEL_EXPORTER_OTLP_ENDPOINT=${otlp}`);
  console.log(`  each rollout's reward: curl -XPOST ${proxy}/lightning/v1/rollouts/ROLLOUT_ID/reward -d '{"value": 1.0}'`);
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

// Run as a program; a test imports it for sidecarProblem and errorMessage.
if (require.main === module)
  main(process.argv.slice(2)).then(
    () => process.exit(0),
    (err) => {
      console.error(err instanceof Error ? err.message : err);
      process.exit(1);
    },
  );
