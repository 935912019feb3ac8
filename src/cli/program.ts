import { ConfigError } from '../config/load';
import { parseCommand, renderHelp, renderUsage, UsageError, type CliIo, type Command } from './command';
import { groupsCommand } from './groups';
import { runCommand } from './run';
import { tailCommand } from './tail';
import { validateCommand } from './validate';
import { packageVersion } from './version';

export const PROGRAM = 'lightning-sidecar';

const COMMANDS: Command[] = [runCommand, validateCommand, tailCommand, groupsCommand];

export function programHelp(): string {
  const width = Math.max(...COMMANDS.map((c) => c.spec.name.length)) + 3;
  return [
    `usage: ${PROGRAM} <command> [options]`,
    `       ${PROGRAM} [--config FILE]          (the run command)`,
    '',
    'Records the LLM calls and tool spans of an agent and exports them as RL transitions (Kafka or NDJSON files).',
    '',
    'commands:',
    ...COMMANDS.map((c) => `  ${c.spec.name.padEnd(width)}${c.spec.summary}`),
    '',
    'options:',
    "  -h, --help     print this help; `COMMAND --help` prints a command's help",
    '  -V, --version  print the version',
    '',
    'exit codes: 0 done, 1 failed while running, 2 bad command line or configuration',
    '',
  ].join('\n');
}

/**
 * Parses the command line strictly and runs one command. Nothing is started, opened or created
 * before the whole line has been understood: help and version print and return 0, a bad line
 * prints the usage on stderr and returns 2.
 */
export async function runProgram(argv: string[], io: CliIo): Promise<number> {
  const [first, ...rest] = argv;
  if (first === '--version' || first === '-V') {
    if (rest.length > 0) return usageError(io, new UsageError(`unexpected argument '${rest[0]}' after ${first}`, null));
    io.out.write(`${PROGRAM} ${packageVersion()}\n`);
    return 0;
  }
  if (first === '--help' || first === '-h' || first === 'help') {
    const topic = rest[0];
    if (topic === undefined) {
      io.out.write(programHelp());
      return 0;
    }
    const command = COMMANDS.find((c) => c.spec.name === topic);
    if (!command) return usageError(io, new UsageError(`no command '${topic}'`, null));
    io.out.write(renderHelp(PROGRAM, command.spec));
    return 0;
  }
  // No command word: `lightning-sidecar --config FILE` runs the sidecar, as container images expect.
  const [command, args] = first === undefined || first.startsWith('-') ? [runCommand, argv] : [COMMANDS.find((c) => c.spec.name === first), rest];
  if (!command) return usageError(io, new UsageError(`unknown command '${first}'`, null));
  const implicit = command === runCommand && first !== 'run';
  try {
    const parsed = parseCommand(command.spec, args);
    if (parsed.help) {
      io.out.write(renderHelp(PROGRAM, command.spec));
      return 0;
    }
    return await command.run(parsed, io);
  } catch (err) {
    // No command word: an option the run command does not know was meant for a command, or mistyped.
    if (err instanceof UsageError && implicit)
      return usageError(io, new UsageError(`${err.message.replace(/^run: /, '')} (no command given: run takes only --config)`, null));
    if (err instanceof UsageError) return usageError(io, err);
    if (err instanceof ConfigError) {
      io.err.write(err.problems.join('\n') + '\n');
      return 2;
    }
    throw err;
  }
}

function usageError(io: CliIo, err: UsageError): number {
  const usage = err.command
    ? `${renderUsage(PROGRAM, err.command)}\n(${PROGRAM} ${err.command.name} --help for the options)\n`
    : `usage: ${PROGRAM} <command> [options], commands: ${COMMANDS.map((c) => c.spec.name).join(', ')}\n(${PROGRAM} --help for more)\n`;
  io.err.write(`${PROGRAM}: ${err.message}\n${usage}`);
  return 2;
}
