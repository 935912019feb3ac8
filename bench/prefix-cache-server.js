'use strict';
// A vLLM stand-in with automatic prefix caching, for routing benchmarks. The prompt is tokenized
// by the bench tokenizer (agent-tokens.js, ~4 bytes a token) and cut into blocks of `blockTokens`;
// a block's hash chains the one before it, as vLLM's block hashes do, so a block is found only
// when everything before it is found too. The replica keeps an LRU of block hashes up to
// `capacityTokens`: the leading blocks found are cached tokens, the rest is prefill to compute.
// Prefill costs `baseMs + prefillTokens * perTokenUs / 1000` of timer time (no CPU) and one
// prefill runs at a time per replica, so calls queue behind each other and load matters; decoding
// the short answer (`itlMs` a token) overlaps other calls' prefill, as batched decoding does.
// Answers chat completions like vLLM (whole or streamed; prompt_token_ids, token_ids and logprobs
// when asked; usage with cached tokens) and serves /v1/models, /health and /metrics (vLLM's
// running and waiting gauges). In-process: `startPrefixCacheServer` resolves once it listens.
const crypto = require('node:crypto');
const http = require('node:http');
const { promptIds, answerIds } = require('./agent-tokens');

/**
 * Chained hashes of the full blocks of `ids` (a trailing partial block is never cached, as in
 * vLLM): each block's hash mixes the previous block's hash with its ids. Two 32-bit lanes make a
 * 64-bit key, cheap enough to hash every prompt on the bench's own event loop.
 */
function blockHashes(ids, blockTokens) {
  const out = [];
  let a = 0x811c9dc5;
  let b = 0x9747b28c;
  for (let i = 0; i + blockTokens <= ids.length; i += blockTokens) {
    for (let j = i; j < i + blockTokens; j++) {
      a = Math.imul(a ^ ids[j], 16777619);
      b = Math.imul(b ^ ids[j], 0x5bd1e995);
      b ^= b >>> 15;
    }
    out.push(`${a >>> 0}.${b >>> 0}`);
  }
  return out;
}

/** An LRU set of block hashes holding at most `capacityBlocks` (Infinity: never evicts). */
class PrefixCache {
  constructor(capacityBlocks) {
    this.capacity = capacityBlocks;
    // A Map keeps insertion order: the first key is the least recently used.
    this.blocks = new Map();
    this.evicted = 0;
  }

  /** How many leading blocks of `hashes` are cached. */
  lookup(hashes) {
    let n = 0;
    while (n < hashes.length && this.blocks.has(hashes[n])) n++;
    return n;
  }

  /** The cached tokens of a prompt of `promptLength` tokens whose blocks are `hashes`. */
  cachedTokens(hashes, promptLength, blockTokens) {
    const hit = this.lookup(hashes);
    // vLLM computes at least the prompt's last token, to sample from.
    return Math.min(hit * blockTokens, Math.max(0, (Math.ceil(promptLength / blockTokens) - 1) * blockTokens));
  }

  /**
   * Marks `hashes` as just used, inserting the missing ones, then evicts down to capacity. Touched
   * last block first, so a prompt's tail is evicted before its head, as vLLM frees a request's
   * blocks: a chain broken at its head would leave the rest unreachable.
   */
  touch(hashes) {
    for (let i = hashes.length - 1; i >= 0; i--) {
      this.blocks.delete(hashes[i]);
      this.blocks.set(hashes[i], true);
    }
    for (const h of this.blocks.keys()) {
      if (this.blocks.size <= this.capacity) break;
      this.blocks.delete(h);
      this.evicted++;
    }
  }

  clear() {
    this.blocks.clear();
    this.evicted = 0;
  }
}

/** The answer: a short fixed-length message (the next prompt repeats it), chosen from the prompt's size. */
function answerText(promptLength) {
  return `Step ${String(promptLength % 1000).padStart(3, '0')}: read the output, calling the next tool.`;
}

function newStats() {
  return { calls: 0, promptTokens: 0, cachedTokens: 0, prefillTokens: 0, ttftMs: [] };
}

/**
 * Starts a replica on 127.0.0.1; resolves with { port, stats(), reset(), close() }. stats(): this
 * replica's calls, prompt, cached and computed (prefill) tokens and server-side TTFTs (arrival to
 * first token, queueing included); reset() clears the stats and the cache.
 */
function startPrefixCacheServer({ capacityTokens, blockTokens = 16, perTokenUs = 50, baseMs = 5, itlMs = 2, model = 'bench-policy', port = 0 }) {
  const cache = new PrefixCache(Math.floor(capacityTokens / blockTokens));
  let stats = newStats();
  // One prefill lane: the call being prefilled, and the calls waiting for it in arrival order.
  const waiting = [];
  let prefilling = false;
  let decoding = 0;
  const timers = new Set();
  const later = (ms, fn) => {
    const t = setTimeout(() => {
      timers.delete(t);
      fn();
    }, ms);
    timers.add(t);
  };

  function nextPrefill() {
    if (prefilling) return;
    let job;
    // A call whose agent has gone is dropped, as vLLM aborts it.
    while ((job = waiting.shift()) && job.gone);
    if (!job) return;
    prefilling = true;
    // Looked up when scheduled, not on arrival: what ran meanwhile may have cached or evicted blocks.
    const cached = cache.cachedTokens(job.hashes, job.prompt.length, blockTokens);
    const prefill = job.prompt.length - cached;
    cache.touch(job.hashes.slice(0, cached / blockTokens));
    later(baseMs + (prefill * perTokenUs) / 1000, () => {
      cache.touch(job.hashes);
      prefilling = false;
      stats.calls++;
      stats.promptTokens += job.prompt.length;
      stats.cachedTokens += cached;
      stats.prefillTokens += prefill;
      stats.ttftMs.push(performance.now() - job.arrived);
      decoding++;
      job.firstToken(cached);
      nextPrefill();
    });
  }

  function chat(res, body) {
    const prompt = promptIds(Array.isArray(body.messages) ? body.messages : []);
    const text = answerText(prompt.length);
    const ids = answerIds(text);
    const job = { prompt, hashes: blockHashes(prompt, blockTokens), arrived: performance.now(), gone: false, firstToken: null };
    res.once('close', () => {
      if (!res.writableFinished) job.gone = true;
    });
    const ctx = { body, prompt, text, ids, id: `chatcmpl-${crypto.randomUUID()}` };
    if (body.stream === true) {
      // Headers at once, the first event after prefill, as vLLM's server sends them.
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.flushHeaders();
      job.firstToken = (cached) => stream(res, ctx, cached);
    } else {
      job.firstToken = (cached) => later(itlMs * ids.length, () => whole(res, ctx, cached));
    }
    waiting.push(job);
    nextPrefill();
  }

  function usage(ctx, cached) {
    return {
      prompt_tokens: ctx.prompt.length,
      completion_tokens: ctx.ids.length,
      total_tokens: ctx.prompt.length + ctx.ids.length,
      prompt_tokens_details: { cached_tokens: cached },
    };
  }

  function tokenLogprobs(ids, from) {
    return { content: ids.map((t, i) => ({ token: `t${t}`, logprob: -0.001 * ((from + i) % 100), bytes: null, top_logprobs: [] })) };
  }

  function whole(res, ctx, cached) {
    decoding--;
    const { body, prompt, text, ids } = ctx;
    const out = {
      id: ctx.id,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: body.model ?? model,
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: text },
          logprobs: body.logprobs ? tokenLogprobs(ids, 0) : null,
          finish_reason: 'stop',
          ...(body.return_token_ids ? { token_ids: ids } : {}),
        },
      ],
      usage: usage(ctx, cached),
      ...(body.return_token_ids ? { prompt_token_ids: prompt } : {}),
    };
    if (res.destroyed) return;
    const bytes = Buffer.from(JSON.stringify(out));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': bytes.length }).end(bytes);
  }

  /** One `chat.completion.chunk` a token, `itlMs` apart; the end token carries finish_reason. */
  function stream(res, ctx, cached) {
    const { body, prompt, text, ids } = ctx;
    const chunk = (choices, extra = {}) =>
      `data: ${JSON.stringify({ id: ctx.id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model: body.model ?? model, choices, ...extra })}\n\n`;
    let i = 0;
    const next = () => {
      if (res.destroyed) {
        decoding--;
        return;
      }
      const last = i === ids.length - 1;
      const choice = {
        index: 0,
        delta: i === 0 ? { role: 'assistant', content: text.slice(0, 4) } : { content: last ? '' : text.slice(4 * i, 4 * i + 4) },
        logprobs: body.logprobs ? tokenLogprobs([ids[i]], i) : null,
        finish_reason: last ? 'stop' : null,
        ...(body.return_token_ids ? { token_ids: [ids[i]] } : {}),
      };
      let out = chunk([choice], i === 0 && body.return_token_ids ? { prompt_token_ids: prompt } : {});
      i++;
      if (!last) {
        res.write(out);
        later(itlMs, next);
        return;
      }
      // The usage event replaces the choices (its `choices` wins over the placeholder).
      if (body.stream_options?.include_usage) out += chunk([], { usage: usage(ctx, cached) });
      decoding--;
      res.end(out + 'data: [DONE]\n\n');
    };
    next();
  }

  function metrics() {
    const label = `{model_name="${model}"}`;
    const gauge = (name, help, v) => `# HELP ${name} ${help}\n# TYPE ${name} gauge\n${name}${label} ${v}\n`;
    const counter = (name, help, v) => `# HELP ${name} ${help}\n# TYPE ${name} counter\n${name}${label} ${v}\n`;
    return (
      gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', (prefilling ? 1 : 0) + decoding) +
      gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', waiting.filter((j) => !j.gone).length) +
      gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', cache.blocks.size / cache.capacity) +
      counter('vllm:prefix_cache_queries_total', 'Prefix cache queries, in terms of number of queried tokens.', stats.promptTokens) +
      counter('vllm:prefix_cache_hits_total', 'Prefix cache hits, in terms of number of cached tokens.', stats.cachedTokens)
    );
  }

  const json = (res, status, x) => {
    const bytes = Buffer.from(JSON.stringify(x));
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': bytes.length }).end(bytes);
  };

  const server = http.createServer((req, res) => {
    const url = req.url.split('?')[0];
    if (req.method === 'GET') {
      req.resume();
      if (url === '/health') return res.writeHead(200, { 'content-length': 0 }).end();
      if (url === '/metrics') return res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(metrics());
      if (url === '/v1/models')
        return json(res, 200, { object: 'list', data: [{ id: model, object: 'model', created: 1, owned_by: 'vllm', max_model_len: 131072 }] });
      return json(res, 404, { error: { message: 'not found' } });
    }
    if (req.method !== 'POST' || url !== '/v1/chat/completions') {
      req.resume();
      return json(res, 404, { error: { message: 'not found' } });
    }
    const parts = [];
    req.on('data', (c) => parts.push(c));
    req.on('end', () => {
      let body;
      try {
        body = JSON.parse(Buffer.concat(parts).toString('utf8'));
      } catch {
        return json(res, 400, { error: { message: 'bad json' } });
      }
      chat(res, body);
    });
  });
  server.keepAliveTimeout = 65_000;

  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () =>
      resolve({
        port: server.address().port,
        stats: () => ({ ...stats, ttftMs: [...stats.ttftMs], evictedBlocks: cache.evicted }),
        reset: () => {
          stats = newStats();
          cache.clear();
        },
        close: () =>
          new Promise((done) => {
            for (const t of timers) clearTimeout(t);
            timers.clear();
            server.close(() => done());
            server.closeAllConnections();
          }),
      }),
    );
  });
}

module.exports = { startPrefixCacheServer, PrefixCache, blockHashes, answerText };

// Alone: node bench/prefix-cache-server.js [capacityTokens] [perTokenUs]; prints {"port": N}.
if (require.main === module) {
  startPrefixCacheServer({ capacityTokens: Number(process.argv[2] ?? 65536), perTokenUs: Number(process.argv[3] ?? 50) }).then((s) =>
    process.stdout.write(JSON.stringify({ port: s.port }) + '\n'),
  );
  process.on('SIGTERM', () => process.exit(0));
}
