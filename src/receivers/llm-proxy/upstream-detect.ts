import http from 'node:http';
import https from 'node:https';

export type UpstreamFlavor = 'vllm' | 'sglang' | 'openai' | 'unknown';

/**
 * What the upstream is, from its own answers:
 * - `vllm`: `GET {base}/models` lists a model with `owned_by: "vllm"` (vLLM's model card default),
 *   or the listing needs a key (vLLM's `--api-key` guards only `/v1`) while `GET {root}/version`
 *   answers `{"version": …}`;
 * - `sglang`: a model with `owned_by: "sglang"` (SGLang's model card default), or
 *   `GET {root}/server_info` (older releases: `/get_server_info`) answers SGLang's server
 *   arguments with a `version`;
 * - `openai`: the listing answered with models, none owned by vllm or sglang: an
 *   OpenAI-compatible server that is neither (OpenAI itself answers `system`, `openai` or an
 *   organisation), so nothing may be injected;
 * - `unknown`: no usable answer (network error, timeout, 404, not JSON): detect again later.
 * `root` is the base URL without its trailing `/v1`. `evidence` says what was seen, for logs
 * and readiness details.
 */
export interface UpstreamDetection {
  flavor: UpstreamFlavor;
  evidence: string;
  serverVersion: string | null;
  /** False when no usable HTTP answer came (none at all, or a 5xx): the server is down or starting, not known to be another kind. */
  answered?: boolean;
}

export interface ProbeResult {
  /** 0 when no HTTP answer came (then `error` says why). */
  status: number;
  body: string;
  error?: string;
}

/** One GET; must not throw. */
export type ProbeFetch = (url: string, options: { timeoutMs: number; headers: Record<string, string>; maxBodyBytes: number }) => Promise<ProbeResult>;

export interface DetectOptions {
  /** Per request. */
  timeoutMs: number;
  fetchImpl?: ProbeFetch;
  /** E.g. the upstream's `authorization`, when the sidecar is configured with one. */
  headers?: Record<string, string>;
  /** Answers are read up to this size (SGLang's server info runs to tens of KiB). */
  maxBodyBytes?: number;
}

/** Never throws: every failure is an `unknown` with the reason as evidence. */
export async function detectUpstream(baseUrl: string, options: DetectOptions): Promise<UpstreamDetection> {
  try {
    return await detect(baseUrl, options);
  } catch (err) {
    return { flavor: 'unknown', evidence: `detection failed: ${(err as Error).message}`, serverVersion: null, answered: false };
  }
}

async function detect(baseUrl: string, options: DetectOptions): Promise<UpstreamDetection> {
  const base = baseUrl.replace(/\/+$/, '');
  const root = base.replace(/\/v1$/, '');
  const fetchImpl = options.fetchImpl ?? nodeGet;
  const get = (url: string) =>
    fetchImpl(url, {
      timeoutMs: options.timeoutMs,
      headers: { accept: 'application/json', ...options.headers },
      maxBodyBytes: options.maxBodyBytes ?? 1024 * 1024,
    });
  const modelsPath = `${pathOf(base)}/models`;

  const models = await get(`${base}/models`);
  const owners = ownersOf(models);
  if (owners?.includes('vllm')) {
    const version = versionOf(await get(`${root}/version`));
    return { flavor: 'vllm', evidence: `GET ${modelsPath}: owned_by vllm${version ? `; GET /version: ${version}` : ''}`, serverVersion: version };
  }
  if (owners?.includes('sglang')) {
    const info = await sglangInfo(get, root);
    return {
      flavor: 'sglang',
      evidence: `GET ${modelsPath}: owned_by sglang${info ? `; GET ${info.path}: ${info.version}` : ''}`,
      serverVersion: info?.version ?? null,
    };
  }
  if (owners && owners.length > 0) {
    return { flavor: 'openai', evidence: `GET ${modelsPath}: models owned by ${[...new Set(owners)].join(', ')}, not vllm or sglang`, serverVersion: null };
  }

  // No answer at all (refused, or nothing within the timeout): the server's other routes would
  // only wait as long again.
  if (models.status === 0) return { flavor: 'unknown', evidence: describe(models, modelsPath), serverVersion: null, answered: false };
  // No usable listing: the servers' own info routes, which no other server answers this way.
  const info = await sglangInfo(get, root);
  if (info)
    return {
      flavor: 'sglang',
      evidence: `GET ${info.path}: SGLang server info, version ${info.version} (${describe(models, modelsPath)})`,
      serverVersion: info.version,
    };
  if (models.status === 401 || models.status === 403) {
    const version = versionOf(await get(`${root}/version`));
    if (version)
      return {
        flavor: 'vllm',
        evidence: `GET ${modelsPath}: ${models.status} (key required, as vLLM's --api-key does for /v1 only); GET /version: ${version}`,
        serverVersion: version,
      };
  }
  // A 5xx is a gateway or server still starting (its workers not up yet): not an answer about what it is.
  return { flavor: 'unknown', evidence: describe(models, modelsPath), serverVersion: null, answered: models.status < 500 };
}

async function sglangInfo(get: (url: string) => Promise<ProbeResult>, root: string): Promise<{ path: string; version: string } | null> {
  for (const path of ['/server_info', '/get_server_info']) {
    const r = await get(`${root}${path}`);
    const o = r.status === 200 ? parseObject(r.body) : null;
    // SGLang answers its server arguments (model_path among them) merged with its version.
    if (o && typeof o.version === 'string' && typeof o.model_path === 'string') return { path, version: o.version };
    if (r.status === 0) return null;
  }
  return null;
}

/** `owned_by` of every listed model, or null when the answer is not a model listing. */
function ownersOf(r: ProbeResult): string[] | null {
  if (r.status !== 200) return null;
  const o = parseObject(r.body);
  if (!o || !Array.isArray(o.data)) return null;
  return o.data.flatMap((m) =>
    typeof m === 'object' && m !== null && typeof (m as { owned_by?: unknown }).owned_by === 'string' ? [(m as { owned_by: string }).owned_by] : [],
  );
}

function versionOf(r: ProbeResult): string | null {
  const o = r.status === 200 ? parseObject(r.body) : null;
  return o && typeof o.version === 'string' && o.version.length > 0 ? o.version : null;
}

function describe(r: ProbeResult, path: string): string {
  if (r.status === 0) return `GET ${path}: ${r.error ?? 'no answer'}`;
  if (r.status !== 200) return `GET ${path}: answered ${r.status}`;
  return parseObject(r.body) ? `GET ${path}: not a model listing` : `GET ${path}: answer is not JSON`;
}

function parseObject(text: string): Record<string, unknown> | null {
  try {
    const v: unknown = JSON.parse(text);
    return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

function pathOf(url: string): string {
  try {
    return new URL(url).pathname.replace(/\/+$/, '');
  } catch {
    return '';
  }
}

/** GET with node:http(s): one timeout for the whole exchange, body capped, never throws. */
export const nodeGet: ProbeFetch = (url, { timeoutMs, headers, maxBodyBytes }) =>
  new Promise((resolve) => {
    let settled = false;
    let req: http.ClientRequest | undefined;
    const timer = setTimeout(() => {
      req?.destroy();
      done({ status: 0, body: '', error: `no answer within ${timeoutMs} ms` });
    }, timeoutMs);
    timer.unref();
    const done = (r: ProbeResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(r);
    };
    try {
      const mod = url.startsWith('https:') ? https : http;
      req = mod.get(url, { headers }, (res) => {
        const parts: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > maxBodyBytes) {
            req?.destroy();
            done({ status: res.statusCode ?? 0, body: '', error: `answer larger than ${maxBodyBytes} bytes` });
            return;
          }
          parts.push(c);
        });
        res.on('end', () => done({ status: res.statusCode ?? 0, body: Buffer.concat(parts).toString('utf8') }));
        res.on('error', (err) => done({ status: 0, body: '', error: err.message }));
      });
    } catch (err) {
      done({ status: 0, body: '', error: (err as Error).message });
      return;
    }
    req.on('error', (err: NodeJS.ErrnoException) => done({ status: 0, body: '', error: err.code ?? err.message }));
  });
