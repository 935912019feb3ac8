import type { CreditConfig } from '../../config/schema';

/**
 * Credit assignment: the share of an episode's final reward given to the call at `position`
 * (0-based) of `count`. `identical` gives every call the final reward (LightningRL), `last` only
 * the last call, `discounted` γ^(T−1−t).
 */
export function credit(config: CreditConfig, finalReward: number | null, position: number, count: number): number | null {
  if (finalReward === null) return null;
  switch (config.mode) {
    case 'identical':
      return finalReward;
    case 'last':
      return position === count - 1 ? finalReward : 0;
    case 'discounted':
      return finalReward * Math.pow(config.gamma, count - 1 - position);
  }
}
