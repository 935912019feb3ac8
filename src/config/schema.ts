import { z } from 'zod';
import { QWEN_VL_IMAGE_TOKEN_ID } from '../model/records';

/** `host:port`, the form every listener address takes (port 0 = any free port). */
export const address = z.string().superRefine((v, ctx) => {
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(v);
  if (!m) ctx.addIssue({ code: 'custom', message: 'must be host:port, e.g. 127.0.0.1:4000' });
  else if (Number(m[2]) > 65535) ctx.addIssue({ code: 'custom', message: 'port must be 0-65535' });
});

const positiveInt = z.number().int().positive();
const MiB = 1024 * 1024;

/** Headers that never reach a record or a log line. Lower-case. */
export const DEFAULT_SECRET_HEADERS = [
  'authorization',
  'proxy-authorization',
  'x-api-key',
  'api-key',
  'cookie',
  'set-cookie',
  'openai-organization',
  'openai-project',
];

/** Token-in's output parsers by vLLM's names (each a module in src/receivers/llm-proxy/token-in/). */
export const TOOL_CALL_PARSERS = ['hermes', 'qwen3_coder', 'deepseek_v3', 'deepseek_v31', 'openai'] as const;
export const REASONING_PARSERS = ['qwen3', 'deepseek_r1', 'openai_gptoss'] as const;

/** The replica URLs of a validated `upstream_url` (kept as one comma-separated string). */
export function upstreamUrls(upstreamUrl: string): string[] {
  return upstreamUrl.split(',');
}

/** A URL as an error message may show it: without credentials. */
function shown(u: string): string {
  return u.replace(/\/\/[^/@]*@/, '//***@');
}

/**
 * The model server: one URL, several (a list, or comma-separated), each a replica or a host name
 * whose addresses are replicas (docs/routing.md). Kept as one comma-separated string.
 */
const upstreamUrl = z
  .union([z.string(), z.array(z.string()).min(1, 'must name at least one URL')])
  .transform((v) => (Array.isArray(v) ? v : v.split(',')).map((u) => u.trim()).filter((u) => u.length > 0))
  .superRefine((urls, ctx) => {
    if (urls.length === 0) ctx.addIssue({ code: 'custom', message: 'must name at least one URL' });
    let path: string | null = null;
    for (const u of urls) {
      let url: URL;
      try {
        url = new URL(u);
      } catch {
        ctx.addIssue({ code: 'custom', message: `'${shown(u)}' must be an absolute http(s) URL` });
        continue;
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') ctx.addIssue({ code: 'custom', message: `'${shown(u)}' must start with http:// or https://` });
      const p = url.pathname.replace(/\/+$/, '');
      if (path !== null && p !== path) ctx.addIssue({ code: 'custom', message: `every replica URL must have the same path ('${path}' and '${p}')` });
      path ??= p;
    }
  })
  .transform((urls) => urls.join(','));

/** How calls are spread over the model-server replicas (docs/routing.md). */
export const routingSchema = z
  .object({
    /** `sticky`: a rollout stays on the replica its first call went to (least loaded); `round_robin`, `random`: per call. */
    policy: z.enum(['sticky', 'round_robin', 'random']).default('sticky'),
    /** A sticky replica is overloaded, and its rollout moves, at this many times the replicas' mean load… */
    overload_factor: z.number().gt(1).default(2),
    /** …and at least this load (calls in flight, or the server's running + waiting requests). */
    overload_min_load: positiveInt.default(8),
    /** Rollouts whose replica is remembered (least recently used forgotten first). */
    max_placements: positiveInt.default(100_000),
    /**
     * Host names resolved to every address, each a replica: `auto` for http:// names (in-cluster
     * servers; a headless Service), not https:// ones or localhost; `always`; `never` (connect by name).
     */
    resolve_names: z.enum(['auto', 'always', 'never']).default('auto'),
    /** Host names are resolved again this often (ms; 0 = only at start). */
    dns_refresh_ms: z.number().int().nonnegative().default(5_000),
    /** A replica marked down is probed (GET /health) this often. */
    probe_interval_ms: positiveInt.default(1_000),
    /** With several replicas, each one's /metrics is read this often for its load (0 = never). */
    scrape_interval_ms: z.number().int().nonnegative().default(5_000),
    /** Request bodies up to this size are kept until the answer begins, so a failed replica's call can go to another. */
    failover_body_bytes: positiveInt.default(8 * MiB),
  })
  .strict();

export const llmProxySchema = z
  .object({
    endpoint: address.default('127.0.0.1:4000'),
    upstream_url: upstreamUrl.default('http://127.0.0.1:8000/v1'),
    routing: routingSchema.prefault({}),
    /** `auto` identifies vLLM / SGLang by their own endpoints; `openai` never adds fields; `vllm` / `sglang` force it. */
    upstream_flavor: z.enum(['auto', 'openai', 'vllm', 'sglang']).default('auto'),
    /**
     * `auto`: while no upstream URL has answered the identification yet (just started, or every
     * replica down), a call waits up to this long for it, so that it is asked for token ids (0: never waits).
     */
    identify_wait_ms: z.number().int().nonnegative().default(5_000),
    /** APIs translated to chat completions (for token ids) when the model server is vLLM or SGLang. */
    translate: z.array(z.enum(['responses', 'anthropic.messages'])).default(['responses', 'anthropic.messages']),
    /** Strip the fields the sidecar asked for (token ids, logprobs) from what the agent receives, unless it asked itself. */
    strip_injected: z.boolean().default(true),
    /** Socket idle time towards the upstream (waiting for headers or between body bytes). */
    upstream_timeout_ms: positiveInt.default(600_000),
    /** A client must send its request headers within this time (slowloris). */
    client_header_timeout_ms: positiveInt.default(30_000),
    /** A request body that stops arriving for this long is abandoned (408). */
    client_body_idle_timeout_ms: positiveInt.default(30_000),
    max_request_bytes: positiveInt.default(64 * MiB),
    max_capture_bytes: positiveInt.default(32 * MiB),
    secret_headers: z.array(z.string().min(1).toLowerCase()).default(DEFAULT_SECRET_HEADERS),
    /**
     * Token-in (docs/token-in.md): chat calls of a rollout go to a vLLM server's `/v1/completions`
     * as token ids that continue what the model sampled, and the answer is parsed back into chat.
     */
    token_in: z
      .object({
        enabled: z.boolean().default(false),
        /** vLLM's `--tool-call-parser` name for the served model. */
        tool_call_parser: z.enum(TOOL_CALL_PARSERS).default('hermes'),
        /** vLLM's `--reasoning-parser` name for the served model. */
        reasoning_parser: z.enum(REASONING_PARSERS).default('qwen3'),
        /** Rollout attempts whose last call is remembered (least recently used go first). */
        max_rollouts: positiveInt.default(10_000),
        /** Token ids held for them in all (4 bytes each). */
        max_held_tokens: positiveInt.default(16_000_000),
        /**
         * The model's tokenizer files (`tokenizer.json`, `tokenizer_config.json`): the sidecar renders
         * and tokenizes what the agent appended itself instead of asking `/tokenize` on every call.
         */
        tokenizer_dir: z.string().min(1).optional(),
        /**
         * With `tokenizer_dir`: share of the calls that continue their rollout also rendered by the
         * server and compared (a call that does not, such as a rollout's first, always is); a mismatch
         * makes that model fall back to the server's rendering.
         */
        verify_fraction: z.number().min(0).max(1).default(0.05),
        /**
         * Where token-in calls go: vLLM's token-in route `/inference/v1/generate` (sampling masks
         * and weight-version spans come only there), `/v1/completions`, or `auto`: the route when
         * the server answers it with text (asked once), else completions.
         */
        route: z.enum(['auto', 'generate', 'completions']).default('auto'),
        /**
         * A call the engine aborts mid-answer (a weight update, a pause) is sent again with the ids
         * sampled so far and the rest of its token budget, up to this many times; 0: the abort
         * reaches the agent as the engine ended it.
         */
        max_resumes: z.number().int().min(0).max(100).default(3),
      })
      .strict()
      .prefault({}),
  })
  .strict();

export const otlpSchema = z
  .object({
    protocols: z
      .object({
        grpc: z
          .object({ endpoint: address.default('127.0.0.1:4317'), enabled: z.boolean().default(true) })
          .strict()
          .default({ endpoint: '127.0.0.1:4317', enabled: true }),
        http: z
          .object({ endpoint: address.default('127.0.0.1:4318'), enabled: z.boolean().default(true) })
          .strict()
          .default({ endpoint: '127.0.0.1:4318', enabled: true }),
      })
      .strict()
      .prefault({}),
    max_request_bytes: positiveInt.default(64 * MiB),
  })
  .strict();

export const rolloutApiSchema = z
  .object({
    enabled: z.boolean().default(true),
    max_body_bytes: positiveInt.default(1 * MiB),
  })
  .strict();

export const episodesSchema = z
  .object({
    idle_timeout_ms: positiveInt.default(120_000),
    tool_span_wait_ms: z.number().int().nonnegative().default(5_000),
    max_open_episodes: positiveInt.default(10_000),
    /** Closed episodes remembered to answer a reward, end or span that comes after the close. */
    closed_window: positiveInt.default(50_000),
    tick_interval_ms: positiveInt.default(250),
  })
  .strict();

export const creditSchema = z
  .object({
    mode: z.enum(['identical', 'last', 'discounted']).default('identical'),
    gamma: z.number().gt(0).lte(1).default(0.99),
  })
  .strict();

/** `attr op value`, e.g. `http.response.status_code >= 500`, `process.exit.code != 0`, `exists error.type`. */
export const predicateSchema = z.string().transform((text, ctx) => {
  const p = parsePredicate(text);
  if (!p) {
    ctx.addIssue({
      code: 'custom',
      message: `cannot parse '${text}': use 'attribute op value' with op one of == != > >= < <= ~= (regex), or 'exists attribute'`,
    });
    return z.NEVER;
  }
  return p;
});

export type Predicate = { attribute: string; op: '==' | '!=' | '>' | '>=' | '<' | '<=' | '~=' | 'exists'; value: string | number | boolean | null };

export function parsePredicate(text: string): Predicate | null {
  const exists = /^\s*exists\s+(\S+)\s*$/.exec(text);
  if (exists) return { attribute: exists[1], op: 'exists', value: null };
  const m = /^\s*([^\s=!<>~]+)\s*(==|!=|>=|<=|~=|>|<)\s*(.+?)\s*$/.exec(text);
  if (!m) return null;
  const raw = m[3];
  let value: string | number | boolean;
  if (/^-?\d+(\.\d+)?$/.test(raw)) value = Number(raw);
  else if (raw === 'true' || raw === 'false') value = raw === 'true';
  else if (/^(['"]).*\1$/.test(raw)) value = raw.slice(1, -1);
  else value = raw;
  if (m[2] === '~=') {
    try {
      new RegExp(String(value));
    } catch {
      return null;
    }
  }
  return { attribute: m[1], op: m[2] as Predicate['op'], value };
}

export const airRuleSchema = z
  .object({
    /** Glob on the tool name (`*` any run, `?` one char). */
    tool: z.string().min(1).optional(),
    outcome: z.enum(['ok', 'error', 'missing']).optional(),
    /** All must hold (on the tool span's attributes). */
    where: z.array(predicateSchema).default([]),
    reward: z.number().finite(),
  })
  .strict();

export const DEFAULT_AIR_RULES = [
  { outcome: 'error' as const, where: [], reward: -0.5 },
  { outcome: 'missing' as const, where: [], reward: -0.25 },
  { outcome: 'ok' as const, where: [], reward: 0.1 },
];

export const airSchema = z
  .object({
    enabled: z.boolean().default(true),
    /** `reward = credit(final) + weight × intermediate`. */
    weight: z.number().finite().nonnegative().default(1),
    rules: z.array(airRuleSchema).default(DEFAULT_AIR_RULES),
  })
  .strict();

export const captureSchema = z
  .object({
    /** Agent-name globs whose calls become transitions (empty = all). */
    include_agents: z.array(z.string().min(1)).default([]),
    /** Agent-name globs whose calls are not emitted (they still count as episode activity). */
    exclude_agents: z.array(z.string().min(1)).default([]),
    /**
     * Request-body fields replaced by "[REDACTED]" before a call is journaled: dotted paths from the
     * body root, `*` for any one key or array index, a leading `**.` for any depth (e.g. `user`,
     * `metadata.email`, `messages.*.name`, `**.ssn`).
     */
    redact_request_fields: z.array(z.string().regex(/^(\*\*\.)?[^.\s]+(\.[^.\s]+)*$/, 'must be a dotted path such as metadata.email')).default([]),
  })
  .strict();

export const policySchema = z
  .object({
    /** A static policy version for every call, until the control channel names one. */
    version: z
      .string()
      .regex(/^[A-Za-z0-9._:+-]{1,64}$/, 'must be 1-64 characters of [A-Za-z0-9._:+-]')
      .optional(),
    /** An upstream response header naming the policy that answered (wins over the other sources). */
    response_header: z
      .string()
      .regex(/^[A-Za-z0-9-]+$/, 'must be a header name')
      .toLowerCase()
      .optional(),
  })
  .strict();

/**
 * Images in calls (docs/images.md): which token is the image placeholder the server expands, and
 * optionally the Qwen-VL resize settings the server's processor uses, to check each image's run.
 */
export const imagesSchema = z
  .object({
    /** `<|image_pad|>`: 151655 on Qwen2-VL, Qwen2.5-VL and Qwen3-VL; 248056 on Qwen3.5 (read `image_token_id` in the model's config.json). */
    image_token_id: z.number().int().min(0).default(QWEN_VL_IMAGE_TOKEN_ID),
    /** The processor's `smart_resize` settings: factor 28 (Qwen2.5-VL) or 32 (Qwen3-VL), and its pixel limits. */
    processor: z.object({ factor: positiveInt, min_pixels: positiveInt, max_pixels: positiveInt }).strict().optional(),
  })
  .strict();

/**
 * MoE routing replay (docs/output-contract.md#routed-experts). vLLM returns routing on every answer
 * when started with `--enable-return-routed-experts`; SGLang only when asked, as raw int32 whose
 * shape is the model's: naming its layers and top-k makes the sidecar ask an SGLang server for it.
 */
export const routedExpertsSchema = z
  .object({
    sglang: z
      .object({
        /** Rows of the routing per token: the model's `num_hidden_layers` (SGLang reports every layer). */
        layers: positiveInt,
        /** Experts per token and layer: the model's `num_experts_per_tok`. */
        top_k: positiveInt,
      })
      .strict()
      .optional(),
  })
  .strict();

/** The sampling parameters a record names. */
const samplingParam = z.enum(['temperature', 'top_p', 'top_k', 'min_p', 'seed', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'max_tokens']);

/** Sampling provenance (docs/output-contract.md#sampling-parameters): off, records are as they were. */
export const samplingSchema = z
  .object({
    /** Each transition and trajectory turn records the sampling parameters the model server was asked for. */
    record: z.boolean().default(false),
    /**
     * Training values: a chat or completions call that leaves one out gets it; one that sets another
     * is overridden (`force`) or refused with a 400 (`refuse`).
     */
    pin: z.partialRecord(samplingParam, z.object({ value: z.number().finite(), mode: z.enum(['force', 'refuse']).default('force') }).strict()).default({}),
    /**
     * The model server's defaults for parameters a request leaves out (vLLM applies the model's
     * `generation_config.json` with `--generation-config auto`, its default; SGLang likewise), so
     * the recorded parameters are the ones used; each recorded value taken from here is listed in
     * the record's `server_defaults`. The sidecar cannot read them from the server.
     */
    server_defaults: z.partialRecord(samplingParam, z.number().finite()).optional(),
    /**
     * Ask the model server for sampling masks where it gives them (SGLang: non-streamed chat) and
     * record them on trajectories; every trajectory then says whether they came.
     */
    masks: z.boolean().default(false),
    /**
     * Which distribution the server's logprobs are over, recorded on every trajectory: vLLM's
     * `--logprobs-mode` (its default is `raw_logprobs`, before top-k/top-p). The sidecar cannot
     * read it from the server.
     */
    logprobs_mode: z.enum(['raw_logprobs', 'processed_logprobs', 'raw_logits', 'processed_logits']).optional(),
  })
  .strict();

export const spansSchema = z
  .object({
    /** A tool or reward span whose rollout is not known yet waits this long for a call of its trace. */
    unattributed_wait_ms: positiveInt.default(30_000),
    max_pending_spans: positiveInt.default(10_000),
    /** Tool arguments/results kept per span, in characters. */
    max_payload_chars: positiveInt.default(4096),
  })
  .strict();

export const fileExporterSchema = z
  .object({
    /** Defaults to `{service.data_dir}`. */
    dir: z.string().min(1).optional(),
    max_file_bytes: positiveInt.default(64 * MiB),
    /** `delta`: a transition that continues the previous call carries only its new prompt ids (docs/output-contract.md). */
    prompt_ids: z.enum(['full', 'delta']).default('full'),
  })
  .strict();

/** Where the Kafka exporter's brokers are set, for the errors about them. */
export const BROKERS_SETTING = 'exporters.kafka.brokers, or LIGHTNING_KAFKA_BROKERS=host:port,host:port';

export const kafkaExporterSchema = z
  .object({
    brokers: z.array(z.string().regex(/^[^\s,]+:\d{1,5}$/, `must be host:port, e.g. kafka-0:9092 (${BROKERS_SETTING})`)).default([]),
    topic: z.string().min(1).default('lightning.transitions'),
    episodes_topic: z.string().min(1).default('lightning.episodes'),
    trajectories_topic: z.string().min(1).default('lightning.trajectories'),
    /** Images of trajectories, one record each, keyed by their SHA-256 (docs/images.md); sent before the trajectories that name them. */
    images_topic: z.string().min(1).default('lightning.images'),
    client_id: z.string().min(1).default('lightning-sidecar'),
    encoding: z.enum(['json', 'protobuf']).default('json'),
    /** gzip is built into kafkajs; other codecs need extra packages and are not offered. */
    compression: z.enum(['gzip', 'none']).default('gzip'),
    /** A record above this is sent as ordered chunks (docs/kafka-records.md); keep it at or below the broker's message.max.bytes. */
    max_message_bytes: positiveInt.default(1_000_000),
    /** A record above this is not sent: it goes to dead-letter/ (counted). */
    max_record_bytes: positiveInt.default(64 * MiB),
    /** `delta`: a transition that continues the previous call carries only its new prompt ids (docs/kafka-records.md). */
    prompt_ids: z.enum(['full', 'delta']).default('full'),
    /** Records per produce request, by encoded bytes. */
    max_batch_bytes: positiveInt.default(900_000),
    connection_timeout_ms: positiveInt.default(3_000),
    request_timeout_ms: positiveInt.default(30_000),
    sasl: z
      .object({
        mechanism: z.enum(['plain', 'scram-sha-256', 'scram-sha-512']).default('plain'),
        username: z.string().min(1),
        password: z.string().min(1),
      })
      .strict()
      .optional(),
    tls: z
      .object({
        enabled: z.boolean().default(true),
        ca_file: z.string().min(1).optional(),
        cert_file: z.string().min(1).optional(),
        key_file: z.string().min(1).optional(),
        insecure_skip_verify: z.boolean().default(false),
      })
      .strict()
      .optional(),
  })
  .strict();

export const configSchema = z
  .object({
    receivers: z
      .object({
        llm_proxy: llmProxySchema.prefault({}),
        otlp: otlpSchema.prefault({}),
        rollout_api: rolloutApiSchema.prefault({}),
      })
      .strict()
      .prefault({}),
    processors: z
      .object({
        episodes: episodesSchema.prefault({}),
        credit: creditSchema.prefault({}),
        air: airSchema.prefault({}),
        capture: captureSchema.prefault({}),
        spans: spansSchema.prefault({}),
        policy: policySchema.prefault({}),
        routed_experts: routedExpertsSchema.prefault({}),
        sampling: samplingSchema.prefault({}),
        images: imagesSchema.prefault({}),
      })
      .strict()
      .prefault({}),
    exporters: z
      .object({
        /**
         * What is exported per closed attempt: its trajectories (one per continuous token segment,
         * what a trainer trains on), its transitions (one per call and choice, with bodies), or both
         * (docs/output-contract.md).
         */
        records: z.enum(['trajectories', 'transitions', 'both']).default('trajectories'),
        file: fileExporterSchema.prefault({}),
        kafka: kafkaExporterSchema.prefault({}),
      })
      .strict()
      .prefault({}),
    service: z
      .object({
        exporter: z.enum(['file', 'kafka']).default('file'),
        data_dir: z.string().min(1).default('./data'),
        log_level: z.enum(['debug', 'info', 'warn', 'error']).default('info'),
        telemetry: z
          .object({ endpoint: address.default('0.0.0.0:9464') })
          .strict()
          .prefault({}),
        /**
         * Optional token for the rollout API, the OTLP receivers and the control route
         * (`Authorization: Bearer <token>`), for sidecars whose listeners are reachable beyond the pod.
         */
        api_token: z.string().min(16, 'must be at least 16 characters').optional(),
        /**
         * The viewer on the telemetry port (`/ui`): open and recently closed episodes, one
         * trajectory's tokens, a GRPO group. Closed episodes are kept, up to `max_bytes`, only while
         * a page has asked within `idle_ms`.
         */
        ui: z
          .object({
            enabled: z.boolean().default(true),
            max_bytes: positiveInt.default(16 * MiB),
            idle_ms: positiveInt.default(600_000),
          })
          .strict()
          .prefault({}),
        shutdown_timeout_ms: positiveInt.default(25_000),
        /** The trainer's control channel (policy versions, pause/resume). */
        control: z
          .object({
            /** Consumed from its end by every sidecar when the exporter is Kafka (same brokers). */
            topic: z.string().min(1).default('lightning.control'),
            kafka: z.boolean().default(true),
            /** While paused: calls held at once, and for how long, before they get 429. */
            max_held_calls: positiveInt.default(256),
            max_hold_ms: positiveInt.default(30_000),
          })
          .strict()
          .prefault({}),
        /** On SIGTERM, close open episodes and export them (a pod going away takes its emptyDir with it). */
        drain_on_shutdown: z.boolean().default(true),
        /**
         * Records (calls, tool spans, rewards) closed episodes waiting for the exporter may hold, in
         * memory or on disk (see export_backlog_memory_records). Above it new captures and spans are
         * refused as when the journal is full. An episode waiting on disk keeps a small entry in memory.
         */
        max_export_backlog: positiveInt.default(1_000_000),
        /**
         * Records closed episodes waiting for the exporter keep in memory; beyond it they wait on disk
         * (`{data_dir}/spill`, a copy of what the journal holds) and are read back when exported.
         */
        export_backlog_memory_records: positiveInt.default(4_000),
        /**
         * Bytes of records encoded ahead for an exporter that is away (Kafka): while it is, closed
         * episodes are encoded as they will be sent and wait in `{data_dir}/spill`, so the drain
         * afterwards only sends bytes. Past this, they wait as facts and are encoded when sent.
         */
        export_backlog_encoded_bytes: positiveInt.default(256 * MiB),
        /**
         * Room for the heap's old generation to grow past what the last full collection left live
         * before the next one starts (MiB); 0 leaves it to V8 (see src/service/heap.ts).
         */
        heap_headroom_mib: z.number().int().min(0).max(1024).default(32),
        journal: z
          .object({
            /** `always` (fsync before acknowledging), `never` (the OS decides), or an interval in ms. */
            fsync: z.union([z.enum(['always', 'never']), positiveInt]).default(1000),
            max_bytes: positiveInt.default(1024 * MiB),
            segment_bytes: positiveInt.default(64 * MiB),
            /** Share of max_bytes above which intake is refused (503) and /readyz fails. */
            high_watermark: z.number().gt(0).lte(1).default(0.9),
          })
          .strict()
          .prefault({}),
      })
      .strict()
      .prefault({}),
  })
  .strict()
  .superRefine((cfg, ctx) => {
    if (cfg.service.exporter === 'kafka' && cfg.exporters.kafka.brokers.length === 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['exporters', 'kafka', 'brokers'],
        message: `at least one broker is required when service.exporter is kafka: set ${BROKERS_SETTING}`,
      });
    }
  });

export type Config = z.infer<typeof configSchema>;
export type LlmProxyConfig = z.infer<typeof llmProxySchema>;
export type RoutingConfig = z.infer<typeof routingSchema>;
export type EpisodesConfig = z.infer<typeof episodesSchema>;
export type CreditConfig = z.infer<typeof creditSchema>;
export type AirConfig = z.infer<typeof airSchema>;
export type AirRule = z.infer<typeof airRuleSchema>;
export type CaptureConfig = z.infer<typeof captureSchema>;
export type RoutedExpertsConfig = z.infer<typeof routedExpertsSchema>;
export type ImagesConfig = z.infer<typeof imagesSchema>;
export type SamplingConfig = z.infer<typeof samplingSchema>;
export type KafkaExporterConfig = z.infer<typeof kafkaExporterSchema>;
