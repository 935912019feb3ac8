import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import YAML from 'yaml';
import { needsDebianTool } from '../support/debian-tool';

const ROOT = path.join(__dirname, '../..');
const RULES = path.join(ROOT, 'helm/lightning-sidecar/files/prometheus-rules.yaml');
const UNIT_TESTS = path.join(__dirname, 'fixtures/prometheus-rules.promtool.yaml');

/** Prometheus' own rule checker and unit-test runner (Debian package `prometheus`). */
const withPromtool = needsDebianTool('promtool', 'prometheus', 'test/deploy/alerts.test.ts') ? it : it.skip;

interface Rule {
  alert: string;
  expr: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}
interface UnitTests {
  tests: { alert_rule_test: { alertname: string; exp_alerts: unknown[] }[] }[];
}

const rules: Rule[] = (YAML.parse(readFileSync(RULES, 'utf8')) as { groups: { rules: Rule[] }[] }).groups.flatMap((g) => g.rules);

describe('alerting rules (helm/lightning-sidecar/files/prometheus-rules.yaml)', () => {
  withPromtool('pass promtool check rules (PromQL and annotation templates)', () => {
    const out = spawnSync('promtool', ['check', 'rules', RULES], { encoding: 'utf8' });
    expect(out.stderr + out.stdout).toMatch(/SUCCESS: \d+ rules found/);
    expect(out.status).toBe(0);
  });

  withPromtool('pass their promtool unit tests: each fires on what it watches, with its labels and rendered annotations, and stays quiet otherwise', () => {
    const out = spawnSync('promtool', ['test', 'rules', UNIT_TESTS], { encoding: 'utf8', cwd: path.dirname(UNIT_TESTS) });
    expect(out.stdout + out.stderr).toMatch(/SUCCESS/);
    expect(out.status).toBe(0);
  });

  it('every alert has a unit test in which it fires and one in which it does not', () => {
    const tests = (YAML.parse(readFileSync(UNIT_TESTS, 'utf8')) as UnitTests).tests.flatMap((t) => t.alert_rule_test);
    const firing = new Set(tests.filter((t) => t.exp_alerts.length > 0).map((t) => t.alertname));
    const quiet = new Set(tests.filter((t) => t.exp_alerts.length === 0).map((t) => t.alertname));
    expect(rules.length).toBeGreaterThanOrEqual(10);
    expect(rules.filter((r) => !firing.has(r.alert)).map((r) => r.alert)).toEqual([]);
    expect(rules.filter((r) => !quiet.has(r.alert)).map((r) => r.alert)).toEqual([]);
  });

  it('every alert is per pod, has a severity, a summary and a description, and a unique name', () => {
    expect(new Set(rules.map((r) => r.alert)).size).toBe(rules.length);
    for (const r of rules) {
      expect([r.alert, r.alert.startsWith('LightningSidecar')]).toEqual([r.alert, true]);
      expect([r.alert, r.labels?.severity]).toEqual([r.alert, expect.stringMatching(/^(critical|warning)$/)]);
      expect([r.alert, r.expr]).toEqual([r.alert, expect.stringMatching(/by \(namespace, pod\b/)]);
      expect([r.alert, r.annotations?.summary]).toEqual([r.alert, expect.stringContaining('{{ $labels.namespace }}/{{ $labels.pod }}')]);
      expect([r.alert, typeof r.annotations?.description]).toEqual([r.alert, 'string']);
    }
  });
});
