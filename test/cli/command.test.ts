import { parseCommand, renderHelp, UsageError, type CommandSpec } from '../../src/cli/command';

const spec: CommandSpec = {
  name: 'demo',
  summary: 'a command for the tests',
  synopsis: '[--name X] [--count N] [--loud] FILE',
  positionals: [{ name: 'FILE', required: true, description: 'the file' }],
  options: {
    name: { type: 'string', value: 'X', description: 'a name' },
    count: { type: 'integer', short: 'n', description: 'how many' },
    loud: { type: 'boolean', description: 'shout' },
  },
  notes: ['A note.'],
};

const usage = (argv: string[]): string => {
  try {
    parseCommand(spec, argv);
  } catch (err) {
    expect(err).toBeInstanceOf(UsageError);
    return (err as Error).message;
  }
  throw new Error('parsed');
};

describe('parseCommand', () => {
  it('parses strings, whole numbers, booleans and positionals, in either option form', () => {
    expect(parseCommand(spec, ['--name', 'a', '-n', '3', '--loud', 'f.yaml'])).toEqual({
      help: false,
      values: { name: 'a', count: 3, loud: true },
      positionals: ['f.yaml'],
    });
    expect(parseCommand(spec, ['--name=-dash', '--count=0', 'f'])).toEqual({ help: false, values: { name: '-dash', count: 0 }, positionals: ['f'] });
  });

  it('refuses what it does not know or cannot read, naming the option', () => {
    expect(usage(['--nam', 'a', 'f'])).toBe("demo: unknown option '--nam'");
    expect(usage(['-x', 'f'])).toBe("demo: unknown option '-x'");
    expect(usage(['f', '--name'])).toBe("demo: option '--name' wants a value");
    expect(usage(['--name', '--loud', 'f'])).toBe("demo: option '--name' wants a value (write --name=VALUE for a value starting with '-')");
    expect(usage(['--loud=no', 'f'])).toBe("demo: option '--loud' takes no value");
    expect(usage(['--count', '-1', 'f'])).toMatch(/^demo: option '--count' wants a value/);
    expect(usage(['--count', '2.5', 'f'])).toBe("demo: option --count wants a whole number, got '2.5'");
    expect(usage(['--name=', 'f'])).toBe('demo: option --name wants a value');
    expect(usage(['--name', 'a', '--name', 'b', 'f'])).toBe('demo: option --name given more than once');
    expect(usage([])).toBe('demo: FILE is required');
    expect(usage(['f', 'g'])).toBe("demo: unexpected argument 'g'");
  });

  it('answers help before anything else on the line', () => {
    expect(parseCommand(spec, ['--bogus', '-h']).help).toBe(true);
    expect(parseCommand(spec, ['--help']).help).toBe(true);
  });
});

describe('renderHelp', () => {
  it('renders the usage, the summary, every option with its placeholder, and the notes', () => {
    expect(renderHelp('prog', spec)).toBe(
      [
        'usage: prog demo [--name X] [--count N] [--loud] FILE',
        '',
        'a command for the tests',
        '',
        'arguments:',
        '  FILE           the file',
        '',
        'options:',
        '      --name X   a name',
        '  -n, --count N  how many',
        '      --loud     shout',
        '  -h, --help     print this help and exit',
        '',
        'A note.',
        '',
      ].join('\n'),
    );
  });
});
