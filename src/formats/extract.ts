import { brotliDecompressSync, gunzipSync, inflateSync } from 'node:zlib';
import type { CallRecord, ChoiceCapture, RawBody, TokenIds } from '../model/records';
import { extractBody, extractStream, type Extracted } from './adapters';
import { intList, isObject } from './json';
import { extend } from '../model/extend';
import { IDS_MARKER, logprobsMarker, ROUTING_MARKER } from './adapters/shape';
import { findMembers, memberCut, quoteFree, readChosenLogprobs, readIntArray, skipValue, topLevelMembers, type Member, type ValueEnd } from './json-scan';

/**
 * Reads the bytes of journaled body frames, in order; into `scratch` when it is given and big
 * enough (the bytes are then valid only until the scratch buffer is reused). `range`, where the
 * reader has it, reads only bytes `[start, end)` of that body.
 */
export type BodyReader = ((offsets: readonly number[], scratch?: Buffer) => Buffer) & {
  range?: (offsets: readonly number[], start: number, end: number, scratch?: Buffer) => Buffer;
};

/** A call with its facts extracted; bodies stay in the journal (`RawBody`) where they can. */
export interface CallFacts extends CallRecord {
  model: string | null;
  usage: unknown;
  promptTokenIds: TokenIds | null;
  choices: ChoiceCapture[];
  request: unknown;
  response: unknown;
}

const MAX_DECODED = 64 * 1024 * 1024;

/**
 * Extracts what a transition needs from a captured call's journaled response: model, usage,
 * finish reasons, tool calls, logprobs, and where the token-id arrays lie. The id arrays are not
 * parsed: they are cut out of the text before it is parsed and replaced by markers naming their
 * byte ranges, so the parse costs what the answer costs, not what the prompt costs. Never throws:
 * what cannot be read or parsed is recorded as null with a reason, as the call's error.
 * The decoded response is returned too, for callers that check ids now (continuity).
 */
export function extractFacts(call: CallRecord, read: BodyReader, scratch?: Buffer): { facts: CallFacts; responseBytes: Buffer | null } {
  if (!call.bodies) {
    const facts: CallFacts = extend(call, {
      model: call.model ?? null,
      usage: call.usage ?? null,
      promptTokenIds: call.promptTokenIds ?? null,
      choices: call.choices ?? [],
      request: call.request ?? null,
      response: call.response ?? null,
    });
    return { facts, responseBytes: null };
  }
  const bodies = call.bodies;
  let extracted: Extracted | null = null;
  let parseError: string | null = null;
  let response: unknown = null;
  let decoded: Buffer | null = null;
  try {
    const raw = bodies.response.length > 0 ? read(bodies.response, scratch) : null;
    if (raw !== null && raw.length > 0) {
      decoded = decode(raw, bodies.encoding);
      if (decoded === null) parseError = `cannot decode content-encoding ${bodies.encoding}`;
    }
  } catch (err) {
    parseError = `response body unreadable from the journal: ${(err as Error).message}`;
  }
  // A translated call: ids come from the model server's answer (upstream API); the transition
  // keeps what the agent sent and received.
  const upstreamApi = call.translation?.upstreamApi ?? call.api;
  if (decoded !== null) {
    const lifted = upstreamApi === 'chat.completions' || upstreamApi === 'completions' || upstreamApi === 'generate' || upstreamApi === 'sglang.generate';
    if (call.streamed) {
      const patched = patchIds(decoded, ['prompt_token_ids']);
      extracted = extractStream(upstreamApi, patched.text);
      response = lifted ? withoutLiftedMembers(extracted.response) : extracted.response;
    } else {
      // A chat answer's logprobs (an object per token, with its top alternatives) are read from
      // the bytes as they are found, and left out of the parse.
      const logprobs = new Map<string, number[] | null>();
      const bytes = decoded;
      const readLogprobs: ValueEnd = (buf, i, end) => {
        if (upstreamApi === 'chat.completions' && buf[i] === 0x7b) {
          const r = readChosenLogprobs(buf, i, end);
          if (r !== null) {
            logprobs.set(logprobsMarker(i), r.values);
            return r.end;
          }
        }
        return skipValue(buf, i, end);
      };
      // The id arrays first: the other members are searched around the long ones (a growing
      // context's prompt ids are most of its answer, and a search through digits is slow).
      const ids = idArrays(bytes, ID_KEYS);
      const lpMembers = lifted
        ? findMembers(bytes, 'logprobs', 0, bytes.length, readLogprobs, ids.skip).filter((m) => bytes[m.valueStart] === 0x7b || bytes[m.valueStart] === 0x6e)
        : [];
      // Routed experts (base64, megabytes) are decoded from the bytes too, not parsed as a string.
      const routing = lifted ? findMembers(bytes, 'routed_experts', 0, bytes.length, undefined, ids.skip).filter((m) => bytes[m.valueStart] === 0x22) : [];
      let patched = patchIds(
        bytes,
        ID_KEYS,
        lpMembers.filter((m) => logprobs.has(logprobsMarker(m.valueStart))),
        routing,
        ids.members,
      );
      let value: unknown;
      try {
        value = JSON.parse(patched.text);
        // Only choices' own logprobs may be read that way: a `logprobs` object elsewhere (inside
        // tool-call arguments, say), or a server string that looks like a marker, and the body is
        // parsed whole instead.
        if (!markersOnlyInChoices(value, logprobs)) {
          logprobs.clear();
          patched = patchIds(bytes, ID_KEYS, [], routing, ids.members);
          value = JSON.parse(patched.text);
        }
      } catch {
        parseError = 'response body is not JSON';
      }
      if (parseError === null) {
        extracted = extractBody(upstreamApi, value, logprobs);
        const used = usedRanges(extracted);
        const cut = patched.members.filter((m) => used.has(m.valueStart)).map((m) => memberCut(bytes, m));
        for (const m of lpMembers) cut.push(memberCut(bytes, m));
        const rawBody: RawBody = { raw: 'journal', offsets: bodies.response, encoding: bodies.encoding, cuts: mergeCuts(cut) };
        response = rawBody;
      }
    }
  }
  let status = call.status;
  let error = call.error;
  const httpStatus = call.httpStatus;
  if (status === 'ok' && httpStatus !== null && httpStatus >= 400) {
    status = 'error';
    error = `upstream answered ${httpStatus}`;
  }
  if (status === 'ok' && extracted?.incomplete) {
    status = 'error';
    error = 'stream ended without its terminal event';
  }
  if (status === 'ok' && parseError && !call.truncated) {
    status = 'error';
    error = parseError;
  }
  let request: RawBody | null = bodies.request.length > 0 ? { raw: 'journal', offsets: bodies.request, encoding: null, cuts: [] } : null;
  let choices = extracted?.choices ?? [];
  if (call.translation && bodies.agentRequest) {
    request = bodies.agentRequest.length > 0 ? { raw: 'journal', offsets: bodies.agentRequest, encoding: null, cuts: [] } : null;
    const received = agentResponse(
      call,
      bodies.agentResponse ?? [],
      read,
      (upstreamApi === 'completions' || upstreamApi === 'generate' || upstreamApi === 'sglang.generate') && call.api === 'chat.completions',
    );
    response = received.response;
    if (received.facts !== null) choices = withAgentFacts(choices, received.facts);
  }
  const facts: CallFacts = extend(call, {
    status,
    error,
    model: extracted?.model ?? modelFromRequest(bodies.request, read),
    usage: extracted?.usage ?? null,
    promptTokenIds: extracted?.promptTokenIds ?? (upstreamApi === 'sglang.generate' && extracted ? inputIds(bodies.request, read) : null),
    choices,
    request,
    response,
  });
  return { facts, responseBytes: decoded };
}

/**
 * What a translated call's agent received: its JSON as it is, or its stream assembled. With
 * `facts`, also the choices read from it as from any answer of the agent's API: a chat call served
 * over completions (token-in) has its finish reasons and tool calls only there, and the record
 * must say what the agent got, whatever route served it (null when it cannot be read).
 */
function agentResponse(call: CallRecord, offsets: number[], read: BodyReader, facts: boolean): { response: unknown; facts: ChoiceCapture[] | null } {
  if (offsets.length === 0) return { response: null, facts: null };
  if (!call.streamed && !facts) return { response: { raw: 'journal', offsets, encoding: null, cuts: [] } satisfies RawBody, facts: null };
  try {
    const text = read(offsets).toString('utf8');
    if (call.streamed) {
      const e = extractStream(call.api, text);
      return { response: e.response, facts: facts ? e.choices : null };
    }
    const raw: RawBody = { raw: 'journal', offsets, encoding: null, cuts: [] };
    try {
      return { response: raw, facts: extractBody(call.api, JSON.parse(text)).choices };
    } catch {
      return { response: raw, facts: null };
    }
  } catch {
    return { response: null, facts: null };
  }
}

/**
 * The model server's choices with what the agent received in place of what the server's own
 * shape says (finish reason, tool calls); ids and logprobs stay the server's. A choice the agent's
 * answer does not have keeps the server's facts.
 */
function withAgentFacts(server: ChoiceCapture[], agent: ChoiceCapture[]): ChoiceCapture[] {
  if (agent.length === 0) return server;
  const byIndex = new Map(agent.map((c) => [c.index, c]));
  return server.map((c) => {
    const a = byIndex.get(c.index);
    return a ? extend(c, { finishReason: a.finishReason, toolCalls: a.toolCalls }) : c;
  });
}

/** The request's `model` (for answers that do not name it, such as errors). */
/** The prompt ids of a request to SGLang's `/generate` (its top-level `input_ids`), which its answer does not repeat. */
function inputIds(offsets: number[], read: BodyReader): number[] | null {
  if (offsets.length === 0) return null;
  try {
    const body = read(offsets);
    const at = topLevelMembers(body)?.get('input_ids');
    return at ? intList(JSON.parse(body.toString('latin1', at[0], at[1]))) : null;
  } catch {
    return null;
  }
}

function modelFromRequest(offsets: number[], read: BodyReader): string | null {
  if (offsets.length === 0) return null;
  try {
    const body = read(offsets);
    for (const m of findMembers(body, 'model')) {
      if (body[m.valueStart] !== 0x22) continue;
      const v: unknown = JSON.parse(body.toString('utf8', m.valueStart, m.valueEnd));
      if (typeof v === 'string') return v;
    }
  } catch {
    // A request that cannot be read names no model.
  }
  return null;
}

/** The members an answer's token ids are in, the prompt's first (the longest, searched around after). */
const ID_KEYS = ['prompt_token_ids', 'token_ids'];

/**
 * The array members named by `keys`, in the order of the keys, each key's search going around the
 * long arrays of those before it; `skip`: the long ones, for other searches (`findMembers`).
 */
export function idArrays(buf: Buffer, keys: readonly string[]): { members: Member[]; skip: Member[] } {
  const members: Member[] = [];
  let skip: Member[] = [];
  for (const key of keys) {
    const found = findMembers(buf, key, 0, buf.length, undefined, skip).filter((m) => buf[m.valueStart] === 0x5b);
    for (const m of found) members.push(m);
    const long = quoteFree(buf, found);
    if (long.length > 0) skip = [...skip, ...long].sort((a, b) => a.valueStart - b.valueStart);
  }
  return { members, skip };
}

/**
 * The text of `buf` with each `key` member's array value replaced by a marker string naming the
 * array's byte range, and each of `read` (logprobs objects already read) by its logprobs marker.
 * `members`: those arrays when already found (`idArrays(buf, keys).members`).
 */
export function patchIds(
  buf: Buffer,
  keys: readonly string[],
  read: Member[] = [],
  strings: Member[] = [],
  members: Member[] = idArrays(buf, keys).members,
): { text: string; members: Member[] } {
  if (members.length === 0 && read.length === 0 && strings.length === 0) return { text: buf.toString('utf8'), members };
  const replaced = members.map((m) => ({ m, marker: `${IDS_MARKER}${m.valueStart}:${m.valueEnd}` }));
  for (const m of read) replaced.push({ m, marker: logprobsMarker(m.valueStart) });
  for (const m of strings) replaced.push({ m, marker: `${ROUTING_MARKER}${m.valueStart}:${m.valueEnd}` });
  replaced.sort((a, b) => a.m.valueStart - b.m.valueStart);
  const parts: string[] = [];
  let at = 0;
  for (const { m, marker } of replaced) {
    if (m.valueStart < at) continue;
    parts.push(buf.toString('utf8', at, m.valueStart), JSON.stringify(marker));
    at = m.valueEnd;
  }
  parts.push(buf.toString('utf8', at));
  return { text: parts.join(''), members };
}

/** Whether each logprobs marker stands, once, as a choice's own `logprobs` (and no choice has another). */
function markersOnlyInChoices(value: unknown, markers: ReadonlyMap<string, unknown>): boolean {
  if (markers.size === 0) return true;
  const choices = isObject(value) && Array.isArray(value.choices) ? value.choices : [];
  const seen = new Set<string>();
  for (const c of choices) {
    if (!isObject(c) || typeof c.logprobs !== 'string' || !markers.has(c.logprobs)) continue;
    if (seen.has(c.logprobs)) return false;
    seen.add(c.logprobs);
  }
  return seen.size === markers.size;
}

function usedRanges(e: Extracted): Set<number> {
  const used = new Set<number>();
  const add = (ids: TokenIds | null) => {
    if (ids !== null && !Array.isArray(ids)) used.add(ids.start);
  };
  add(e.promptTokenIds);
  for (const c of e.choices) {
    add(c.promptTokenIds);
    add(c.responseTokenIds);
  }
  return used;
}

/** Chat / text completion assembled from a stream, without the members lifted out beside it. */
function withoutLiftedMembers(response: unknown): unknown {
  if (typeof response !== 'object' || response === null) return response;
  const r = { ...(response as Record<string, unknown>) };
  delete r.prompt_token_ids;
  if (Array.isArray(r.choices)) {
    r.choices = r.choices.map((c: unknown) => {
      if (typeof c !== 'object' || c === null) return c;
      const copy = { ...(c as Record<string, unknown>) };
      delete copy.token_ids;
      delete copy.prompt_token_ids;
      delete copy.logprobs;
      return copy;
    });
  }
  return r;
}

function mergeCuts(cuts: [number, number][]): [number, number][] {
  cuts.sort((a, b) => a[0] - b[0]);
  const out: [number, number][] = [];
  for (const c of cuts) {
    const last = out[out.length - 1];
    if (last && c[0] <= last[1]) last[1] = Math.max(last[1], c[1]);
    else out.push([c[0], c[1]]);
  }
  return out;
}

/** Token ids as numbers: inline ones as they are, ranges read from the decoded response. */
export function resolveIds(ids: TokenIds | null, response: Buffer | null): ArrayLike<number> | null {
  if (ids === null) return null;
  if (Array.isArray(ids)) return ids;
  if (response === null) return null;
  return readIntArray(response, ids.start, ids.end);
}

/** A body that is its bytes as sent: no content-encoding. */
export function isIdentity(encoding: string | null | undefined): boolean {
  const enc = (encoding ?? 'identity').trim().toLowerCase();
  return enc === 'identity' || enc === '';
}

/** Undoes a response `content-encoding` (the agent got the encoded bytes; the journal keeps them). */
export function decode(bytes: Buffer, encoding: string | null | undefined): Buffer | null {
  if (isIdentity(encoding)) return bytes;
  const enc = (encoding ?? '').trim().toLowerCase();
  try {
    if (enc === 'gzip' || enc === 'x-gzip') return gunzipSync(bytes, { maxOutputLength: MAX_DECODED });
    if (enc === 'deflate') return inflateSync(bytes, { maxOutputLength: MAX_DECODED });
    if (enc === 'br') return brotliDecompressSync(bytes, { maxOutputLength: MAX_DECODED });
  } catch {
    return null;
  }
  return null;
}
