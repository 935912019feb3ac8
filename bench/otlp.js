'use strict';
// OTLP ingest: spans/s at zero loss (closed loop) over gRPC and HTTP protobuf, gzip on/off, and
// CPU/RSS at an offered 10k spans/s (open loop). 10 % of spans are tool spans (journaled); the
// rest are ordinary client spans (classified and dropped), as in a typical agent trace.
const http = require('node:http');
const path = require('node:path');
const zlib = require('node:zlib');
const grpc = require('@grpc/grpc-js');
const protobuf = require('protobufjs');

function root() {
  const r = new protobuf.Root();
  const base = path.join(__dirname, '../proto');
  r.resolvePath = (_o, target) => path.join(base, target);
  r.loadSync(['opentelemetry/proto/collector/trace/v1/trace_service.proto'], { keepCase: true });
  return r;
}

let seq = 1; // an all-zero trace id is invalid
function request(n) {
  const R = root();
  const Req = R.lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
  const str = (key, v) => ({ key, value: { string_value: v } });
  const now = BigInt(Date.now()) * 1_000_000n;
  const spans = Array.from({ length: n }, (_, i) => {
    const tool = i % 10 === 0;
    const id = seq++;
    return {
      trace_id: Buffer.from(id.toString(16).padStart(32, '0'), 'hex'),
      span_id: Buffer.from((id + 1).toString(16).padStart(16, '0'), 'hex'),
      name: tool ? 'execute_tool calculator' : 'GET /api/search',
      kind: tool ? 1 : 3,
      start_time_unix_nano: String(now),
      end_time_unix_nano: String(now + 1_000_000n),
      attributes: tool
        ? [
            str('gen_ai.operation.name', 'execute_tool'),
            str('gen_ai.tool.name', 'calculator'),
            str('gen_ai.tool.call.id', `call_${id}`),
            str('lightning.rollout_id', `otlp-${id % 100}`),
          ]
        : [str('http.request.method', 'GET'), str('url.full', 'https://search.example.com/api/search?q=x'), str('server.address', 'search.example.com')],
      status: { code: tool && i % 20 === 0 ? 2 : 1 },
    };
  });
  const msg = Req.fromObject({
    resource_spans: [{ resource: { attributes: [str('service.name', 'bench-agent')] }, scope_spans: [{ scope: { name: 'bench' }, spans }] }],
  });
  return Buffer.from(Req.encode(msg).finish());
}

function httpSender(port, gzip) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
  return (body) =>
    new Promise((resolve) => {
      const payload = gzip ? zlib.gzipSync(body) : body;
      const req = http.request(
        {
          host: '127.0.0.1',
          port,
          path: '/v1/traces',
          method: 'POST',
          agent,
          headers: { 'content-type': 'application/x-protobuf', 'content-length': payload.length, ...(gzip ? { 'content-encoding': 'gzip' } : {}) },
        },
        (res) => {
          const parts = [];
          res.on('data', (c) => parts.push(c));
          // An empty (or partial_success-free) 200 is full acceptance.
          res.on('end', () => resolve(res.statusCode === 200 && Buffer.concat(parts).length <= 2));
        },
      );
      req.on('error', () => resolve(false));
      req.end(payload);
    });
}

function grpcSender(port, gzip) {
  const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), gzip ? { 'grpc.default_compression_algorithm': 2 } : {});
  return (body) =>
    new Promise((resolve) => {
      client.makeUnaryRequest(
        '/opentelemetry.proto.collector.trace.v1.TraceService/Export',
        (b) => b,
        (b) => b,
        body,
        new grpc.Metadata(),
        {},
        (err, res) => resolve(!err && (!res || res.length <= 2)),
      );
    });
}

/**
 * `sidecar` takes the closed loop; `paced`, a sidecar that has taken nothing yet, the offered 10k
 * spans/s, so that its RSS is what that load needs (a process keeps the pages a closed loop at ten
 * times the rate made it touch).
 */
async function benchOtlp({ sidecar, paced, durationMs, quick, proc }) {
  const out = {};
  const batch512 = request(512);
  for (const transport of ['grpc', 'http']) {
    for (const gzip of [false, true]) {
      const send = transport === 'grpc' ? grpcSender(sidecar.grpc, gzip) : httpSender(sidecar.http, gzip);
      // Closed loop: 4 senders as fast as the sidecar answers.
      const before = proc(sidecar.proc.pid);
      let ok = 0;
      let lost = 0;
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: 4 }, async () => {
          while (performance.now() - t0 < durationMs) {
            if (await send(batch512)) ok += 512;
            else lost += 512;
          }
        }),
      );
      const s = (performance.now() - t0) / 1000;
      const after = proc(sidecar.proc.pid);
      out[`${transport}${gzip ? '_gzip' : ''}_max`] = {
        spans_per_s: ok / s,
        lost_spans: lost,
        cpu_cores: (after.cpu - before.cpu) / s,
        rss_mib: after.rss / 2 ** 20,
      };
    }
  }
  // Open loop: 10k spans/s offered (20 batches of 500 per second) over gRPC and HTTP.
  const batch500 = request(500);
  for (const transport of ['grpc', 'http']) {
    const send = transport === 'grpc' ? grpcSender(paced.grpc, false) : httpSender(paced.http, false);
    const seconds = quick ? 2 : 10;
    const before = proc(paced.proc.pid);
    let ok = 0;
    let lost = 0;
    const pending = [];
    const t0 = performance.now();
    for (let i = 0; i < seconds * 20; i++) {
      const due = t0 + i * 50;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      pending.push(send(batch500).then((good) => (good ? (ok += 500) : (lost += 500))));
    }
    await Promise.all(pending);
    const s = (performance.now() - t0) / 1000;
    const after = proc(paced.proc.pid);
    out[`${transport}_10k`] = {
      offered_spans_per_s: 10_000,
      accepted_spans_per_s: ok / s,
      lost_spans: lost,
      cpu_pct_of_core: ((after.cpu - before.cpu) / s) * 100,
      rss_mib: after.rss / 2 ** 20,
    };
  }
  return out;
}

module.exports = { benchOtlp };
