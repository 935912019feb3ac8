/**
 * What a test file here does when a Debian package it needs is missing (python3, its modules,
 * protoc, python3-venv): it fails, naming what is missing and the one command that installs every
 * package the suite needs (.ci/install-deps.sh, which .ci/run also uses). A skipped test cannot
 * fail, so skipping is for those who ask for it: with LIGHTNING_SKIP_MISSING_TOOLS=1 the tests are
 * skipped and a line says so (and `npm test` says it again at the end). Under CI nothing is ever
 * skipped.
 */

export const INSTALL_COMMAND = 'sudo .ci/install-deps.sh';

/** CI is set (and not to `false` or `0`), as .ci/run sets it. */
export function underCi(): boolean {
  const ci = process.env.CI;
  return !!ci && ci !== 'false' && ci !== '0';
}

/** Missing things are skipped, not failed: asked for, and not under CI. */
export function skipsKnowingly(): boolean {
  return process.env.LIGHTNING_SKIP_MISSING_TOOLS === '1' && !underCi();
}

/** The failure's message. */
export function missingMessage(testFile: string, missing: string): string {
  return (
    `${testFile}: ${missing}. Install what the test suite needs with: ${INSTALL_COMMAND}` +
    (underCi() ? ' (under CI nothing is skipped)' : ' (or set LIGHTNING_SKIP_MISSING_TOOLS=1 to skip these tests knowingly)')
  );
}

/**
 * Whether the tests of `title` run: true when nothing is missing. Otherwise false, and either a
 * failing test is registered in their place (the default, and always under CI) or, when skipping
 * knowingly, one line on stderr says they are skipped.
 */
export function requirementsMet(testFile: string, missing: string | null, title: string): boolean {
  if (missing === null) return true;
  if (skipsKnowingly()) {
    process.stderr.write(`${testFile}: SKIPPED (LIGHTNING_SKIP_MISSING_TOOLS=1): ${missing}\n`);
    return false;
  }
  describe(title, () => {
    it('has what it needs', () => {
      throw new Error(missingMessage(testFile, missing));
    });
  });
  return false;
}
