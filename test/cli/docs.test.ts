import { readFileSync } from 'node:fs';
import path from 'node:path';
import { renderHelp } from '../../src/cli/command';
import { groupsCommand } from '../../src/cli/groups';
import { PROGRAM } from '../../src/cli/program';
import { runCommand } from '../../src/cli/run';
import { tailCommand } from '../../src/cli/tail';
import { validateCommand } from '../../src/cli/validate';

const ROOT = path.join(__dirname, '../..');
const operations = readFileSync(path.join(ROOT, 'docs/operations.md'), 'utf8');

describe('docs/operations.md', () => {
  it.each([runCommand, validateCommand, tailCommand, groupsCommand].map((c) => [c.spec.name, c] as const))(
    'shows the help of %s exactly as the command prints it',
    (_, command) => {
      expect(operations).toContain('```\n' + renderHelp(PROGRAM, command.spec) + '```');
    },
  );

  it('and the README name only metrics in base units', () => {
    const readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    for (const text of [operations, readme]) expect(text.match(/lightning_sidecar_[a-z_]*_(ms|millis|us)\b/g) ?? []).toEqual([]);
  });
});
