'use strict';
// "Growing context": R agents in parallel, each resending its whole history for T turns, ~8 KiB of
// user/tool text added per turn, every episode open until all turns are done. Same workload for
// every target; the agents ask for token ids themselves, so every target moves the same bytes and
// the difference is the capture's cost. After the run the sidecar's trajectories (or, for a target
// exporting transitions, its transitions) are checked against what the model server returned (ids
// recomputed from what each agent sent).
// A second workload, "agents as they are", is what an agent framework sends: no ids asked for
// (the sidecar asks on its behalf and gives them back as null) and every third turn streamed.
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { promptIds, answerIds } = require('./agent-tokens');

const TURN_BYTES = 8 * 1024;

function post(agent, port, body, headers, urlPath = '/v1/chat/completions') {
  return new Promise((resolve) => {
    const start = performance.now();
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        path: urlPath,
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': body.length, ...headers },
      },
      (res) => {
        const parts = [];
        res.on('data', (c) => parts.push(c));
        res.on('end', () => resolve({ status: res.statusCode, ms: performance.now() - start, body: Buffer.concat(parts) }));
        res.on('error', () => resolve({ status: 0, ms: performance.now() - start, body: null }));
      },
    );
    req.on('error', () => resolve({ status: 0, ms: performance.now() - start, body: null }));
    req.end(body);
  });
}

/** The text an agent adds at turn t (a tool result or user message), ~8 KiB, different per agent. */
function turnText(agent, turn) {
  const line = `agent ${agent} turn ${turn}: tool output row with some numbers ${agent * 1000 + turn} and words. `;
  return line.repeat(Math.ceil(TURN_BYTES / line.length)).slice(0, TURN_BYTES);
}

/** Whether an answer (or a stream's event) carries ids or logprobs, which an agent that did not ask for them must not get. */
function carriesIds(x) {
  const c = x.choices?.[0] ?? {};
  return x.prompt_token_ids != null || c.token_ids != null || c.logprobs != null;
}

/** A chat answer as the agent got it: its text, and whether it carries ids or logprobs. */
function readAnswer(body, stream) {
  if (!stream) {
    const x = JSON.parse(body.toString('utf8'));
    return { content: x.choices[0].message.content, ids: carriesIds(x) };
  }
  let content = '';
  let ids = false;
  for (const line of body.toString('utf8').split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const x = JSON.parse(line.slice(6));
    ids ||= carriesIds(x);
    const delta = x.choices?.[0]?.delta;
    if (typeof delta?.content === 'string') content += delta.content;
  }
  return { content, ids };
}

/**
 * Runs the workload against one target; returns per-call latencies and errors. `ask`: the agents
 * ask for token ids and logprobs; `streamEvery`: every that many turns one is streamed (0: none);
 * `urlPath`: where the calls go (the routed-experts scenario calls the model server on a second path).
 */
async function runAgents({ port, agents, turns, prefix, ask = true, streamEvery = 0, urlPath }) {
  const lat = [];
  let errors = 0;
  let streamed = 0;
  let unasked = 0;
  let bodyBytes = 0;
  // What each agent sent, for checking the records afterwards: its messages, and per call how
  // many of them it sent and the answer it got (kept as references; nothing computed meanwhile).
  const conversations = [];
  await Promise.all(
    Array.from({ length: agents }, async (_, a) => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const messages = [{ role: 'system', content: 'You are a coding agent. Use the tools.' }];
      const calls = [];
      conversations.push({ rollout: `${prefix}-${a}`, messages, calls });
      for (let t = 0; t < turns; t++) {
        messages.push({ role: t === 0 ? 'user' : 'tool', content: turnText(a, t) });
        const stream = streamEvery > 0 && t % streamEvery === streamEvery - 1;
        const body = Buffer.from(
          JSON.stringify({
            model: 'bench-policy',
            messages,
            ...(ask ? { return_token_ids: true, logprobs: true } : {}),
            max_tokens: 128,
            ...(stream ? { stream } : {}),
          }),
        );
        const r = await post(agent, port, body, { 'x-rollout-id': `${prefix}-${a}` }, urlPath);
        if (r.status !== 200) {
          errors++;
          break;
        }
        lat.push(r.ms);
        bodyBytes += body.length + r.body.length;
        const { content: answer, ids } = readAnswer(r.body, stream);
        if (stream) streamed++;
        if (!ask && ids) unasked++;
        calls.push({ sent: messages.length, answer });
        messages.push({ role: 'assistant', content: answer });
      }
      agent.destroy();
    }),
  );
  lat.sort((x, y) => x - y);
  return {
    calls: lat.length,
    errors,
    p50: lat[Math.floor(lat.length / 2)],
    p99: lat[Math.min(lat.length - 1, Math.floor(lat.length * 0.99))],
    lastPromptBytes: TURN_BYTES * turns,
    body_bytes: bodyBytes,
    streamed,
    // Answers with ids or logprobs the agent did not ask for (the sidecar must give them back as null).
    unasked_ids: unasked,
    conversations,
  };
}

/**
 * Checks every rollout's trajectories against what its agent sent and the server answered (ids
 * recomputed from each call's messages, logprobs as the bench server gives them): each rollout
 * one trajectory whose token_ids are its last call's prompt and answer ids, whose masked-in
 * positions are exactly each call's answer ids with their logprobs, and 0 elsewhere. Bytes per
 * episode are the trajectory lines' (JSON).
 */
function verifyTrajectories(dataDir, prefix, conversations) {
  const byRollout = new Map();
  let bytes = 0;
  let arrayBytes = 0;
  let maxRatio = 0;
  eachRecord(path.join(dataDir, 'trajectories'), prefix, (t, line) => {
    bytes += line.length + 1;
    const arrays = JSON.stringify(t.token_ids).length + JSON.stringify(t.loss_mask).length + JSON.stringify(t.logprobs).length;
    arrayBytes += arrays;
    maxRatio = Math.max(maxRatio, line.length / arrays);
    (byRollout.get(t.rollout_id) ?? byRollout.set(t.rollout_id, []).get(t.rollout_id)).push(t);
  });
  let wrong = 0;
  let calls = 0;
  const problems = [];
  for (const c of conversations) {
    const rows = byRollout.get(c.rollout) ?? [];
    calls += c.calls.length;
    if (!exactTrajectory(rows, c)) {
      wrong++;
      if (problems.length < 3) problems.push(c.rollout);
    }
  }
  const trajectories = [...byRollout.values()].reduce((n, rows) => n + rows.length, 0);
  return {
    rollouts: conversations.length,
    trajectories,
    calls,
    wrong,
    problems,
    bytes_per_episode: bytes / Math.max(1, conversations.length),
    // The record against its own token_ids, loss_mask and logprobs arrays (JSON text).
    record_to_arrays: bytes / Math.max(1, arrayBytes),
    max_record_to_arrays: maxRatio,
  };
}

function exactTrajectory(rows, c) {
  if (rows.length !== 1) return false;
  const [t] = rows;
  const last = c.calls[c.calls.length - 1];
  const lastPrompt = promptIds(c.messages.slice(0, last.sent));
  if (!same(t.token_ids, lastPrompt.concat(answerIds(last.answer)))) return false;
  if (t.turns.length !== c.calls.length || t.loss_mask.length !== t.token_ids.length || t.logprobs.length !== t.token_ids.length) return false;
  const mask = new Array(t.token_ids.length).fill(0);
  for (let k = 0; k < c.calls.length; k++) {
    const prompt = promptIds(c.messages.slice(0, c.calls[k].sent));
    const answer = answerIds(c.calls[k].answer);
    const turn = t.turns[k];
    if (turn.response_start !== prompt.length || turn.response_end !== prompt.length + answer.length) return false;
    if (!same(t.token_ids.slice(turn.response_start, turn.response_end), answer)) return false;
    // The bench server's logprob of the i-th answer token.
    if (
      !same(
        t.logprobs.slice(turn.response_start, turn.response_end),
        answer.map((_, i) => -0.001 * (i % 100)),
      )
    )
      return false;
    mask.fill(1, turn.response_start, turn.response_end);
  }
  return same(t.loss_mask, mask) && t.logprobs.every((x, i) => mask[i] === 1 || x === 0);
}

/**
 * Checks every transition of the run against the ids the server gave (recomputed from the
 * request). A prompt written as a delta (`exporters.file.prompt_ids: delta`) is made whole from
 * the transition it names first, as a consumer does.
 */
function verifyTransitions(dataDir, prefix, expectCalls) {
  const dir = path.join(dataDir, 'transitions');
  let checked = 0;
  let wrong = 0;
  let continues = 0;
  let deltas = 0;
  let bytes = 0;
  const problems = [];
  const held = new Map();
  eachRecord(dir, prefix, (t, line) => {
    bytes += line.length + 1;
    checked++;
    let prompt = t.prompt_token_ids;
    const d = t.prompt_token_ids_delta;
    if (d) {
      deltas++;
      const prev = held.get(d.previous_transition_id);
      prompt = prev && prev.prompt.length + prev.response.length === d.prefix_length ? prev.prompt.concat(prev.response, d.suffix) : null;
    }
    if (Array.isArray(prompt) && Array.isArray(t.response_token_ids)) held.set(t.transition_id, { prompt, response: t.response_token_ids });
    const wantPrompt = promptIds(t.request.messages);
    const wantAnswer = answerIds(t.response.choices[0].message.content);
    const ok =
      same(prompt, wantPrompt) &&
      same(t.response_token_ids, wantAnswer) &&
      Array.isArray(t.response_logprobs) &&
      t.response_logprobs.length === wantAnswer.length &&
      !('prompt_token_ids' in t.response) &&
      !('token_ids' in t.response.choices[0]);
    if (!ok) {
      wrong++;
      if (problems.length < 3) problems.push(t.transition_id);
    }
    if (t.continues_previous) continues++;
  });
  return {
    expected: expectCalls,
    checked,
    wrong,
    continues_previous: continues,
    prompt_deltas: deltas,
    avg_transition_bytes: checked ? bytes / checked : 0,
    problems,
  };
}

/** Each record of the NDJSON files in `dir` (in file order) whose rollout id starts with `prefix`, with its line. */
function eachRecord(dir, prefix, each) {
  for (const f of fs.existsSync(dir) ? fs.readdirSync(dir).sort() : []) {
    for (const line of fs.readFileSync(path.join(dir, f), 'utf8').split('\n')) {
      if (!line) continue;
      const t = JSON.parse(line);
      if (t.rollout_id.startsWith(prefix)) each(t, line);
    }
  }
}

/** Bytes in the files of a directory. */
function dirBytes(dir) {
  let n = 0;
  for (const f of fs.readdirSync(dir)) n += fs.statSync(path.join(dir, f)).size;
  return n;
}

/** A target's name as it can stand in a rollout id (letters, digits and `._:-`; `sidecar+viewer` → `sidecar-viewer`). */
function idOf(name) {
  return name.replace(/[^A-Za-z0-9._:-]/g, '-');
}

function same(a, b) {
  if (!Array.isArray(a) || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * `targets`: {name, port, pid, capture?, watch?}; a capturing target (a sidecar) has `capture: {dataDir,
 * endRollouts(prefix, agents)}`: its episodes are closed and exported after each round (CPU
 * counted) and its transitions checked. `watch()`, where given, starts a client of the target's
 * viewer for each of its rounds, warm-up included (bench/viewer-poller.js): it polls while the
 * agents call and the episodes are exported, and its stop({ settle: true }) waits for its next
 * poll, which loads the round's closed episodes, before the round's CPU and RSS are read.
 */
async function benchGrowingContext({ targets, proc, agents, turns, rounds, warmup, ask = true, streamEvery = 0, tag = 'gc' }) {
  const out = { agents, turns, turn_bytes: TURN_BYTES, warmup_rounds: warmup, ask, stream_every: streamEvery, targets: {} };
  const workload = { agents, turns, ask, streamEvery };
  // Rounds not measured, for every proxy: its code compiled and its pools warm, as in a process
  // that has served for a while. A round is only agents × turns calls, and V8 goes on compiling
  // the sidecar's functions for thousands of calls (measured with --trace-opt: ~70 functions
  // optimized in the first round, ~30 a round after three, under ~10 after twenty), so one round
  // leaves much of the JIT's one-time cost in the measured figures.
  for (let w = 0; w < warmup; w++) {
    for (const t of targets) {
      if (!t.pid) continue;
      const watch = t.watch ? t.watch() : null;
      await runAgents({ port: t.port, prefix: `${tag}w${w}-${idOf(t.name)}`, ...workload });
      if (t.capture) await t.capture.endRollouts(`${tag}w${w}-${idOf(t.name)}`, agents);
      if (watch) await watch.stop({ settle: true });
    }
  }
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? targets : [...targets].reverse();
    for (const t of order) {
      const prefix = `${tag}${r}-${idOf(t.name)}`;
      const before = t.pid ? proc(t.pid) : null;
      let peak = before ? before.rss : NaN;
      const timer = t.pid ? setInterval(() => (peak = Math.max(peak, proc(t.pid).rss)), 25) : null;
      const journalBefore = t.capture ? dirBytes(path.join(t.capture.dataDir, 'journal')) : 0;
      // Started after the CPU reading above: its first poll is the round's.
      const watch = t.watch ? t.watch() : null;
      const res = await runAgents({ port: t.port, prefix, ...workload });
      const loadCpu = before ? proc(t.pid).cpu - before.cpu : NaN;
      // Every episode is still open: nothing of this round has been released yet.
      const journalBytes = t.capture ? dirBytes(path.join(t.capture.dataDir, 'journal')) - journalBefore : null;
      // The sidecar then closes every episode and exports it: that is capture work too.
      let exportS = 0;
      if (t.capture) exportS = await t.capture.endRollouts(prefix, agents);
      // What the viewer's client did in the round; the trajectories it loaded count in its CPU.
      const viewer = watch ? await watch.stop({ settle: true }) : null;
      const after = before ? proc(t.pid) : null;
      const totalCpu = before ? after.cpu - before.cpu : NaN;
      const mainCpu = before ? after.mainCpu - before.mainCpu : NaN;
      if (timer) clearInterval(timer);
      if (t.pid) peak = Math.max(peak, proc(t.pid).rss);
      const x = (out.targets[t.name] ??= { rounds: [] });
      const { conversations: _c, ...measured } = res;
      x.rounds.push({
        ...measured,
        cpu_us_per_call_load: (loadCpu / res.calls) * 1e6,
        cpu_us_per_call: (totalCpu / res.calls) * 1e6,
        cpu_us_per_call_main: (mainCpu / res.calls) * 1e6,
        peak_rss_mib: peak / 2 ** 20,
        export_s: exportS,
        journal_bytes: journalBytes,
        ...(viewer ? { viewer } : {}),
      });
      if (t.capture)
        (x.verify ??= []).push(
          t.capture.records === 'transitions'
            ? verifyTransitions(t.capture.dataDir, prefix, res.calls)
            : verifyTrajectories(t.capture.dataDir, prefix, res.conversations),
        );
    }
  }
  return out;
}

module.exports = { benchGrowingContext, runAgents, verifyTrajectories, exactTrajectory, dirBytes };
