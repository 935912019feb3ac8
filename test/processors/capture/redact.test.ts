import { compileRedaction, REDACTED } from '../../../src/processors/capture/redact';

describe('compileRedaction', () => {
  it('is null without paths (nothing to do on the capture path)', () => {
    expect(compileRedaction([])).toBeNull();
  });

  it('replaces anchored paths, `*` segments and `**.` paths at any depth, without touching the input', () => {
    const redact = compileRedaction(['user', 'metadata.email', 'messages.*.name', '**.ssn', 'absent.path'])!;
    const body = {
      model: 'm',
      user: 'alice@example.com',
      metadata: { email: 'alice@example.com', team: 'rl' },
      messages: [
        { role: 'user', name: 'alice', content: 'my ssn is in the tool args' },
        { role: 'tool', content: '…', extra: { ssn: '123-45-6789', nested: [{ ssn: '987-65-4321' }] } },
      ],
    };
    const before = JSON.stringify(body);
    expect(redact(body)).toEqual({
      model: 'm',
      user: REDACTED,
      metadata: { email: REDACTED, team: 'rl' },
      messages: [
        { role: 'user', name: REDACTED, content: 'my ssn is in the tool args' },
        { role: 'tool', content: '…', extra: { ssn: REDACTED, nested: [{ ssn: REDACTED }] } },
      ],
    });
    expect(JSON.stringify(body)).toBe(before);
  });

  it('leaves non-object bodies alone', () => {
    const redact = compileRedaction(['user'])!;
    expect(redact(null)).toBeNull();
    expect(redact('text')).toBe('text');
  });
});
