import type { AirRule, Predicate } from '../../config/schema';
import { globToRegExp } from './glob';

export type ToolOutcome = 'ok' | 'error' | 'missing';

export interface ToolFacts {
  toolName: string | null;
  outcome: ToolOutcome;
  attributes: Record<string, string | number | boolean>;
}

interface CompiledRule {
  tool: RegExp | null;
  outcome: ToolOutcome | undefined;
  where: Predicate[];
  reward: number;
}

/**
 * AIR: the first rule whose tool glob, outcome and predicates all match gives the tool call's
 * intermediate reward; no match gives null (no reward, not zero).
 */
export function compileRules(rules: readonly AirRule[]): (facts: ToolFacts) => number | null {
  const compiled: CompiledRule[] = rules.map((r) => ({ tool: r.tool ? globToRegExp(r.tool) : null, outcome: r.outcome, where: r.where, reward: r.reward }));
  return (facts) => {
    for (const r of compiled) {
      if (r.outcome !== undefined && r.outcome !== facts.outcome) continue;
      if (r.tool && (facts.toolName === null || !r.tool.test(facts.toolName))) continue;
      if (!r.where.every((p) => holds(p, facts.attributes))) continue;
      return r.reward;
    }
    return null;
  };
}

export function holds(p: Predicate, attributes: Record<string, string | number | boolean>): boolean {
  const v = attributes[p.attribute];
  if (p.op === 'exists') return v !== undefined;
  if (v === undefined) return false;
  switch (p.op) {
    case '==':
      return loose(v) === loose(p.value);
    case '!=':
      return loose(v) !== loose(p.value);
    case '~=':
      return new RegExp(String(p.value)).test(String(v));
    default: {
      const a = Number(v);
      const b = Number(p.value);
      if (!Number.isFinite(a) || !Number.isFinite(b)) return false;
      return p.op === '>' ? a > b : p.op === '>=' ? a >= b : p.op === '<' ? a < b : a <= b;
    }
  }
}

/** Compares numbers by value, so `"500"` (an attribute sent as a string) equals `500`. */
function loose(v: string | number | boolean | null): string {
  if (typeof v === 'number') return String(v);
  if (typeof v === 'string' && v.trim() !== '' && Number.isFinite(Number(v))) return String(Number(v));
  return String(v);
}
