#!/usr/bin/env node
import { ConfigError, loadConfig } from './config/load';
import { createApp } from './pipeline/app';
import { createLogger } from './telemetry/logger';
import { GROUPS_USAGE, runGroups } from './cli/groups';
import { runTail } from './cli/tail';

const USAGE = `usage:
  lightning-sidecar [run] [--config FILE]     run the sidecar (config: FILE or $LIGHTNING_CONFIG, then env, then defaults)
  lightning-sidecar validate FILE             check a config file; problems are printed as 'path: message', exit 2
  lightning-sidecar tail [--data-dir DIR] [--follow] [--json]
                                              print transitions written by the file exporter
  lightning-sidecar tail --kafka [--brokers H:P,...] [--topic T] [--from-beginning] [--json] [--max N]
                                              print transitions from Kafka (a fresh consumer group)
${GROUPS_USAGE}`;

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv[0] && !argv[0].startsWith('-') ? argv : ['run', ...argv];
  switch (command) {
    case 'run':
      return run(rest);
    case 'validate':
      return validate(rest);
    case 'tail':
      return runTail(rest, { env: process.env, out: process.stdout, err: process.stderr });
    case 'groups':
      return runGroups(rest, { env: process.env, out: process.stdout, err: process.stderr });
    case 'help':
    case '--help':
      process.stdout.write(USAGE);
      return 0;
    default:
      process.stderr.write(`unknown command '${command}'\n${USAGE}`);
      return 2;
  }
}

function configFile(args: string[]): string | undefined {
  const i = args.indexOf('--config');
  if (i >= 0) return args[i + 1];
  const eq = args.find((a) => a.startsWith('--config='));
  return eq ? eq.slice('--config='.length) : process.env.LIGHTNING_CONFIG || undefined;
}

function validate(args: string[]): number {
  const file = args.find((a) => !a.startsWith('-')) ?? configFile(args);
  if (!file) {
    process.stderr.write('validate: a config file is required\n');
    return 2;
  }
  try {
    loadConfig({ file, env: {} });
    process.stdout.write(`${file}: ok\n`);
    return 0;
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(err.problems.join('\n') + '\n');
      return 2;
    }
    throw err;
  }
}

async function run(args: string[]): Promise<number> {
  let config;
  try {
    config = loadConfig({ file: configFile(args), env: process.env });
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(err.problems.join('\n') + '\n');
      return 2;
    }
    throw err;
  }
  const logger = createLogger({ level: config.service.log_level, component: 'lightning-sidecar' });
  const app = createApp(config, { logger });
  try {
    await app.start();
  } catch (err) {
    logger.error('start-up failed', { err });
    await app.shutdown().catch(() => {});
    return 1;
  }
  return new Promise<number>((resolve) => {
    let signals = 0;
    const onSignal = (signal: NodeJS.Signals): void => {
      signals++;
      if (signals > 1) {
        logger.warn('second signal: exiting at once', { signal });
        process.exit(130);
      }
      logger.info('signal received: draining', { signal });
      app.shutdown().then(
        () => resolve(0),
        (err) => {
          logger.error('shutdown failed', { err });
          resolve(1);
        },
      );
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
    // Anything still holding the loop after a clean shutdown is a bug; do not hang the pod.
    setTimeout(() => process.exit(code), 2000).unref();
  },
  (err) => {
    process.stderr.write(`lightning-sidecar: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
    process.exit(1);
  },
);
