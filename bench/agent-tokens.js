'use strict';
// The bench model server's tokenizer: ~4 bytes a token, a chat template whose prompt for turn k+1
// starts with turn k's prompt and answer (as real templates do), so continuity can be checked.
const START = { system: 11, user: 12, assistant: 13, tool: 14 };
const END = 15;

/** Ids of a text: one per 4 bytes, from the bytes (deterministic). */
function tokenize(text, out = []) {
  const b = Buffer.from(text, 'utf8');
  for (let i = 0; i < b.length; i += 4) {
    let h = 2166136261;
    for (let j = i; j < Math.min(i + 4, b.length); j++) h = Math.imul(h ^ b[j], 16777619);
    out.push(1000 + ((h >>> 0) % 50000));
  }
  return out;
}

function contentText(c) {
  if (typeof c === 'string') return c;
  if (Array.isArray(c)) return c.map((p) => (p && typeof p.text === 'string' ? p.text : '')).join('');
  return '';
}

/** Prompt ids of a chat request: each message as START(role) content END, then START(assistant). */
function promptIds(messages) {
  const out = [];
  for (const m of messages) {
    out.push(START[m.role] ?? 16);
    tokenize(contentText(m.content), out);
    out.push(END);
  }
  out.push(START.assistant);
  return out;
}

/** Ids of an answer: its content, then END (the next prompt repeats exactly these). */
function answerIds(content) {
  const out = tokenize(content);
  out.push(END);
  return out;
}

module.exports = { tokenize, promptIds, answerIds };
