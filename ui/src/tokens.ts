/**
 * A trajectory's tokens as one HTML string (one assignment to the DOM, so a 32k-token trajectory
 * renders at once): context tokens grey, sampled tokens (loss mask 1) on a heat scale of their
 * logprob, each token's id and logprob on hover, a marker where each call's answer begins (its
 * finish reason and tool calls with their span status and reward), and a badge where a reward lands.
 */

export interface Turn {
  transition_id: string;
  seq: number;
  response_start: number;
  response_end: number;
  has_logprobs: boolean;
  finish_reason: string | null;
  tool_calls: { name: string | null; status: string | null; reward: number | null; arguments?: unknown }[];
  intermediate_reward: number | null;
  reward: number;
}

export interface TrajectoryView {
  trajectory_id: string;
  token_ids: number[];
  loss_mask: number[];
  logprobs: number[] | null;
  turns: Turn[];
  token_rewards: { position: number; value: number }[];
  token_text?: string[];
  turn_text?: (string | null)[];
  weight_versions?: { version: string; start: number; end: number }[];
}

const ESC: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ESC[c]);
}

/** Heat bucket 0 (sure: logprob near 0) to 9 (logprob -5 or lower). */
export function heat(logprob: number): number {
  return Math.max(0, Math.min(9, Math.floor(-logprob * 2)));
}

function fmt(n: number): string {
  return Number.isInteger(n) ? String(n) : n.toFixed(4).replace(/0+$/, '');
}

function turnMarker(t: Turn, k: number, text: string | null | undefined): string {
  const calls = t.tool_calls
    .map((c) => {
      const status = c.status ?? 'no span';
      const reward = c.reward === null ? '' : ` reward ${fmt(c.reward)}`;
      return `<span class="call call-${escapeHtml(c.status ?? 'none')}" data-status="${escapeHtml(status)}">${escapeHtml(c.name ?? '?')}: ${escapeHtml(status)}${reward}</span>`;
    })
    .join(' ');
  const air = t.intermediate_reward === null ? '' : ` <span class="air">AIR ${fmt(t.intermediate_reward)}</span>`;
  const said = text ? `<div class="turn-text">${escapeHtml(text)}</div>` : '';
  return `<div class="turn" data-turn="${k}"><span class="turn-head">call ${k + 1} (seq ${t.seq}) · finish ${escapeHtml(t.finish_reason ?? '?')}</span> ${calls}${air}${said}</div>`;
}

export function tokensHtml(t: TrajectoryView): string {
  const parts: string[] = [];
  const turnAt = new Map<number, number>();
  t.turns.forEach((u, k) => turnAt.set(u.response_start, k));
  const rewardAt = new Map<number, number>();
  for (const r of t.token_rewards) rewardAt.set(r.position, (rewardAt.get(r.position) ?? 0) + r.value);
  for (let i = 0; i < t.token_ids.length; i++) {
    const k = turnAt.get(i);
    if (k !== undefined) parts.push(turnMarker(t.turns[k], k, t.turn_text?.[k]));
    const id = t.token_ids[i];
    const text = t.token_text ? t.token_text[i] : `[${id}]`;
    const sampled = t.loss_mask[i] === 1;
    const lp = t.logprobs && sampled ? t.logprobs[i] : null;
    // Context tokens carry only their position (their id is shown on hover by the page's handler):
    // a 32k-token prompt is one short span each.
    if (!sampled) parts.push(`<span class="t c" data-i="${i}">${escapeHtml(text)}</span>`);
    else {
      const title = lp === null ? `#${i} id ${id}` : `#${i} id ${id} logprob ${fmt(lp)}`;
      parts.push(`<span class="t s h${lp === null ? 'n' : heat(lp)}" data-i="${i}" title="${title}">${escapeHtml(text)}</span>`);
    }
    const r = rewardAt.get(i);
    if (r !== undefined) parts.push(`<span class="reward" data-position="${i}">reward ${fmt(r)}</span>`);
  }
  return parts.join('');
}
