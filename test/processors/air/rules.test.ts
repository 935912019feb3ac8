import { configSchema, parsePredicate } from '../../../src/config/schema';
import { compileRules, holds } from '../../../src/processors/air/rules';

describe('AIR rule predicates', () => {
  it.each([
    ['http.response.status_code >= 500', { 'http.response.status_code': 503 }, true],
    ['http.response.status_code >= 500', { 'http.response.status_code': 200 }, false],
    ['http.response.status_code >= 500', { 'http.response.status_code': '502' }, true],
    ['process.exit.code != 0', { 'process.exit.code': 1 }, true],
    ['process.exit.code != 0', { 'process.exit.code': 0 }, false],
    ['process.exit.code != 0', {}, false],
    ['db.rows < 1', { 'db.rows': 0 }, true],
    ['db.rows <= 0', { 'db.rows': 1 }, false],
    ['db.rows > 10', { 'db.rows': 'many' }, false],
    ['tool.kind == "sql"', { 'tool.kind': 'sql' }, true],
    ['tool.kind == sql', { 'tool.kind': 'python' }, false],
    ['cached == true', { cached: true }, true],
    ['error.type ~= ^Timeout', { 'error.type': 'TimeoutError' }, true],
    ['error.type ~= ^Timeout', { 'error.type': 'ValueError' }, false],
    ['exists error.type', { 'error.type': 'x' }, true],
    ['exists error.type', {}, false],
  ])('%s on %j is %s', (text, attrs, expected) => {
    const p = parsePredicate(text);
    expect(p).not.toBeNull();
    expect(holds(p!, attrs as Record<string, string | number | boolean>)).toBe(expected);
  });

  it('rejects predicates it cannot parse, naming the rule path', () => {
    const r = configSchema.safeParse({
      processors: {
        air: {
          rules: [
            { where: ['status is bad'], reward: 1 },
            { where: ['x ~= ('], reward: 1 },
          ],
        },
      },
    });
    expect(r.success).toBe(false);
    expect(r.error!.issues.map((i) => i.path.join('.'))).toEqual(['processors.air.rules.0.where.0', 'processors.air.rules.1.where.0']);
  });
});

describe('AIR rules', () => {
  const rules = configSchema.parse({
    processors: {
      air: {
        rules: [
          { tool: 'sql_*', outcome: 'ok', where: ['db.rows < 1'], reward: -0.2 },
          { tool: 'sql_*', outcome: 'error', reward: -1 },
          { tool: 'http_?et', where: ['http.response.status_code >= 500'], reward: -0.7 },
          { outcome: 'missing', reward: -0.3 },
          { outcome: 'ok', reward: 0.5 },
        ],
      },
    },
  }).processors.air.rules;
  const evaluate = compileRules(rules);

  it('takes the first matching rule: tool glob, outcome and every predicate', () => {
    expect(evaluate({ toolName: 'sql_query', outcome: 'ok', attributes: { 'db.rows': 0 } })).toBe(-0.2);
    expect(evaluate({ toolName: 'sql_query', outcome: 'ok', attributes: { 'db.rows': 3 } })).toBe(0.5);
    expect(evaluate({ toolName: 'sql_query', outcome: 'error', attributes: {} })).toBe(-1);
    expect(evaluate({ toolName: 'http_get', outcome: 'ok', attributes: { 'http.response.status_code': 500 } })).toBe(-0.7);
    expect(evaluate({ toolName: 'http_gets', outcome: 'ok', attributes: { 'http.response.status_code': 500 } })).toBe(0.5);
    expect(evaluate({ toolName: null, outcome: 'missing', attributes: {} })).toBe(-0.3);
  });

  it('gives null, not zero, when no rule matches', () => {
    expect(evaluate({ toolName: 'x', outcome: 'error', attributes: {} })).toBeNull();
  });

  it('has documented defaults: error −0.5, missing −0.25, ok +0.1', () => {
    const d = compileRules(configSchema.parse({}).processors.air.rules);
    expect([
      d({ toolName: 't', outcome: 'error', attributes: {} }),
      d({ toolName: 't', outcome: 'missing', attributes: {} }),
      d({ toolName: 't', outcome: 'ok', attributes: {} }),
    ]).toEqual([-0.5, -0.25, 0.1]);
  });
});
