import type { CreditConfig } from '../../config/schema';
import type {
  AgentSpanRecord,
  CallRecord,
  ChoiceCapture,
  ClosedEpisode,
  EpisodeStatus,
  IdsRange,
  RawBody,
  TokenIds,
  ToolSpanRecord,
  TrajectoryImages,
  TransitionRecord,
  TransitionToolCall,
} from '../../model/records';
import { QWEN_VL_IMAGE_TOKEN_ID } from '../../model/records';
import { concatPrefixEnd, countCommas, looksLikeIntArray, looksLikeIntArrayRest } from '../../formats/json-scan';
import { matchesAny } from '../air/glob';
import type { ToolFacts } from '../air/rules';
import { decode, extractFacts, resolveIds, type BodyReader, type CallFacts } from '../../formats/extract';
import { joinToolSpans, requestKey } from '../episodes/join';
import { credit } from './credit';
import { continuesFrom, idsLength, type Ids } from './continuity';
import { decodeRouting, type SglangRoutingShape } from './routing';
import { checkSamplingMasks } from './sampling-mask';
import { samplingOf, type ServerDefaults } from './sampling';
import { hasImageParts, namesImage } from '../../formats/images';
import { trajectoryImages, type ImageOptions } from './images';
import { buildTrajectories, Segmenter } from './trajectories';
import { extend } from '../../model/extend';

export interface EpisodeFacts {
  rolloutId: string;
  attemptId: string;
  groupId: string | null;
  calls: CallRecord[];
  toolSpans: ToolSpanRecord[];
  /** GenAI agent spans of the rollout: name the agent of calls that did not name it themselves. */
  agentSpans?: AgentSpanRecord[];
  rewards: { name: string; value: number; final: boolean }[];
  finalReward: number | null;
  startedAt: number;
  endedAt: number;
  firstOffset?: number;
  /** Newest numeric policy version seen by the sidecar when the episode closed. */
  maxPolicySeen?: number | null;
}

export interface TransitionOptions {
  credit: CreditConfig;
  airWeight: number;
  /** AIR rule evaluation; null when AIR is off. */
  air: ((facts: ToolFacts) => number | null) | null;
  /** Agent-name globs (selective capture): calls of excluded agents are not emitted. */
  includeAgents: RegExp[];
  excludeAgents: RegExp[];
  /** Reads journaled bodies (captured calls); without it only calls with inline facts are complete. */
  read?: BodyReader;
  /** Two reusable buffers for reading bodies while an episode is built (saves allocation per call). */
  scratch?: [Buffer, Buffer];
  /** What the exporter writes (`exporters.records`); the episode summary says so. Default: both. */
  exported?: ('transitions' | 'trajectories')[];
  /** Record each call's sampling parameters (`processors.sampling.record`). */
  recordSampling?: boolean;
  /** SGLang's routing shape (`processors.routed_experts.sglang`); without it SGLang routing cannot be read. */
  sglangRouting?: SglangRoutingShape | null;
  /** The model server's sampling defaults, recorded where a request left a parameter out (`processors.sampling.server_defaults`). */
  serverDefaults?: ServerDefaults | null;
  /** Sampling masks were asked for (`processors.sampling.masks`): trajectories say whether they came. */
  samplingMasks?: boolean;
  /** Which distribution the server's logprobs are over (`processors.sampling.logprobs_mode`). */
  logprobsMode?: string | null;
  /** How images are found in calls (`processors.images`). */
  images?: ImageOptions;
}

const NO_BODIES: BodyReader = () => {
  throw new Error('no journal to read bodies from');
};

/** Whether a call's agent is captured under the include/exclude globs. */
export function captured(agentName: string | null, options: Pick<TransitionOptions, 'includeAgents' | 'excludeAgents'>): boolean {
  if (options.includeAgents.length > 0 && !matchesAny(agentName, options.includeAgents)) return false;
  return !matchesAny(agentName, options.excludeAgents);
}

/**
 * One transition per call and choice (`n > 1` → `{rollout}/{attempt}/{seq}.{choice}`), in seq
 * order. Captured calls' facts are extracted here, when the episode closes, from their journaled
 * bodies; only small facts and byte ranges are kept, the bodies are copied when exported.
 */
export function buildEpisode(facts: EpisodeFacts, status: EpisodeStatus, options: TransitionOptions): ClosedEpisode {
  const read = options.read ?? NO_BODIES;
  const sorted = [...facts.calls].sort((a, b) => a.seq - b.seq);
  // Extract in seq order; continuity is checked and segments are found on the way, so at most
  // two calls' bodies are alive (three when the segmenter's previous call is not continuity's).
  const all: CallFacts[] = [];
  const continues = new Set<number>();
  let previous: Previous | null = null;
  // Segments are found only when trajectories are exported (the work is per call, on the bodies).
  const segmenter = (options.exported ?? ['trajectories']).includes('trajectories') ? new Segmenter() : null;
  const scratch = [options.scratch?.[0], options.scratch?.[1]];
  const imageToken = (options.images ?? DEFAULT_IMAGES).imageTokenId;
  const withPlaceholders = new Set<number>();
  for (const call of sorted) {
    // A scratch buffer that holds neither body still compared with (or none: a fresh one).
    const pinned = [previous?.body, segmenter?.pinned];
    const free = scratch.find((b) => b !== undefined && !pinned.some((p) => p && p.buffer === b.buffer));
    const { facts: f, responseBytes } = extractFacts(call, read, free);
    decodeRouting(f, read, options.sglangRouting ?? null, responseBytes);
    checkSamplingMasks(f, responseBytes);
    const agent = f.correlation.agentName === null ? agentOf(f, facts.agentSpans ?? []) : null;
    if (agent !== null) f.correlation = extend(f.correlation, { agentName: agent });
    all.push(f);
    // A prompt that repeats the previous call's prompt and answer byte for byte (an agent's
    // growing context): only what it adds is read from here on (validity, length, placeholders).
    const kept = captured(f.correlation.agentName, options);
    const repeat: Repeat | null = kept ? repeatedPrefix(f, responseBytes, previous) : null;
    dropInvalidRanges(f, responseBytes, repeat);
    if (!kept) continue;
    const first = f.choices[0];
    const prompt = first?.promptTokenIds ?? f.promptTokenIds;
    const current: Ids = { body: responseBytes, prompt, response: first?.responseTokenIds ?? null };
    const rest: Rest | null =
      repeat !== null && prompt === repeat.range && previous !== null && responseBytes !== null
        ? { body: responseBytes, at: repeat.at, end: repeat.range.end, previous }
        : null;
    // Whether its prompt holds image placeholders, read while its answer is at hand (docs/images.md).
    const placeholders: boolean = rest !== null ? placeholdersAfter(rest, imageToken) : hasToken(prompt, responseBytes, imageToken);
    if (placeholders) withPlaceholders.add(f.seq);
    if (rest !== null || (previous !== null && continuesFrom(current, previous))) continues.add(f.seq);
    const promptLength: number | null = segmenter === null || prompt === null ? null : ((rest && lengthAfter(rest)) ?? idsLength(prompt, responseBytes));
    previous = current.prompt !== null && current.response !== null ? extend(current, { placeholders, promptLength }) : null;
    segmenter?.add(f, responseBytes, promptLength);
  }
  const joined = joinToolSpans(all, facts.toolSpans, (c) => parsedRequest(c, read));
  // Without any tool span in the rollout the agent is not instrumented: outcomes are unknown, not missing.
  const instrumented = facts.toolSpans.length > 0;
  const calls = all.filter((c) => captured(c.correlation.agentName, options));
  const transitions: TransitionRecord[] = [];
  calls.forEach((call, position) => {
    const callCredit = credit(options.credit, facts.finalReward, position, calls.length);
    const sampling = options.recordSampling ? samplingOf(call, read, options.serverDefaults ?? null) : null;
    const choices: (ChoiceCapture | null)[] = call.choices.length > 0 ? call.choices : [null];
    const multi = choices.length > 1;
    const groupId = call.correlation.groupId ?? facts.groupId;
    choices.forEach((choice) => {
      const promptIds = choice?.promptTokenIds ?? call.promptTokenIds;
      const responseIds = choice?.responseTokenIds ?? null;
      const toolCalls: TransitionToolCall[] = (choice?.toolCalls ?? []).map((tc, i) => {
        const j = choice ? joined.get(requestKey(call.seq, choice.index, i)) : undefined;
        const status = j ? j.span.outcome : instrumented ? 'missing' : null;
        const reward = status !== null && options.air ? options.air({ toolName: tc.name, outcome: status, attributes: j?.span.attributes ?? {} }) : null;
        return { id: tc.id, name: tc.name, status, reward, span_id: j?.span.spanId ?? null, join: j?.method ?? null };
      });
      const rewarded = toolCalls.filter((tc) => tc.reward !== null);
      const intermediate: number | null = rewarded.length > 0 ? rewarded.reduce((n, tc) => n + tc.reward!, 0) : null;
      const id = `${facts.rolloutId}/${facts.attemptId}/${call.seq}${multi && choice ? `.${choice.index}` : ''}`;
      const t: TransitionRecord = {
        schema: 'lightning.transition.v1',
        transition_id: id,
        rollout_id: facts.rolloutId,
        attempt_id: facts.attemptId,
        group_id: groupId,
        seq: call.seq,
        choice_index: choice?.index ?? 0,
        agent_name: call.correlation.agentName,
        model: call.model,
        policy_version: call.policyVersion ?? null,
        api: call.api,
        request: call.request,
        response: call.response,
        streamed: call.streamed,
        status: call.status,
        http_status: call.httpStatus,
        error: call.error,
        finish_reason: choice?.finishReason ?? null,
        usage: call.usage,
        prompt_token_ids: promptIds,
        response_token_ids: responseIds,
        response_logprobs: choice?.responseLogprobs ?? null,
        continues_previous: continues.has(call.seq),
        tool_calls: toolCalls,
        intermediate_reward: intermediate,
        final_reward: facts.finalReward,
        reward: (callCredit ?? 0) + options.airWeight * (intermediate ?? 0),
        credit: callCredit,
        is_last: position === calls.length - 1,
        episode_status: status,
        truncated: call.truncated,
        trace_id: call.traceId,
        span_id: call.spanId,
        started_at: new Date(call.startedAt).toISOString(),
        ended_at: new Date(call.endedAt).toISOString(),
        latency_ms: call.latencyMs,
        ttft_ms: call.ttftMs,
        injected: call.injected,
        translation: call.translation ? { upstream_api: call.translation.upstreamApi, notes: call.translation.notes } : null,
        token_ids_missing: promptIds === null || responseIds === null ? missingIdsReason(call, promptIds === null) : null,
        token_in: call.tokenIn ?? null,
        upstream_replica: call.upstreamReplica ?? null,
        ...(sampling ? { sampling } : {}),
      };
      if (call.bodies) t.source = call.bodies;
      transitions.push(t);
    });
  });
  const plan = segmenter?.finish() ?? { segments: [], unmerged: [] };
  const bySeqChoice = new Map(transitions.map((t) => [`${t.seq}.${t.choice_index}`, t]));
  const trajectories = buildTrajectories(plan, {
    rolloutId: facts.rolloutId,
    attemptId: facts.attemptId,
    groupId: facts.groupId,
    status,
    finalReward: facts.finalReward,
    airWeight: options.airWeight,
    calls: new Map(calls.map((c) => [c.seq, c])),
    transitions: bySeqChoice,
    samplingMasks: options.samplingMasks === true,
    logprobsMode: options.logprobsMode ?? null,
  });
  const bySeq = new Map(calls.map((c) => [c.seq, c]));
  // The calls' bodies are done with: a request is read into a scratch buffer (a big one, into fresh memory, costs a page fault a page).
  for (const t of trajectories)
    t.images = imagesOf(bySeq.get(t.last.seq), withPlaceholders.has(t.last.seq), t.last.prompt_token_ids, read, options.images, options.scratch?.[0]);
  const unmerged = plan.unmerged.flatMap((u) => {
    const ids =
      u.choice === null ? transitions.filter((t) => t.seq === u.seq).map((t) => t.transition_id) : [bySeqChoice.get(`${u.seq}.${u.choice}`)!.transition_id];
    return ids.map((transition_id) => ({ transition_id, reason: u.reason }));
  });
  return {
    episode: {
      schema: 'lightning.episode.v1',
      rollout_id: facts.rolloutId,
      attempt_id: facts.attemptId,
      group_id: facts.groupId,
      episode_status: status,
      final_reward: facts.finalReward,
      rewards: facts.rewards,
      credit_mode: options.credit.mode,
      transitions: transitions.length,
      transition_ids: transitions.map((t) => t.transition_id),
      trajectory_ids: trajectories.map((t) => t.trajectory_id),
      unmerged_calls: unmerged,
      exported: options.exported ?? ['transitions', 'trajectories'],
      ...policyFacts(facts),
      started_at: new Date(facts.startedAt).toISOString(),
      ended_at: new Date(facts.endedAt).toISOString(),
    },
    transitions,
    trajectories,
    firstOffset: facts.firstOffset ?? 0,
  };
}

/**
 * The agent a call ran as, from the agent spans of its trace: the innermost (latest started)
 * one whose time span holds the call. Headers and baggage name the agent first.
 */
function agentOf(call: CallRecord, spans: readonly AgentSpanRecord[]): string | null {
  let best: AgentSpanRecord | null = null;
  for (const s of spans) {
    // A few ms of slack: the agent's clock and the sidecar's are read at different moments.
    if (call.traceId === null || s.traceId !== call.traceId || s.startedAt > call.startedAt + 5 || s.endedAt < call.endedAt - 5) continue;
    if (!best || s.startedAt > best.startedAt) best = s;
  }
  return best?.agentName ?? null;
}

/** Why a transition has no prompt or response ids (docs/output-contract.md: `token_ids_missing`). */
function missingIdsReason(call: CallFacts, prompt: boolean): string {
  if (call.tokenIdsMissing) return call.tokenIdsMissing;
  if (call.status !== 'ok') return `the call ended ${call.status}${call.httpStatus !== null ? ` (HTTP ${call.httpStatus})` : ''}`;
  if (call.truncated) return 'the capture was truncated';
  const which = prompt ? 'prompt' : 'response';
  // The sidecar asks vLLM and SGLang for ids; nothing injected means it did not (flavor openai).
  return call.injected.length === 0
    ? `the model server's answer has no ${which} ids, and the sidecar did not ask for them (an upstream of flavor openai)`
    : `the model server's answer has no ${which} ids`;
}

/** Id ranges that are not integer arrays are recorded as missing, as inline ones are (a repeating prompt: its rest read only). */
function dropInvalidRanges(f: CallFacts, response: Buffer | null, repeat: Repeat | null): void {
  const valid = (ids: CallFacts['promptTokenIds']) =>
    ids === null ||
    Array.isArray(ids) ||
    (response !== null && (ids === repeat?.range ? looksLikeIntArrayRest(response, repeat.at, ids.end) : looksLikeIntArray(response, ids.start, ids.end)))
      ? ids
      : null;
  f.promptTokenIds = valid(f.promptTokenIds);
  for (const c of f.choices) {
    c.promptTokenIds = valid(c.promptTokenIds);
    c.responseTokenIds = valid(c.responseTokenIds);
  }
}

/** The previous captured call with ids: its prompt and answer, whether its prompt holds image placeholders, its prompt's length when counted. */
interface Previous extends Ids {
  placeholders: boolean;
  promptLength: number | null;
}

/** A call's prompt range that starts with the previous call's prompt and answer, as bytes; `at`: where that prefix ends. */
interface Repeat {
  range: IdsRange;
  at: number;
}

/** What a repeating prompt holds after the previous call's prompt and answer: `[at, end)` of `body`. */
interface Rest {
  body: Buffer;
  at: number;
  end: number;
  previous: Previous;
}

/** A repeating prompt's placeholders: the previous prompt's, its answer's, or the rest's. */
function placeholdersAfter(rest: Rest, token: number): boolean {
  return rest.previous.placeholders || hasToken(rest.previous.response, rest.previous.body, token) || tokenIn(rest.body, rest.at, rest.end, token);
}

/** A repeating prompt's length: the previous prompt's and answer's, and one id a comma of the rest (null: count it whole). */
function lengthAfter(rest: Rest): number | null {
  const { promptLength, response, body } = rest.previous;
  const answer = response === null ? null : idsLength(response, body);
  return promptLength === null || answer === null ? null : promptLength + answer + countCommas(rest.body, rest.at, rest.end);
}

function repeatedPrefix(f: CallFacts, body: Buffer | null, previous: Previous | null): Repeat | null {
  const prompt = f.choices[0]?.promptTokenIds ?? f.promptTokenIds;
  if (previous === null || body === null || previous.body === null || prompt === null || Array.isArray(prompt)) return null;
  const { prompt: p, response: r } = previous;
  if (p === null || r === null || Array.isArray(p) || Array.isArray(r)) return null;
  const at = concatPrefixEnd(body, prompt.start, prompt.end, previous.body, [p.start, p.end], [r.start, r.end]);
  return typeof at === 'number' ? { range: prompt, at } : null;
}

/** The token routes token-in calls: their upstream request holds ids, the agent's request the images. */
const TOKEN_ROUTES = new Set(['completions', 'generate', 'sglang.generate']);

const DEFAULT_IMAGES: ImageOptions = { imageTokenId: QWEN_VL_IMAGE_TOKEN_ID, processor: null };

/**
 * The images of a trajectory whose last call is `call` (docs/images.md): its request's image parts
 * and its prompt's placeholder runs. A request that names no image is not parsed, unless its
 * prompt has placeholders (then whatever hides them, a compressed or cut body, fails closed).
 */
function imagesOf(
  call: CallFacts | undefined,
  placeholders: boolean,
  prompt: TokenIds | null,
  read: BodyReader,
  o: ImageOptions = DEFAULT_IMAGES,
  scratch?: Buffer,
): TrajectoryImages | null {
  if (!call) return null;
  // The chat request the images are in: as the model server got it (a translated call's record
  // keeps the agent's Anthropic or Responses request), but for token-in, whose server got ids: the agent's.
  const tokenRoute = TOKEN_ROUTES.has(call.translation?.upstreamApi ?? '');
  const offsets = !tokenRoute && call.bodies && call.bodies.request.length > 0 ? call.bodies.request : null;
  const r = call.request as RawBody | null;
  const journaled = offsets !== null || (r !== null && typeof r === 'object' && r.raw === 'journal');
  let request: unknown = call.request;
  // The proxy found no image name in the bytes sent upstream while they streamed: nothing to read.
  if (offsets !== null && call.namesImage === false && !placeholders) return null;
  if (journaled) {
    let bytes: Buffer;
    try {
      bytes = read(offsets ?? r!.offsets, scratch);
    } catch (err) {
      return placeholders ? unreadable(`the request cannot be read: ${(err as Error).message}`, o) : null;
    }
    if (!placeholders && !namesImage(bytes)) return null;
    try {
      request = JSON.parse(bytes.toString('utf8'));
    } catch {
      return unreadable('the request is not JSON as recorded (compressed, or cut at the capture limit)', o);
    }
  } else if (!placeholders && !hasImageParts(request)) return null;
  // The prompt's ids, read again only for a trajectory with images (its answer can be large: routing).
  let ids: ArrayLike<number> | null = Array.isArray(prompt) ? prompt : null;
  if (prompt !== null && !Array.isArray(prompt) && call.bodies) {
    try {
      ids = resolveIds(prompt, decode(read(call.bodies.response), call.bodies.encoding));
    } catch {
      ids = null;
    }
  }
  return trajectoryImages(request, ids, o);
}

/** Whether prompt ids hold `token`: searched in the answer's bytes for a range (no ids parsed), else in the list. */
function hasToken(prompt: TokenIds | null, body: Buffer | null, token: number): boolean {
  if (prompt === null) return false;
  if (Array.isArray(prompt)) return prompt.includes(token);
  return body !== null && tokenIn(body, prompt.start, prompt.end, token);
}

/**
 * Whether the id array text in `[start, end)` of `body` holds `token` as a whole number. Only the
 * range is searched: a search for digits among digits is slow (~1.4 ms a MB here), and a vLLM
 * answer's `prompt_token_ids` follow its choices, so an unbounded search from an answer's ids went
 * on through the whole prompt.
 */
function tokenIn(body: Buffer, start: number, end: number, token: number): boolean {
  const needle = String(token);
  const range = body.subarray(start, end);
  for (let i = range.indexOf(needle); i >= 0; i = range.indexOf(needle, i + 1)) {
    // A whole number: not part of a longer one.
    const at = start + i;
    const before = body[at - 1];
    const after = body[at + needle.length];
    if ((before === 0x5b || before === 0x2c || before === 0x20) && (after === 0x5d || after === 0x2c || after === 0x20)) return true;
  }
  return false;
}

/** Images that are there but cannot be listed. */
function unreadable(why: string, o: ImageOptions): TrajectoryImages {
  return { images: [], complete: false, error: `unreadable_request: ${why}`, processor: { image_token_id: o.imageTokenId } };
}

/** A call's request as parsed JSON (only the tool-result join asks, for spans nothing else joined). */
function parsedRequest(call: CallFacts, read: BodyReader): unknown {
  const r = call.request as RawBody | null;
  if (r === null || typeof r !== 'object' || r.raw !== 'journal') return call.request;
  try {
    return JSON.parse(read(r.offsets).toString('utf8'));
  } catch {
    return null;
  }
}

/** Versions used by the episode's calls and the staleness lag (DESIGN: policy_version_lag). */
function policyFacts(facts: EpisodeFacts): { policy_versions: string[]; policy_version_lag: number | null } {
  const used = [...new Set(facts.calls.map((c) => c.policyVersion).filter((v): v is string => typeof v === 'string'))];
  const numeric = used.map(Number);
  if (used.length === 0 || numeric.some((n) => !Number.isFinite(n))) return { policy_versions: used, policy_version_lag: null };
  const newest = Math.max(...numeric, facts.maxPolicySeen ?? -Infinity);
  return { policy_versions: used, policy_version_lag: newest - Math.min(...numeric) };
}
