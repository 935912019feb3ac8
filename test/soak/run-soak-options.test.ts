import { soakOptions } from './run-soak';

describe('npm run soak options', () => {
  it('reads the numeric options and leaves absent ones to their defaults', () => {
    expect(soakOptions(['--agents', '16', '--kills', '5', '--context-kib', '32'])).toEqual({
      help: false,
      numbers: { agents: 16, kills: 5, 'context-kib': 32 },
    });
    expect(soakOptions(['--minutes=0.5']).numbers.minutes).toBe(0.5);
    expect(soakOptions(['--outage-minutes', '10']).numbers['outage-minutes']).toBe(10);
    expect(soakOptions(['--help']).help).toBe(true);
  });

  it('refuses an unknown flag or a value that is not a number, instead of starting a run', () => {
    expect(() => soakOptions(['--agent', '4'])).toThrow(/--agent/);
    expect(() => soakOptions(['--agents', 'many'])).toThrow('--agents: expected a number ≥ 0, got "many"');
    expect(() => soakOptions(['--kills', '-1'])).toThrow(/--kills/);
  });
});
