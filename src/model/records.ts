/**
 * Records flowing from receivers to processors. Every captured fact is one of these; the
 * episode assembler is a fold over them (plus `tick`s), so the same stream replayed gives the
 * same transitions.
 */

/**
 * The APIs calls are made in. Only the sidecar calls the token-in routes: `generate` is vLLM's
 * `/inference/v1/generate`, `sglang.generate` SGLang's `/generate`.
 */
export type Api = 'chat.completions' | 'completions' | 'responses' | 'anthropic.messages' | 'generate' | 'sglang.generate';

/** Which rollout a record belongs to (docs/frameworks.md). */
export interface Correlation {
  rolloutId: string;
  attemptId: string;
  groupId: string | null;
  agentName: string | null;
  /** How the rollout id was found: 'path' | 'header' | 'baggage' | 'traceparent' | 'self'. */
  source: 'path' | 'header' | 'baggage' | 'traceparent' | 'self';
  /** The rollout this one is a subagent of (`x-parent-rollout-id` or baggage), when named. */
  parentRolloutId?: string;
  parentAttemptId?: string;
  /** The parent's latest call (its seq) when this call started: the call that spawned the subagent. */
  parentSeq?: number;
}

export interface ToolCallRequest {
  id: string | null;
  name: string | null;
  arguments: string | null;
}

/**
 * Where token ids lie in a call's (decoded) response body: the bytes `[start, end)` are a JSON
 * array of integers. Big id arrays stay in the journal and are copied into the output as they
 * are, never held on the heap.
 */
export interface IdsRange {
  start: number;
  end: number;
}

/** A choice's routing as its answer wrote it (`form`: the engine's), until decoded. */
export interface WireRouting {
  value: unknown;
  prompt: unknown;
  form: 'vllm' | 'sglang';
  start?: unknown;
}

/** Token ids: inline (small, or records from older journals) or a range of the response body. */
export type TokenIds = number[] | IdsRange;

/** One generated sequence of a call (one per choice; `n > 1` gives several). */
export interface ChoiceCapture {
  index: number;
  finishReason: string | null;
  responseTokenIds: TokenIds | null;
  responseLogprobs: number[] | null;
  /** SGLang reports prompt ids per choice. */
  promptTokenIds: TokenIds | null;
  toolCalls: ToolCallRequest[];
  /** The answer's routed experts as the server wrote them (vLLM `routed_experts`, and v0.21's `prompt_routed_experts`), until decoded. */
  routedExperts?: WireRouting;
  /** The answer's sampling mask (vLLM `sampling_mask`, SGLang `output_token_sampling_mask`): kept ids per output token. */
  samplingMask?: SamplingMaskRows;
  /** Why the answer's sampling mask could not be read, or does not fit its tokens. */
  samplingMaskError?: string;
  /** Output tokens whose sampled id is not among the ids the mask says were kept. */
  samplingMaskViolations?: number;
  /** Decoded routed experts, when the answer had them. */
  routing?: RoutingRows;
  /** Why the answer's routed experts could not be read. */
  routingError?: string;
  /**
   * Which weights sampled its tokens, as the server said: spans over the choice's output-token
   * indexes (vLLM `weight_versions`, SGLang `weight_versions`), or one version for the whole answer
   * (SGLang's `weight_version`: the version when it ended).
   */
  weightVersions?: WeightVersionSpan[] | { whole: string };
}

/** Which bytes of a call a journal body frame holds (model server side, or agent side when translated). */
export type BodyKind = 'request' | 'response' | 'agent_request' | 'agent_response';

/** Journal offsets of a call's body frames, in order, and how the response was encoded. */
export interface CallBodies {
  /** As sent to the model server. */
  request: number[];
  /** As the model server answered. */
  response: number[];
  /** The response's content-encoding (the bodies are journaled as they passed). */
  encoding: string | null;
  /** Translated calls: the request and response as the agent sent and received them. */
  agentRequest?: number[];
  agentResponse?: number[];
}

/**
 * A call the sidecar translated for the model server: the call's `api` is what the agent spoke,
 * `upstreamApi` what the model server was asked (its bodies are `request` / `response`).
 */
export interface Translation {
  upstreamApi: Api;
  /** Remarks of the translation (e.g. a tool call with malformed arguments). */
  notes: string[];
}

export interface CallStartRecord {
  type: 'call_start';
  correlation: Correlation;
  seq: number;
  /** The API called (absent in journals written before it existed). */
  api?: Api;
  /** W3C trace id the call carried, so spans of the same trace find its rollout. */
  traceId: string | null;
  at: number;
}

/**
 * The end of a proxied call. Captured calls carry `bodies` (their bytes are in the journal) and
 * no parsed facts: those are extracted when the call's episode closes. Records from journals
 * written before bodies were journaled, and records built in tests, carry the facts inline.
 */
export interface CallRecord {
  type: 'call';
  correlation: Correlation;
  seq: number;
  api: Api;
  traceId: string | null;
  spanId: string | null;
  /** The journal offset of the call's start record: its body frames name it. */
  callId?: number;
  bodies?: CallBodies;
  /** Set when the sidecar translated the call (Responses / Anthropic Messages → chat completions). */
  translation?: Translation;
  /** Why the call has no token ids although it was captured (e.g. a feature translation cannot map). */
  tokenIdsMissing?: string;
  /** How token-in served the call (`spliced`, `rendered:<reason>`, `fallback:<reason>`); absent when token-in is off. */
  tokenIn?: string;
  /** The model-server replica that served the call (`address:port`, docs/routing.md). */
  upstreamReplica?: string;
  model?: string | null;
  /** Request body as sent upstream (parsed JSON), or null when it could not be parsed. */
  request?: unknown;
  /** Response body, or assembled from the stream; null when nothing usable arrived. */
  response?: unknown;
  usage?: unknown;
  promptTokenIds?: TokenIds | null;
  choices?: ChoiceCapture[];
  streamed: boolean;
  status: 'ok' | 'error' | 'aborted';
  httpStatus: number | null;
  error: string | null;
  /** Fields the sidecar added to the upstream request. */
  injected: string[];
  /**
   * Whether the request as sent upstream names an image (`"image_url"` or `"image"`), found by the
   * proxy while the body streamed through; absent where it did not look (the export reads the
   * request then). False spares the export reading a large request back only to learn that.
   */
  namesImage?: boolean;
  /** The capture cap was hit: request and/or response bodies are incomplete. */
  truncated: boolean;
  startedAt: number;
  endedAt: number;
  /** Monotonic duration from request arrival to response end (or failure), ms. */
  latencyMs: number;
  ttftMs: number | null;
  /** The policy that answered: upstream response header, else the control channel's, else config. Absent in journals written before it existed. */
  policyVersion?: string | null;
}

/** The control channel named a new policy version (journaled, so lags replay exactly). */
export interface PolicyRecord {
  type: 'policy';
  version: string;
  at: number;
}

export interface RewardRecord {
  type: 'reward';
  rolloutId: string;
  attemptId: string;
  value: number;
  name: string;
  final: boolean;
  /** Not final, but the final reward unless a later one replaces it (agent-lightning reward spans). */
  provisional?: boolean;
  at: number;
  source: 'rollout_api' | 'agentlightning_events' | 'span';
}

export interface EndRecord {
  type: 'end';
  rolloutId: string;
  attemptId: string;
  at: number;
}

/** What span classification found in a tool span (see processors/spans). */
export interface ToolSpanFacts {
  convention: string;
  toolName: string | null;
  toolCallId: string | null;
  /** The tool's arguments as the span recorded them (capped); absent in journals written before it existed. */
  arguments?: string | null;
  result: string | null;
  outcome: 'ok' | 'error';
  errorType: string | null;
}

/** A tool execution seen as an OTLP span, attributed to a rollout. */
export interface ToolSpanRecord extends ToolSpanFacts {
  type: 'tool_span';
  rolloutId: string;
  attemptId: string;
  traceId: string;
  spanId: string;
  /** Scalar span attributes (bounded), for AIR rule predicates. */
  attributes: Record<string, string | number | boolean>;
  startedAt: number;
  endedAt: number;
  at: number;
}

/** A GenAI agent span (`invoke_agent`): LLM calls of its trace inside its time span ran as that agent. */
export interface AgentSpanRecord {
  type: 'agent_span';
  rolloutId: string;
  attemptId: string;
  traceId: string;
  spanId: string;
  agentName: string;
  startedAt: number;
  endedAt: number;
  at: number;
}

export type PipelineRecord = CallStartRecord | CallRecord | RewardRecord | EndRecord | ToolSpanRecord | AgentSpanRecord | PolicyRecord;

/** A transition, JSON shape (docs/output-contract.md). */
export interface Transition {
  schema: 'lightning.transition.v1';
  transition_id: string;
  rollout_id: string;
  attempt_id: string;
  group_id: string | null;
  seq: number;
  choice_index: number;
  agent_name: string | null;
  model: string | null;
  policy_version: string | null;
  api: Api;
  request: unknown;
  response: unknown;
  streamed: boolean;
  status: 'ok' | 'error' | 'aborted';
  http_status: number | null;
  error: string | null;
  finish_reason: string | null;
  usage: unknown;
  prompt_token_ids: number[] | null;
  response_token_ids: number[] | null;
  response_logprobs: number[] | null;
  continues_previous: boolean;
  tool_calls: TransitionToolCall[];
  intermediate_reward: number | null;
  final_reward: number | null;
  reward: number;
  credit: number | null;
  is_last: boolean;
  episode_status: EpisodeStatus;
  truncated: boolean;
  trace_id: string | null;
  span_id: string | null;
  started_at: string;
  ended_at: string;
  latency_ms: number;
  ttft_ms: number | null;
  injected: string[];
  /** Set when the sidecar translated the call: the API the model server was asked, and remarks. */
  translation: { upstream_api: Api; notes: string[] } | null;
  /** Why `prompt_token_ids` is null although the call was captured (e.g. a feature translation cannot map). */
  token_ids_missing: string | null;
  /** How token-in served the call (docs/token-in.md); null when token-in is off. */
  token_in: string | null;
  /** The model-server replica that answered the call (`address:port`); null when none answered. */
  upstream_replica: string | null;
  /** The sampling parameters the server was asked for; only with `processors.sampling.record`. */
  sampling?: SamplingParams;
}

/**
 * The sampling parameters of a call as the request the model server got had them (after the
 * sidecar's own additions, e.g. token-in's `max_tokens`); null where it left one to the server's
 * default (docs/output-contract.md#sampling-parameters).
 */
export interface SamplingParams {
  temperature: number | null;
  top_p: number | null;
  top_k: number | null;
  min_p: number | null;
  seed: number | null;
  presence_penalty: number | null;
  frequency_penalty: number | null;
  repetition_penalty: number | null;
  /** `max_tokens`, else chat's `max_completion_tokens`. */
  max_tokens: number | null;
  /**
   * The parameters whose value is the model server's default (`processors.sampling.server_defaults`),
   * the request having left them out; only when a default was applied.
   */
  server_defaults?: string[];
}

/** A body still in the journal, copied into the output as it is, less the byte ranges in `cuts`. */
export interface RawBody {
  raw: 'journal';
  offsets: number[];
  /** content-encoding of the journaled bytes (undone before copying). */
  encoding: string | null;
  /** Sorted, disjoint `[start, end)` ranges of the decoded bytes to leave out. */
  cuts: [number, number][];
}

/**
 * A transition as the pipeline hands it to exporters: the wire shape, except that bodies may
 * still be in the journal (`RawBody`) and token ids may be ranges of the call's response body
 * (`source` says where that body is). Exporters encode it with the journal at hand.
 */
export type TransitionRecord = Omit<Transition, 'prompt_token_ids' | 'response_token_ids'> & {
  prompt_token_ids: TokenIds | null;
  response_token_ids: TokenIds | null;
  /** The call's journaled bodies, for ranges and raw bodies. */
  source?: CallBodies;
};

export interface TransitionToolCall {
  id: string | null;
  name: string | null;
  /** `ok` / `error` from the tool span; `missing` when no span came; null when the agent sends no tool spans at all. */
  status: 'ok' | 'error' | 'missing' | null;
  reward: number | null;
  span_id: string | null;
  /** How the span was joined to this call: `tool_call_id`, `trace_and_name`, `trace_and_arguments`, `tool_result`; null when not joined. */
  join: 'tool_call_id' | 'trace_and_name' | 'trace_and_arguments' | 'tool_result' | null;
}

/** How an episode closed (docs/output-contract.md#episode-lightningepisodev1). */
export type EpisodeStatus = 'completed' | 'timed_out' | 'evicted' | 'shutdown';

export interface EpisodeSummary {
  schema: 'lightning.episode.v1';
  rollout_id: string;
  attempt_id: string;
  group_id: string | null;
  episode_status: EpisodeStatus;
  final_reward: number | null;
  rewards: { name: string; value: number; final: boolean }[];
  credit_mode: string;
  transitions: number;
  transition_ids: string[];
  /** The attempt's trajectories (one per segment), in segment order. */
  trajectory_ids: string[];
  /** Calls left out of every trajectory, and why. */
  unmerged_calls: { transition_id: string; reason: UnmergedReason }[];
  /** What the exporter writes for this attempt (`exporters.records`). */
  exported: ('transitions' | 'trajectories')[];
  /** Policy versions used by this episode's calls (distinct, in first-use order). */
  policy_versions: string[];
  /**
   * Newest version the sidecar had seen when the episode closed minus the oldest its calls used
   * (numeric versions only; null otherwise): how stale the rollout is for on-policy training.
   */
  policy_version_lag: number | null;
  started_at: string;
  ended_at: string;
}

/** Why a call is in no trajectory (docs/output-contract.md#trajectory-lightningtrajectoryv1). */
export type UnmergedReason = 'not_ok' | 'truncated' | 'no_token_ids' | 'empty_response' | 'retried' | 'other_choice';
/** Why a call started a new segment rather than continue one. */
export type SegmentStart = 'first' | 'diverged' | 'other_agent';

export interface TrajectoryTurn {
  transition_id: string;
  seq: number;
  choice_index: number;
  /** Where the call's sampled ids lie in `token_ids`: `[response_start, response_end)`. */
  response_start: number;
  response_end: number;
  /** The call's logprobs are in `logprobs` (false: 0 there, as on masked positions). */
  has_logprobs: boolean;
  finish_reason: string | null;
  tool_calls: TransitionToolCall[];
  intermediate_reward: number | null;
  /** The call's transition reward (credit + AIR), for reference; `token_rewards` places rewards for trajectory training. */
  reward: number;
  policy_version: string | null;
  /** The call's sampling parameters; only with `processors.sampling.record`. */
  sampling?: SamplingParams;
}

/** A trajectory, JSON shape (docs/output-contract.md). */
export interface Trajectory {
  schema: 'lightning.trajectory.v1';
  trajectory_id: string;
  rollout_id: string;
  attempt_id: string;
  group_id: string | null;
  agent_name: string | null;
  segment: number;
  segments: number;
  start_reason: SegmentStart;
  parent_trajectory_id: string | null;
  parent_rollout_id: string | null;
  parent_attempt_id: string | null;
  parent_transition_id: string | null;
  prompt_length: number;
  token_ids: number[];
  loss_mask: number[];
  logprobs: number[] | null;
  /**
   * MoE routing replay: the experts the engine chose, one row per position of `token_ids` but the
   * last (row `i` is the forward pass over position `i`); present only when a call of the
   * trajectory returned routing (docs/output-contract.md#routed-experts).
   */
  routed_experts?: RoutedExpertsJson;
  /** Share of sampled positions whose row (the one before them) is present; with `routed_experts`. */
  routing_coverage?: number;
  /** Every row present and every call's rows aligned with its tokens; with `routed_experts`. */
  routing_complete?: boolean;
  /**
   * Which weights sampled which tokens: `[start, end)` ranges of `token_ids` positions, in order,
   * each with its version; present only when a call's answer said (docs/output-contract.md#weight-versions).
   */
  weight_versions?: WeightVersionSpan[];
  /**
   * Sampling masks: the ids the sampler kept at each sampled position (top-k / top-p / min-p);
   * present when a call returned one or `processors.sampling.masks` asks for them
   * (docs/output-contract.md#sampling-masks).
   */
  sampling_mask?: SamplingMaskJson;
  /** Share of sampled positions with a mask row; with `sampling_mask`. */
  sampling_mask_coverage?: number;
  /** Every sampled position has its row and every sampled id lies in it; with `sampling_mask`. */
  sampling_mask_complete?: boolean;
  /** Sampled ids not in their row (each one a sampler or capture fault); with `sampling_mask`. */
  sampling_mask_violations?: number;
  /** Which distribution `logprobs` are over (`processors.sampling.logprobs_mode`); only when configured. */
  logprobs_mode?: string;
  /**
   * The images of the segment's last call, in conversation order, each with its placeholder run in
   * `token_ids`; present only when that call had images (docs/images.md).
   */
  images?: TrajectoryImage[];
  /** Every image's bytes are stored and its placeholder run found; with `images`. A trainer must not train on a trajectory where this is false as if it were text. */
  images_complete?: boolean;
  /** Why `images_complete` is false (the first problem); with `images`. */
  images_error?: string | null;
  /** The image placeholder token id the runs were found by, and the processor settings the sidecar was given; with `images`. */
  image_processor?: ImageProcessorJson;
  turns: TrajectoryTurn[];
  token_rewards: { position: number; value: number }[];
  reward: number;
  final_reward: number | null;
  episode_status: EpisodeStatus;
  policy_versions: string[];
  started_at: string;
  ended_at: string;
}

export type RoutingDtype = 'uint8' | 'int16' | 'uint16' | 'int32';

/** Expert ids, row-major `[rows, layers, top_k]`, in the smallest type that holds them. */
export type RoutingArray = Uint8Array | Int16Array | Uint16Array | Int32Array;

/** One call's routing rows: `rows × layers × topK` expert ids, row-major, covering positions `[start, start + rows)`. */
export interface RoutingRows {
  start: number;
  rows: number;
  layers: number;
  topK: number;
  data: RoutingArray;
  /**
   * vLLM v0.21's lists give one row per token, the last sampled one included (its documented
   * shapes are `[prompt_len, …]` and `[gen_len, …]`); that row decided no token of the call and is
   * not used. Unset for the forms that stop at the last token but one.
   */
  rowPerToken?: boolean;
}

/** A trajectory's routing: one row per position but the last, with what is missing. */
export interface TrajectoryRouting {
  /** `length - 1`: a row per position but the last. */
  rows: number;
  layers: number;
  topK: number;
  /** `(length - 1) × layers × topK`, narrowed; rows of missing positions hold 0. */
  data: RoutingArray;
  /** Position ranges `[start, end)` with no row (no call routed them, or a call's rows did not fit). */
  missing: [number, number][];
  /** Share of sampled positions whose logits' row is present (row `p - 1` for a sampled token at `p`). */
  coverage: number;
  /** Every row present and every call's rows aligned with its tokens. */
  complete: boolean;
  /** Why it is not complete, one entry a reason. */
  problems: string[];
}

/** Kept token ids per output token, in compressed rows: row `r` is `ids[offsets[r]..offsets[r + 1])`. */
export interface SamplingMaskRows {
  offsets: Int32Array;
  ids: Int32Array;
}

/** A trajectory's sampling masks: kept ids per position of `token_ids`, in compressed rows (empty where nothing was sampled). */
export interface TrajectorySamplingMask {
  /** `length + 1` offsets into `ids`. */
  offsets: Int32Array;
  ids: Int32Array;
  /** Sampled position ranges `[start, end)` whose call returned no mask. */
  missing: [number, number][];
  /** Share of sampled positions with a mask row. */
  coverage: number;
  /** Every sampled position has its row and every sampled id is in it. */
  complete: boolean;
  /** Sampled ids not among their row's kept ids. */
  violations: number;
  /** Why it is not complete, one entry a reason. */
  problems: string[];
}

/** The sampling masks as JSON: `offsets` (`len(token_ids) + 1`) into `ids`, with what is missing. */
export interface SamplingMaskJson {
  offsets: number[];
  ids: number[];
  missing: [number, number][];
}

/** Tokens `[start, end)` sampled with the weights of `version`. */
/** One image of a trajectory (docs/images.md). */
export interface TrajectoryImage {
  /** Its place among the trajectory's images (conversation order, from 0). */
  order: number;
  /** SHA-256 (hex) of the image's bytes as the agent sent them; the name it is stored under. Null for an http(s) URL. */
  sha256: string | null;
  mime: string | null;
  /** Its size in bytes (null for a URL). */
  bytes: number | null;
  width: number | null;
  height: number | null;
  /** The address of an image the request only named (http/https); null for one sent as data. */
  url: string | null;
  /** Its placeholder run in `token_ids`: `[start, start + length)`; null when the runs do not pair with the images. */
  start: number | null;
  length: number | null;
}

export interface ImageProcessorJson {
  image_token_id: number;
  /** The Qwen-VL resize settings, when configured (`processors.images.processor`). */
  factor?: number;
  min_pixels?: number;
  max_pixels?: number;
}

/** A trajectory's images as built (before the bytes are stored). */
/** The image placeholder (`<|image_pad|>`) of Qwen2-VL, Qwen2.5-VL and Qwen3-VL: `processors.images.image_token_id`'s default. */
export const QWEN_VL_IMAGE_TOKEN_ID = 151655;

export interface TrajectoryImages {
  images: TrajectoryImage[];
  complete: boolean;
  error: string | null;
  processor: ImageProcessorJson;
  /** The images' bytes, by order (null for a URL or an unreadable one), until they are stored; never exported. */
  pending?: (Buffer | null)[];
}

export interface WeightVersionSpan {
  version: string;
  start: number;
  end: number;
}

/** A trajectory's routed experts as JSON: little-endian C-order values, base64, of `shape` `[rows, layers, top_k]`. */
export interface RoutedExpertsJson {
  dtype: RoutingDtype;
  shape: [number, number, number];
  data: string;
  /** Position ranges `[start, end)` whose rows no call gave (their values are 0). */
  missing: [number, number][];
}

/**
 * A trajectory as the pipeline hands it to exporters: the wire shape less its three per-token
 * arrays, which are written from the journal when it is encoded: `token_ids` are the last turn's
 * prompt and response ids (`last`), the mask follows from the turns, the logprobs are the turns'.
 */
export type TrajectoryRecord = Omit<
  Trajectory,
  | 'token_ids'
  | 'loss_mask'
  | 'logprobs'
  | 'routed_experts'
  | 'routing_coverage'
  | 'routing_complete'
  | 'weight_versions'
  | 'sampling_mask'
  | 'sampling_mask_coverage'
  | 'sampling_mask_complete'
  | 'sampling_mask_violations'
  | 'logprobs_mode'
  | 'images'
  | 'images_complete'
  | 'images_error'
  | 'image_processor'
> & {
  /** Its images (null: the segment's last call had none); the bytes are in that call's request. */
  images: TrajectoryImages | null;
  /** The sampling masks of its calls over `token_ids` (null: none came and none were asked for). */
  samplingMask: TrajectorySamplingMask | null;
  /** `processors.sampling.logprobs_mode` (null: not configured). */
  logprobsMode: string | null;
  /** The weight-version spans of its calls' answers, over `token_ids` positions (null: no call said). */
  weightVersions: WeightVersionSpan[] | null;
  /** The routed experts of its calls, aligned (null: no call returned any); written as `routed_experts` and its two flags. */
  routing: TrajectoryRouting | null;
  /** The transition of the segment's last call: its prompt and response ids are `token_ids`. */
  last: TransitionRecord;
  /** Length of `token_ids`. */
  length: number;
  /** Each turn's sampled logprobs (null where the turn has none). */
  turnLogprobs: (number[] | null)[];
};

export interface ClosedEpisode {
  episode: EpisodeSummary;
  transitions: TransitionRecord[];
  trajectories: TrajectoryRecord[];
  /** Lowest journal offset among the records of this episode (what must be kept until delivery). */
  firstOffset: number;
}
