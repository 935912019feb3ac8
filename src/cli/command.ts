import { parseArgs } from 'node:util';

/**
 * One definition per command: it drives strict parsing (Node's `util.parseArgs`) and renders the
 * command's help, so the two cannot drift apart.
 */
export interface OptionSpec {
  /** `integer` is parsed as a string and checked here: a non-negative whole number. */
  type: 'string' | 'boolean' | 'integer';
  short?: string;
  /** The value's placeholder in help, e.g. `FILE`. */
  value?: string;
  description: string;
}

export interface CommandSpec {
  name: string;
  summary: string;
  /** The argument part of the synopsis, e.g. `[--config FILE]`; one entry per form of the command. */
  synopsis: string | string[];
  positionals?: { name: string; required: boolean; description: string }[];
  options: Record<string, OptionSpec>;
  /** Lines printed after the options (examples, notes). */
  notes?: string[];
}

export type ParsedValues = Record<string, string | boolean | number | undefined>;

export interface Parsed {
  help: boolean;
  values: ParsedValues;
  positionals: string[];
}

/** A command line that cannot be run: printed with the command's usage, exit 2. */
export class UsageError extends Error {
  readonly code = 'USAGE';
  constructor(
    message: string,
    readonly command: CommandSpec | null,
  ) {
    super(message);
  }
}

const HELP: OptionSpec = { type: 'boolean', short: 'h', description: 'print this help and exit' };

export function parseCommand(spec: CommandSpec, argv: string[]): Parsed {
  const options: Record<string, { type: 'string' | 'boolean'; short?: string }> = {};
  for (const [name, o] of Object.entries({ ...spec.options, help: HELP })) {
    options[name] = { type: o.type === 'boolean' ? 'boolean' : 'string', ...(o.short ? { short: o.short } : {}) };
  }
  let parsed: { values: Record<string, string | boolean | (string | boolean)[] | undefined>; positionals: string[]; tokens: { kind: string; name?: string }[] };
  try {
    parsed = parseArgs({ args: argv, options, strict: true, allowPositionals: (spec.positionals?.length ?? 0) > 0, tokens: true });
  } catch (err) {
    // A help request wins over any other problem on the same line.
    if (argv.includes('--help') || argv.includes('-h')) return { help: true, values: {}, positionals: [] };
    throw new UsageError(`${spec.name}: ${describeParseError(err as Error & { code?: string })}`, spec);
  }
  if (parsed.values.help === true) return { help: true, values: {}, positionals: [] };
  // parseArgs keeps the last of a repeated option; a repeated flag is more likely a mistake.
  const given = parsed.tokens.filter((t) => t.kind === 'option').map((t) => t.name);
  const repeated = given.find((name, i) => given.indexOf(name) !== i);
  if (repeated) throw new UsageError(`${spec.name}: option --${repeated} given more than once`, spec);
  const values: ParsedValues = {};
  for (const [name, raw] of Object.entries(parsed.values)) {
    if (name === 'help' || raw === undefined || Array.isArray(raw)) continue;
    const o = spec.options[name];
    if (o.type === 'integer') {
      const s = String(raw);
      if (!/^\d+$/.test(s) || !Number.isSafeInteger(Number(s))) throw new UsageError(`${spec.name}: option --${name} wants a whole number, got '${s}'`, spec);
      values[name] = Number(s);
    } else if (o.type === 'string' && raw === '') {
      throw new UsageError(`${spec.name}: option --${name} wants a value`, spec);
    } else values[name] = raw;
  }
  const wanted = spec.positionals ?? [];
  if (parsed.positionals.length > wanted.length) throw new UsageError(`${spec.name}: unexpected argument '${parsed.positionals[wanted.length]}'`, spec);
  const missing = wanted.slice(parsed.positionals.length).find((p) => p.required);
  if (missing) throw new UsageError(`${spec.name}: ${missing.name} is required`, spec);
  return { help: false, values, positionals: parsed.positionals };
}

/** parseArgs' messages are long and mention its own API; ours name the flag and what to do. */
function describeParseError(err: Error & { code?: string }): string {
  const flag = /'(-[^' ]*)/.exec(err.message)?.[1] ?? '?';
  switch (err.code) {
    case 'ERR_PARSE_ARGS_UNKNOWN_OPTION':
      return `unknown option '${flag}'`;
    case 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE':
      if (err.message.includes('does not take an argument')) return `option '${flag}' takes no value`;
      if (err.message.includes('ambiguous')) return `option '${flag}' wants a value (write ${flag}=VALUE for a value starting with '-')`;
      return `option '${flag}' wants a value`;
    case 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL':
      return `unexpected argument '${/'([^']*)'/.exec(err.message)?.[1] ?? '?'}'`;
    default:
      return err.message;
  }
}

/** `usage: program command …`, one line per form. */
export function renderUsage(program: string, spec: CommandSpec): string {
  const forms = typeof spec.synopsis === 'string' ? [spec.synopsis] : spec.synopsis;
  return forms.map((f, i) => `${i === 0 ? 'usage: ' : '       '}${program} ${spec.name}${f ? ` ${f}` : ''}`).join('\n');
}

export function renderHelp(program: string, spec: CommandSpec): string {
  const lines = [renderUsage(program, spec), '', spec.summary];
  const args: [string, string][] = (spec.positionals ?? []).map((p) => [`  ${p.name}`, p.description]);
  const flags: [string, string][] = Object.entries({ ...spec.options, help: HELP }).map(([name, o]) => [
    `  ${o.short ? `-${o.short}, ` : '    '}--${name}${o.type === 'boolean' ? '' : ` ${o.value ?? (o.type === 'integer' ? 'N' : 'VALUE')}`}`,
    o.description,
  ]);
  const width = Math.max(...[...args, ...flags].map(([l]) => l.length)) + 2;
  const rows = (r: [string, string][]) => r.map(([l, d]) => `${l.padEnd(width)}${d}`);
  if (args.length > 0) lines.push('', 'arguments:', ...rows(args));
  lines.push('', 'options:', ...rows(flags));
  if (spec.notes?.length) lines.push('', ...spec.notes);
  return lines.join('\n') + '\n';
}

/** What a command talks to: its environment and the two output streams. */
export interface CliIo {
  env: NodeJS.ProcessEnv;
  out: NodeJS.WritableStream;
  err: NodeJS.WritableStream;
}

export interface Command {
  spec: CommandSpec;
  run(parsed: Parsed, io: CliIo): Promise<number>;
}
