import { loadConfig } from '../config/load';
import { UsageError, type Command, type CommandSpec } from './command';

const spec: CommandSpec = {
  name: 'validate',
  summary: 'check a config file',
  synopsis: 'FILE',
  positionals: [{ name: 'FILE', required: false, description: 'the YAML config file (default: --config, then $LIGHTNING_CONFIG)' }],
  options: {
    config: { type: 'string', value: 'FILE', description: 'the config file, as for run' },
  },
  notes: ["Prints 'FILE: ok' (exit 0), or every problem as 'path: message' (exit 2). The file is checked alone: environment variables are not applied."],
};

export const validateCommand: Command = {
  spec,
  async run({ values, positionals }, io) {
    const file = positionals[0] ?? (values.config as string | undefined) ?? (io.env.LIGHTNING_CONFIG || undefined);
    if (!file) throw new UsageError('validate: a config file is required', spec);
    loadConfig({ file, env: {} });
    io.out.write(`${file}: ok\n`);
    return 0;
  },
};
