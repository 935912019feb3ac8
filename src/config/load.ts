import { readFileSync } from 'node:fs';
import { parseDocument } from 'yaml';
import type { z } from 'zod';
import { configSchema, type Config } from './schema';
import { keysAt, nearestKey } from './suggest';

/** Env vars and the config key each one overrides (docs/configuration.md). */
export const ENV_KEYS: Record<string, { path: string[]; parse?: (v: string) => unknown }> = {
  LIGHTNING_UPSTREAM_URL: { path: ['receivers', 'llm_proxy', 'upstream_url'] },
  LIGHTNING_UPSTREAM_ROUTING: { path: ['receivers', 'llm_proxy', 'routing', 'policy'] },
  LIGHTNING_UPSTREAM_FLAVOR: { path: ['receivers', 'llm_proxy', 'upstream_flavor'] },
  LIGHTNING_PROXY_ADDR: { path: ['receivers', 'llm_proxy', 'endpoint'] },
  LIGHTNING_TOKEN_IN: { path: ['receivers', 'llm_proxy', 'token_in', 'enabled'], parse: toBoolean },
  LIGHTNING_TOKENIZER_DIR: { path: ['receivers', 'llm_proxy', 'token_in', 'tokenizer_dir'] },
  LIGHTNING_TOOL_CALL_PARSER: { path: ['receivers', 'llm_proxy', 'token_in', 'tool_call_parser'] },
  LIGHTNING_REASONING_PARSER: { path: ['receivers', 'llm_proxy', 'token_in', 'reasoning_parser'] },
  LIGHTNING_OTLP_GRPC_ADDR: { path: ['receivers', 'otlp', 'protocols', 'grpc', 'endpoint'] },
  LIGHTNING_OTLP_HTTP_ADDR: { path: ['receivers', 'otlp', 'protocols', 'http', 'endpoint'] },
  LIGHTNING_TELEMETRY_ADDR: { path: ['service', 'telemetry', 'endpoint'] },
  LIGHTNING_DATA_DIR: { path: ['service', 'data_dir'] },
  LIGHTNING_EXPORTER: { path: ['service', 'exporter'] },
  LIGHTNING_LOG_LEVEL: { path: ['service', 'log_level'] },
  LIGHTNING_API_TOKEN: { path: ['service', 'api_token'] },
  LIGHTNING_UI: { path: ['service', 'ui', 'enabled'], parse: toBoolean },
  LIGHTNING_CONTROL_TOPIC: { path: ['service', 'control', 'topic'] },
  LIGHTNING_POLICY_VERSION: { path: ['processors', 'policy', 'version'] },
  LIGHTNING_POLICY_VERSION_HEADER: { path: ['processors', 'policy', 'response_header'] },
  LIGHTNING_KAFKA_BROKERS: {
    path: ['exporters', 'kafka', 'brokers'],
    parse: (v) =>
      v
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s.length > 0),
  },
  LIGHTNING_KAFKA_TOPIC: { path: ['exporters', 'kafka', 'topic'] },
  LIGHTNING_KAFKA_EPISODES_TOPIC: { path: ['exporters', 'kafka', 'episodes_topic'] },
  LIGHTNING_KAFKA_TRAJECTORIES_TOPIC: { path: ['exporters', 'kafka', 'trajectories_topic'] },
  LIGHTNING_EXPORT_RECORDS: { path: ['exporters', 'records'] },
  LIGHTNING_KAFKA_ENCODING: { path: ['exporters', 'kafka', 'encoding'] },
  LIGHTNING_KAFKA_SASL_MECHANISM: { path: ['exporters', 'kafka', 'sasl', 'mechanism'] },
  LIGHTNING_KAFKA_SASL_USERNAME: { path: ['exporters', 'kafka', 'sasl', 'username'] },
  LIGHTNING_KAFKA_SASL_PASSWORD: { path: ['exporters', 'kafka', 'sasl', 'password'] },
  LIGHTNING_KAFKA_TLS: { path: ['exporters', 'kafka', 'tls', 'enabled'], parse: toBoolean },
  LIGHTNING_KAFKA_TLS_CA_FILE: { path: ['exporters', 'kafka', 'tls', 'ca_file'] },
  LIGHTNING_EPISODE_IDLE_TIMEOUT_MS: { path: ['processors', 'episodes', 'idle_timeout_ms'], parse: toNumber },
  LIGHTNING_TOOL_SPAN_WAIT_MS: { path: ['processors', 'episodes', 'tool_span_wait_ms'], parse: toNumber },
};

function toNumber(v: string): unknown {
  const n = Number(v);
  return v.trim() === '' || Number.isNaN(n) ? v : n;
}

/** The env var that sets a config key (`receivers.llm_proxy.endpoint` → `LIGHTNING_PROXY_ADDR`), if any. */
export function envVarOf(key: string): string | null {
  for (const [name, spec] of Object.entries(ENV_KEYS)) if (spec.path.join('.') === key) return name;
  return null;
}

/** An env var whose text is not a value of its kind; reported as `path (from ENV): message`. */
class EnvValueError extends Error {}

const TRUE = new Set(['true', '1', 'yes', 'on']);
const FALSE = new Set(['false', '0', 'no', 'off']);

/** Boolean env vars take true/false, 1/0, yes/no, on/off, in any case. */
function toBoolean(v: string): boolean {
  const t = v.trim().toLowerCase();
  if (TRUE.has(t)) return true;
  if (FALSE.has(t)) return false;
  throw new EnvValueError(`expected true or false (also 1/0, yes/no, on/off), got '${v.length > 40 ? `${v.slice(0, 40)}…` : v}'`);
}

export class ConfigError extends Error {
  readonly code = 'CONFIG_INVALID';
  constructor(readonly problems: string[]) {
    super(problems.join('\n'));
    this.name = 'ConfigError';
  }
}

export interface LoadOptions {
  /** YAML file path; undefined = none. */
  file?: string;
  env?: NodeJS.ProcessEnv;
  /** Overrides applied last, as parsed YAML would be (used by tests and the demo). */
  overrides?: Record<string, unknown>;
}

/** YAML, then env vars, then schema defaults. Every problem is listed, as `path: message`. */
export function loadConfig(options: LoadOptions = {}): Config {
  const problems: string[] = [];
  let raw: Record<string, unknown> = {};
  if (options.file !== undefined) {
    raw = readYaml(options.file, problems);
  }
  const fromEnv = new Map<string, string>();
  const envProblems: string[] = [];
  const env = options.env ?? {};
  for (const [name, spec] of Object.entries(ENV_KEYS)) {
    const value = env[name];
    if (value === undefined || value === '') continue;
    let parsed: unknown;
    try {
      parsed = spec.parse ? spec.parse(value) : value;
    } catch (err) {
      if (!(err instanceof EnvValueError)) throw err;
      envProblems.push(`${spec.path.join('.')} (from ${name}): ${err.message}`);
      continue;
    }
    setPath(raw, spec.path, parsed);
    fromEnv.set(spec.path.join('.'), name);
  }
  if (options.overrides) raw = deepMerge(raw, options.overrides);
  // A file that could not be read or parsed would only add noise from the schema.
  if (problems.length > 0) throw new ConfigError([...problems, ...envProblems]);

  const result = configSchema.safeParse(raw);
  if (!result.success) throw new ConfigError([...envProblems, ...formatIssues(result.error.issues, fromEnv)]);
  if (envProblems.length > 0) throw new ConfigError(envProblems);
  return result.data;
}

function readYaml(file: string, problems: string[]): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    problems.push(`${file}: cannot read config file (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
    return {};
  }
  const doc = parseDocument(text, { uniqueKeys: true });
  for (const e of doc.errors) {
    const line = e.linePos?.[0];
    problems.push(`${file}${line ? `:${line.line}:${line.col}` : ''}: ${e.message.split('\n')[0]}`);
  }
  if (doc.errors.length > 0) return {};
  const value: unknown = doc.toJS();
  if (value === null || value === undefined) return {};
  if (typeof value !== 'object' || Array.isArray(value)) {
    problems.push(`${file}: the top level must be a mapping`);
    return {};
  }
  return value as Record<string, unknown>;
}

/**
 * `path (from ENV): message` for each issue. An unknown key is one line each, with the nearest
 * valid key at its level (`did you mean upstream_url?`) or, when none is near, the valid keys there.
 */
export function formatIssues(issues: readonly z.core.$ZodIssue[], fromEnv = new Map<string, string>(), schema: z.core.$ZodType = configSchema): string[] {
  return issues.flatMap((issue) => {
    if (issue.code === 'unrecognized_keys') {
      const valid = keysAt(schema, issue.path) ?? [];
      return issue.keys.map((key) => `${joinPath([...issue.path, key])}: unknown key${unknownKeyHint(key, valid)}`);
    }
    // An array's element set by an env var (`exporters.kafka.brokers[1]`) names the var too.
    const envName = fromEnv.get(issue.path.map(String).join('.')) ?? fromEnv.get(issue.path.filter((k) => typeof k !== 'number').join('.'));
    return [`${joinPath(issue.path) || '(root)'}${envName ? ` (from ${envName})` : ''}: ${lowerFirst(issue.message)}`];
  });
}

function unknownKeyHint(key: string, valid: string[]): string {
  if (valid.length === 0) return '';
  const near = nearestKey(key, valid);
  return near !== null ? `; did you mean ${near}?` : `; valid keys here: ${valid.join(', ')}`;
}

/** `a.b[0].c`; a key that is not a plain word is quoted (`receivers[" "]`), so the path stays readable. */
function joinPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const k of path) {
    if (typeof k === 'number') out += `[${k}]`;
    else if (/^[A-Za-z0-9_-]+$/.test(String(k))) out += out ? `.${String(k)}` : String(k);
    else out += `[${JSON.stringify(String(k))}]`;
  }
  return out;
}

function lowerFirst(s: string): string {
  return s.length > 0 ? s[0].toLowerCase() + s.slice(1) : s;
}

function setPath(target: Record<string, unknown>, path: string[], value: unknown): void {
  let node = target;
  for (const key of path.slice(0, -1)) {
    const next = node[key];
    if (typeof next !== 'object' || next === null || Array.isArray(next)) node[key] = {};
    node = node[key] as Record<string, unknown>;
  }
  node[path[path.length - 1]] = value;
}

function deepMerge(base: Record<string, unknown>, over: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(over)) {
    const b = out[k];
    out[k] = isPlainObject(b) && isPlainObject(v) ? deepMerge(b, v) : v;
  }
  return out;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
