import { credit } from '../../../src/processors/rewards/credit';

describe('credit assignment', () => {
  it('identical gives every call the final reward (LightningRL)', () => {
    expect([0, 1, 2].map((t) => credit({ mode: 'identical', gamma: 0.9 }, 2, t, 3))).toEqual([2, 2, 2]);
  });
  it('last gives only the last call the final reward', () => {
    expect([0, 1, 2].map((t) => credit({ mode: 'last', gamma: 0.9 }, 2, t, 3))).toEqual([0, 0, 2]);
  });
  it('discounted gives γ^(T−1−t) × final', () => {
    expect([0, 1, 2].map((t) => credit({ mode: 'discounted', gamma: 0.5 }, 1, t, 3))).toEqual([0.25, 0.5, 1]);
  });
  it('is null without a final reward', () => {
    expect(credit({ mode: 'identical', gamma: 1 }, null, 0, 1)).toBeNull();
  });
});
