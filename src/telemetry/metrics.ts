import { Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { FastCounter, FastHistogram } from './fast-metrics';
import type { Api } from '../model/records';

/**
 * Every metric the sidecar exports, in one place. Names are prefixed `lightning_sidecar_`.
 * Labels are bounded: api names, status classes, fixed reason codes; never ids or model strings.
 */
export function createMetrics(options: { defaultMetrics?: boolean } = {}) {
  const registry = new Registry();
  // The event loop delay is sampled every 100 ms (prom-client's 10 ms wakes an idle sidecar 100 times a second).
  if (options.defaultMetrics) collectDefaultMetrics({ register: registry, prefix: 'lightning_sidecar_', eventLoopMonitoringPrecision: 100 });
  // prom-client also exports these totals as gauges, and `_total` is reserved for counters; each is
  // the sum of the per-type gauge of the same name without `_total`, which stays.
  for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'])
    registry.removeSingleMetric(`lightning_sidecar_${name}`);
  // Seconds, as Prometheus wants; the proxy's own overhead is well under a millisecond, a model call
  // can take minutes.
  const seconds = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
  const fine = [0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1];
  // In registration order: the order of the /metrics page.
  const metrics = {
    registry,
    ...proxyMetrics(registry, seconds, fine),
    ...spanMetrics(registry),
    ...deliveryMetrics(registry),
    ...upstreamMetrics(registry),
    ...kafkaMetrics(registry),
    ...journalMetrics(registry),
    ...episodeMetrics(registry),
    ...exportMetrics(registry),
    ...controlMetrics(registry),
  };
  // Series an alert watches with increase() start at 0, so their first event is an increase (a
  // series born at 1 has none to see).
  for (const reason of ['capture_cap', 'capture_error', 'journal_full', 'journal_unwritable', 'export_backlog']) metrics.captureDrops.inc({ reason }, 0);
  for (const action of ['chunked', 'dead_letter']) metrics.exportOversize.inc({ action }, 0);
  for (const api of ['chat.completions', 'completions', 'responses', 'anthropic.messages'] satisfies Api[]) metrics.missingTokenIds.inc({ api }, 0);
  return metrics;
}

export type Metrics = ReturnType<typeof createMetrics>;

/** Proxied calls: requests, latency, streaming, tokens, and captures not kept. */
function proxyMetrics(registry: Registry, seconds: number[], fine: number[]) {
  return {
    proxyRequests: new FastCounter({
      name: 'lightning_sidecar_proxy_requests_total',
      help: 'Proxied requests by recorded api (or "other") and response status class.',
      labelNames: ['api', 'status_class'] as const,
      registers: [registry],
    }),
    proxyDuration: new FastHistogram({
      name: 'lightning_sidecar_proxy_request_duration_seconds',
      help: 'Whole proxied request time, from request arrival to response end, in seconds.',
      labelNames: ['api', 'streamed'] as const,
      buckets: seconds,
      registers: [registry],
    }),
    upstreamTtfb: new FastHistogram({
      name: 'lightning_sidecar_upstream_ttfb_seconds',
      help: 'Upstream time to first response byte, from dispatch, in seconds.',
      labelNames: ['api'] as const,
      buckets: seconds,
      registers: [registry],
    }),
    proxyAdded: new FastHistogram({
      name: 'lightning_sidecar_proxy_added_latency_seconds',
      help: "The proxy's own time before the agent got the response head: total time to head minus upstream time to head, in seconds.",
      labelNames: ['api'] as const,
      buckets: fine,
      registers: [registry],
    }),
    streamedChunks: new FastCounter({
      name: 'lightning_sidecar_streamed_chunks_total',
      help: 'Response body chunks forwarded on streamed (SSE) calls.',
      labelNames: ['api'] as const,
      registers: [registry],
    }),
    tokens: new FastCounter({
      name: 'lightning_sidecar_tokens_total',
      help: 'Tokens seen on recorded calls, by kind (prompt, response).',
      labelNames: ['kind'] as const,
      registers: [registry],
    }),
    missingTokenIds: new FastCounter({
      name: 'lightning_sidecar_calls_missing_token_ids_total',
      help: 'Recorded calls whose response carried no token ids (the server was not asked or cannot return them).',
      labelNames: ['api'] as const,
      registers: [registry],
    }),
    captureDrops: new FastCounter({
      name: 'lightning_sidecar_capture_drops_total',
      help: 'Captures not kept or kept incomplete, by reason.',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
  };
}

/** OTLP spans: intake, classification, tool calls and their AIR rewards. */
function spanMetrics(registry: Registry) {
  return {
    otlpSpans: new FastCounter({
      name: 'lightning_sidecar_otlp_spans_total',
      help: 'OTLP spans received, by transport (grpc, http), outcome (accepted, refused, rejected) and reason.',
      labelNames: ['transport', 'outcome', 'reason'] as const,
      registers: [registry],
    }),
    spansClassified: new FastCounter({
      name: 'lightning_sidecar_spans_classified_total',
      help: 'Accepted spans by kind (tool, reward, other) and what became of them (recorded, rejected as late or for no known rollout, unattributed, dropped).',
      labelNames: ['kind', 'result'] as const,
      registers: [registry],
    }),
    toolSpans: new FastCounter({
      name: 'lightning_sidecar_tool_spans_total',
      help: 'Tool calls on closed episodes by outcome (ok, error, missing, unobserved).',
      labelNames: ['outcome'] as const,
      registers: [registry],
    }),
    airRewards: new FastHistogram({
      name: 'lightning_sidecar_air_reward',
      help: 'Intermediate (AIR) rewards given to tool calls.',
      buckets: [-1, -0.5, -0.25, -0.1, 0, 0.1, 0.25, 0.5, 1],
      registers: [registry],
    }),
    pendingSpans: new Gauge({
      name: 'lightning_sidecar_pending_spans',
      help: 'Tool and reward spans waiting for a call of their trace to name their rollout.',
      registers: [registry],
    }),
  };
}

/** Delivery of exported records: oversize records and the lag to acknowledgement. */
function deliveryMetrics(registry: Registry) {
  return {
    exportOversize: new FastCounter({
      name: 'lightning_sidecar_export_oversize_total',
      help: 'Records above the Kafka message size, by what was done (chunked: sent in chunks; dead_letter: over max_record_bytes or refused by the broker).',
      labelNames: ['action'] as const,
      registers: [registry],
    }),
    exportLag: new FastHistogram({
      name: 'lightning_sidecar_export_lag_seconds',
      help: 'Seconds from the end of a captured call to the exporter acknowledging its transition.',
      buckets: [0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600],
      registers: [registry],
    }),
  };
}

/** The model server: its flavor, fields it refused, and translated calls. */
function upstreamMetrics(registry: Registry) {
  /** Run when the per-replica series are read: routing keeps plain counts on the call path and publishes them here. */
  const upstreamCollectors = new Set<() => void>();
  const collectUpstream = (): void => {
    for (const f of upstreamCollectors) f();
  };
  return {
    upstreamCollectors,
    upstreamFlavor: new Gauge({
      name: 'lightning_sidecar_upstream_flavor',
      help: 'What the model server is taken to be (1 on the current series): flavor, how it was decided (config, detected, unknown), and whether fields for token ids are added.',
      labelNames: ['flavor', 'source', 'adding_fields'] as const,
      registers: [registry],
    }),
    injectionRefused: new FastCounter({
      name: 'lightning_sidecar_injection_refused_total',
      help: 'Calls the model server refused because of a field the sidecar added (each is sent again without it).',
      labelNames: ['field'] as const,
      registers: [registry],
    }),
    translatedCalls: new FastCounter({
      name: 'lightning_sidecar_translated_calls_total',
      help: 'Responses API and Anthropic Messages calls: translated to chat completions for token ids, or passed through (reason).',
      labelNames: ['api', 'result'] as const,
      registers: [registry],
    }),
    upstreamCalls: new FastCounter({
      name: 'lightning_sidecar_upstream_replica_calls_total',
      help: 'Requests sent to each model-server replica (address:port), a call moved to another replica counted on both.',
      labelNames: ['replica'] as const,
      registers: [registry],
      collect: collectUpstream,
    }),
    upstreamInFlight: new Gauge({
      name: 'lightning_sidecar_upstream_replica_in_flight',
      help: 'Requests in flight through this sidecar to each model-server replica.',
      labelNames: ['replica'] as const,
      registers: [registry],
      collect: collectUpstream,
    }),
    upstreamUp: new Gauge({
      name: 'lightning_sidecar_upstream_replica_up',
      help: 'Whether each model-server replica is taken to be up (1) or down after refusing or dropping a call (0, probed until it answers).',
      labelNames: ['replica'] as const,
      registers: [registry],
    }),
    upstreamPlacements: new Gauge({
      name: 'lightning_sidecar_upstream_placements',
      help: 'Rollouts whose calls are kept on one replica (sticky routing), at most receivers.llm_proxy.routing.max_placements.',
      registers: [registry],
    }),
    upstreamPlacementsMade: new FastCounter({
      name: 'lightning_sidecar_upstream_placements_total',
      help: 'Rollouts placed on a replica by their first call (sticky routing).',
      registers: [registry],
    }),
    upstreamMoves: new FastCounter({
      name: 'lightning_sidecar_upstream_placement_moves_total',
      help: 'Rollouts moved to another replica: replica_down, overloaded, replica_removed (gone from DNS or the configuration).',
      labelNames: ['reason'] as const,
      registers: [registry],
    }),
    tokenInRendering: new FastCounter({
      name: 'lightning_sidecar_token_in_rendering_total',
      help: "Token-in calls by who rendered the conversation into ids: the sidecar from the model's tokenizer files (token_in.tokenizer_dir), or the model server (/tokenize).",
      labelNames: ['by'] as const,
      registers: [registry],
    }),
    tokenInRenderChecks: new FastCounter({
      name: 'lightning_sidecar_token_in_render_checks_total',
      help: "The sidecar's own rendering compared with the model server's (every call that does not continue its rollout, and token_in.verify_fraction of those that do): match, or mismatch (that model is then rendered by the server).",
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    tokenInResumes: new FastCounter({
      name: 'lightning_sidecar_token_in_resumes_total',
      help: 'Token-in calls the model server aborted mid-answer (a weight update, a pause): resumed (sent again with the ids sampled so far), limit (token_in.max_resumes reached: the call ended as the engine ended it), or failed (could not be sent again: budget spent, no token ids, the server refused).',
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    tokenInCalls: new FastCounter({
      name: 'lightning_sidecar_token_in_calls_total',
      help: "Chat calls under token-in: spliced (continuing the previous call's ids), rendered afresh, or gone through as chat (fallback); with the reason.",
      labelNames: ['result', 'reason'] as const,
      registers: [registry],
    }),
  };
}

/** The Kafka exporter's connection. */
function kafkaMetrics(registry: Registry) {
  return {
    kafkaConnected: new Gauge({
      name: 'lightning_sidecar_kafka_connected',
      help: '1 when the Kafka producer is connected, 0 otherwise (only with the Kafka exporter).',
      registers: [registry],
    }),
  };
}

/** The journal on disk: size, segments, what start-up recovered and what was quarantined. */
function journalMetrics(registry: Registry) {
  return {
    journalBytes: new Gauge({
      name: 'lightning_sidecar_journal_bytes',
      help: 'Bytes in journal segments on disk (and queued for writing).',
      registers: [registry],
    }),
    journalHighWatermark: new Gauge({
      name: 'lightning_sidecar_journal_high_watermark_bytes',
      help: 'Journal size above which new captures are dropped, OTLP and rollout intake refused (503) and /readyz fails: journal max_bytes times high_watermark.',
      registers: [registry],
    }),
    journalSegments: new Gauge({
      name: 'lightning_sidecar_journal_segments',
      help: 'Journal segment files on disk.',
      registers: [registry],
    }),
    journalRecovered: new FastCounter({
      name: 'lightning_sidecar_journal_recovered_total',
      help: 'Found in the journal at start-up, by kind: unreadable regions set aside (torn_tail, corrupt_tail, corrupt_segment) and calls without an end (cut by a stop, or their end refused by a full journal), recorded as aborted (unended_call).',
      labelNames: ['kind'] as const,
      registers: [registry],
    }),
    journalQuarantined: new FastCounter({
      name: 'lightning_sidecar_journal_quarantined_total',
      help: 'Journal records that could not be processed, written to {data_dir}/quarantine/ and skipped.',
      registers: [registry],
    }),
  };
}

/** Rollouts and episodes: the rollout API, rewards, late records, open episodes and the export backlog. */
function episodeMetrics(registry: Registry) {
  return {
    rolloutApi: new FastCounter({
      name: 'lightning_sidecar_rollout_api_requests_total',
      help: 'Rollout API requests by route and outcome.',
      labelNames: ['route', 'outcome'] as const,
      registers: [registry],
    }),
    rewards: new FastCounter({
      name: 'lightning_sidecar_rewards_total',
      help: 'Rewards and ends by source and outcome: applied to an open episode, or rejected (episode_closed, unknown_rollout).',
      labelNames: ['source', 'kind', 'outcome'] as const,
      registers: [registry],
    }),
    lateRecords: new FastCounter({
      name: 'lightning_sidecar_late_records_total',
      help: 'Calls and spans that came after their episode closed, by what happened to them.',
      labelNames: ['kind', 'outcome'] as const,
      registers: [registry],
    }),
    openEpisodes: new Gauge({
      name: 'lightning_sidecar_open_episodes',
      help: 'Episodes open in the assembler.',
      registers: [registry],
    }),
    exportBacklog: new Gauge({
      name: 'lightning_sidecar_export_backlog_records',
      help: 'Records (calls, spans, rewards) that closed episodes waiting for the exporter hold, in memory or on disk; intake is refused at service.max_export_backlog.',
      registers: [registry],
    }),
    exportBacklogSpilled: new Gauge({
      name: 'lightning_sidecar_export_backlog_spilled_records',
      help: 'Of the records closed episodes waiting for the exporter hold, those waiting on disk (past service.export_backlog_memory_records in memory, or encoded ahead while the exporter is away).',
      registers: [registry],
    }),
    exportBacklogEncodedBytes: new Gauge({
      name: 'lightning_sidecar_export_backlog_encoded_bytes',
      help: 'Bytes of records encoded ahead for an exporter that is away, waiting on disk to be sent (up to service.export_backlog_encoded_bytes).',
      registers: [registry],
    }),
    episodesClosed: new FastCounter({
      name: 'lightning_sidecar_episodes_closed_total',
      help: 'Episodes closed, by status.',
      labelNames: ['status'] as const,
      registers: [registry],
    }),
  };
}

/** What was exported: transitions, trajectories (their segments, calls and tokens) and export errors. */
function exportMetrics(registry: Registry) {
  return {
    transitionsExported: new FastCounter({
      name: 'lightning_sidecar_transitions_exported_total',
      help: 'Transitions handed to the exporter and acknowledged by it.',
      labelNames: ['exporter'] as const,
      registers: [registry],
    }),
    trajectoriesExported: new FastCounter({
      name: 'lightning_sidecar_trajectories_exported_total',
      help: 'Trajectories handed to the exporter and acknowledged by it.',
      labelNames: ['exporter'] as const,
      registers: [registry],
    }),
    trajectorySegments: new FastHistogram({
      name: 'lightning_sidecar_trajectory_segments',
      help: 'Trajectory segments per closed rollout attempt (1 when every call continued the one before; 0 when no call had token ids).',
      buckets: [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64],
      registers: [registry],
    }),
    trajectoryCalls: new FastCounter({
      name: 'lightning_sidecar_trajectory_calls_total',
      help: 'Calls (and choices) by what became of them in trajectories: merged into a segment, started a new one, or left out; by reason.',
      labelNames: ['outcome', 'reason'] as const,
      registers: [registry],
    }),
    trajectoryTokens: new FastHistogram({
      name: 'lightning_sidecar_trajectory_tokens',
      help: 'Token ids per trajectory (its final context).',
      buckets: [256, 1024, 4096, 16384, 32768, 65536, 131072, 262144, 524288, 1048576],
      registers: [registry],
    }),
    samplingPinned: new FastCounter({
      name: 'lightning_sidecar_sampling_pinned_total',
      help: 'Pinned sampling parameters (processors.sampling.pin) by parameter and what was done: set (the call left it out), overridden (force), refused (refuse).',
      labelNames: ['param', 'action'] as const,
      registers: [registry],
    }),
    trajectoryRouting: new FastCounter({
      name: 'lightning_sidecar_trajectory_routing_total',
      help: 'Trajectories with routed experts (MoE routing replay), by whether every row is there and aligned (complete) or not.',
      labelNames: ['complete'] as const,
      registers: [registry],
    }),
    trajectoryImages: new FastCounter({
      name: 'lightning_sidecar_trajectory_images_total',
      help: 'Trajectories with images, by outcome: complete (every image stored and paired with its placeholder run), or why not (placeholders_do_not_pair, placeholder_length, url_not_stored, unreadable_image, unreadable_request, no_prompt_ids, store_failed); such a trajectory is exported with images_complete false.',
      labelNames: ['outcome'] as const,
      registers: [registry],
    }),
    imagesStored: new FastCounter({
      name: 'lightning_sidecar_images_stored_total',
      help: 'Images of trajectories put in the content-addressed image store: written, already_stored (the same bytes came before), or failed.',
      labelNames: ['result'] as const,
      registers: [registry],
    }),
    trajectorySamplingMask: new FastCounter({
      name: 'lightning_sidecar_trajectory_sampling_mask_total',
      help: 'Trajectories with sampling masks (or asked to have them), by whether every sampled position has its row and every sampled id is in it (complete) or not.',
      labelNames: ['complete'] as const,
      registers: [registry],
    }),
    samplingMaskViolations: new FastCounter({
      name: 'lightning_sidecar_sampling_mask_violations_total',
      help: 'Sampled token ids that are not among the ids their sampling mask says were kept (a sampler or capture fault).',
      registers: [registry],
    }),
    exportErrors: new FastCounter({
      name: 'lightning_sidecar_export_errors_total',
      help: 'Export attempts that failed, by exporter and kind (retryable, permanent).',
      labelNames: ['exporter', 'kind'] as const,
      registers: [registry],
    }),
  };
}

/** Trainer control: pauses, held calls and control messages. */
function controlMetrics(registry: Registry) {
  return {
    paused: new Gauge({
      name: 'lightning_sidecar_paused',
      help: '1 while the trainer has paused new model calls (weight sync), 0 otherwise.',
      registers: [registry],
    }),
    pausedSeconds: new FastCounter({
      name: 'lightning_sidecar_paused_seconds_total',
      help: 'Seconds spent paused, counted at each resume.',
      registers: [registry],
    }),
    heldNow: new Gauge({
      name: 'lightning_sidecar_held_calls',
      help: 'Model calls held right now because of a pause.',
      registers: [registry],
    }),
    heldCalls: new FastCounter({
      name: 'lightning_sidecar_held_calls_total',
      help: 'Model calls held by a pause, by how the hold ended (released, timed_out, rejected, shutdown, abandoned: the client went away).',
      labelNames: ['outcome'] as const,
      registers: [registry],
    }),
    controlMessages: new FastCounter({
      name: 'lightning_sidecar_control_messages_total',
      help: 'Control messages by source (kafka, http) and outcome (applied, invalid).',
      labelNames: ['source', 'outcome'] as const,
      registers: [registry],
    }),
  };
}
