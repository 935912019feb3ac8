import path from 'node:path';

interface Window {
  name: string;
  startUs: number;
  endUs: number;
  units: number;
}
interface Analysis {
  units: number;
  busy_us_per_unit: number;
  idle_share: number;
  parts: Record<string, number>;
  top: { name: string; us_per_unit: number }[];
}
// The bench is plain JavaScript run by node; its analysis is loaded as it runs there.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const bench = require(path.join(__dirname, '../../bench/profile.js')) as {
  analyzeProfile: (profile: unknown, windows: Window[], top?: number) => Analysis[];
  partOf: (url: string) => string | null;
  GC: string;
  NODE: string;
  PROGRAM: string;
};

const DIST = 'file:///app/dist/';
let nextId = 1;
function frame(functionName: string, url: string, children: { id: number }[] = []): { id: number; callFrame: object; children: number[] } {
  return { id: nextId++, callFrame: { functionName, url, scriptId: '0', lineNumber: 0, columnNumber: 0 }, children: children.map((c) => c.id) };
}

describe('bench profile analysis', () => {
  // root ─┬ (idle) ─ (garbage collector) ─ (program)
  //       ├ handle (proxy) ─ writev (native, no url)
  //       ├ capture hook (proxy/capture.js) ─ copy (node:buffer)
  //       ├ writeQueued (journal) ─ writeBuffers (native)
  //       ├ listOnTimeout (node:internal/timers): no sidecar frame above or below it
  //       └ observe (prom-client)
  const writev = frame('writev', '');
  const handle = frame('handle', `${DIST}receivers/llm-proxy/proxy.js`, [writev]);
  const copy = frame('_copyActual', 'node:buffer');
  const hook = frame('response', `${DIST}receivers/llm-proxy/capture.js`, [copy]);
  const writeBuffers = frame('writeBuffers', '');
  const journal = frame('writeQueued', `${DIST}journal/journal.js`, [writeBuffers]);
  const timers = frame('listOnTimeout', 'node:internal/timers');
  const metrics = frame('observe', 'file:///app/node_modules/prom-client/lib/histogram.js');
  const idle = frame('(idle)', '');
  const gc = frame('(garbage collector)', '');
  const program = frame('(program)', '');
  const root = frame('(root)', '', [idle, gc, program, handle, hook, journal, timers, metrics]);
  const nodes = [root, idle, gc, program, handle, writev, hook, copy, journal, writeBuffers, timers, metrics];

  // Each sample lasts until the next one: 10 µs apart, from t = 1000.
  const order = [writev, writev, copy, writeBuffers, timers, metrics, gc, program, idle, idle, writev, writev];
  const profile = {
    nodes,
    startTime: 1000,
    endTime: 1000 + 10 * (order.length + 1),
    samples: order.map((n) => n.id),
    timeDeltas: order.map(() => 10),
  };
  // Samples start at 1010, 1020, …, 1120: the first window holds the first ten, the second the last two.
  const windows: Window[] = [
    { name: 'a', startUs: 1010, endUs: 1110, units: 2 },
    { name: 'b', startUs: 1110, endUs: 2000, units: 1 },
  ];

  it('attributes native and built-in frames to the sidecar code that called them, by part', () => {
    const [a] = bench.analyzeProfile(profile, windows);
    expect(a.units).toBe(2);
    // 8 busy samples of 10 µs over 2 requests; 2 idle samples.
    expect(a.busy_us_per_unit).toBe(40);
    expect(a.idle_share).toBeCloseTo(0.2);
    expect(a.parts).toEqual({
      'proxy: forwarding': 10,
      'proxy: capture hooks (tee, ids asked for, stripped)': 5,
      journal: 5,
      'metrics and logs': 5,
      [bench.NODE]: 5,
      [bench.GC]: 5,
      [bench.PROGRAM]: 5,
    });
    expect(a.top[0]).toEqual({ name: 'writev', us_per_unit: 10 });
  });

  it('keeps each window to its own samples', () => {
    const [, b] = bench.analyzeProfile(profile, windows);
    // The last sample lasts until the profile's end: two writev samples, 10 µs each, 1 request.
    expect(b.busy_us_per_unit).toBe(20);
    expect(b.parts).toEqual({ 'proxy: forwarding': 20 });
    expect(b.idle_share).toBe(0);
  });

  it('names the parts by the path under dist/ or node_modules/', () => {
    expect(bench.partOf(`${DIST}formats/extract.js`)).toBe('extraction (answers read for ids, logprobs, tool calls)');
    expect(bench.partOf(`${DIST}formats/http1-response.js`)).toBe('proxy: forwarding');
    expect(bench.partOf(`${DIST}processors/episodes/assembler.js`)).toBe('records and episodes');
    expect(bench.partOf(`${DIST}processors/rewards/transitions.js`)).toBe('transitions (AIR, credit)');
    expect(bench.partOf(`${DIST}exporters/file/ndjson-writer.js`)).toBe('export (transition JSON, NDJSON or Kafka)');
    expect(bench.partOf(`${DIST}receivers/otlp/receiver.js`)).toBe('other sidecar code');
    expect(bench.partOf('file:///app/node_modules/kafkajs/src/producer/index.js')).toBe('Kafka client (kafkajs)');
    expect(bench.partOf('file:///app/node_modules/yaml/dist/index.js')).toBe('other libraries');
    expect(bench.partOf('node:internal/streams/readable')).toBeNull();
  });
});

describe('bench profile analysis: shared helpers', () => {
  // The JSON scanner and the checksum are called by several parts: each sample counts for the
  // part that called them, and for the helper's own part only with no sidecar frame above it.
  const CAPTURE = 'proxy: capture hooks (tee, ids asked for, stripped)';
  const EXTRACTION = 'extraction (answers read for ids, logprobs, tool calls)';
  const scanFromStrip = frame('findMembersOfEach', `${DIST}formats/json-scan.js`);
  const strip = frame('nullCuts', `${DIST}receivers/llm-proxy/strip.js`, [scanFromStrip]);
  const crcNative = frame('crc32', '');
  const crc = frame('crc32', `${DIST}formats/crc32.js`, [crcNative]);
  const journal = frame('frameHeader', `${DIST}journal/frame.js`, [crc]);
  const scanFromExtract = frame('countIntArray', `${DIST}formats/json-scan.js`);
  const extract = frame('extractFacts', `${DIST}formats/extract.js`, [scanFromExtract]);
  const crcInKafka = frame('crc32', `${DIST}formats/crc32.js`);
  const kafka = frame('gzip', `${DIST}exporters/kafka/parallel-gzip.js`, [crcInKafka]);
  const alone = frame('skipValue', `${DIST}formats/json-scan.js`);
  const root = frame('(root)', '', [strip, journal, extract, kafka, alone]);
  const nodes = [root, strip, scanFromStrip, journal, crc, crcNative, extract, scanFromExtract, kafka, crcInKafka, alone];
  const order = [scanFromStrip, crcNative, crcNative, scanFromExtract, crcInKafka, alone];
  const profile = { nodes, startTime: 0, endTime: 10 * (order.length + 1), samples: order.map((n) => n.id), timeDeltas: order.map(() => 10) };

  it('counts a shared helper for the part that called it', () => {
    const [a] = bench.analyzeProfile(profile, [{ name: 'a', startUs: 0, endUs: 1000, units: 1 }]);
    expect(a.parts).toEqual({
      [CAPTURE]: 10,
      journal: 20,
      [EXTRACTION]: 20,
      'export (transition JSON, NDJSON or Kafka)': 10,
    });
  });
});

describe('bench profile report', () => {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const report = require(path.join(__dirname, '../../bench/report.js')) as { whereTheTimeGoes: (p: unknown) => string[] };
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const lib = require(path.join(__dirname, '../../bench/lib.js')) as { mainThreadTimes: (pid: number) => { user: number; sys: number } };
  const analysis = (busy: number, cpu?: { user_us_per_unit: number; sys_us_per_unit: number }) => ({
    units: 10,
    busy_us_per_unit: busy,
    idle_share: 0.5,
    parts: { journal: busy },
    top: [],
    rps: 100,
    ...(cpu ? { main_cpu: cpu } : {}),
  });

  it('prints the main thread CPU from /proc next to the busy time, with the difference capture makes', () => {
    const lines = report.whereTheTimeGoes({
      json_c1: {
        capture: analysis(300, { user_us_per_unit: 250, sys_us_per_unit: 60 }),
        nocapture: analysis(100, { user_us_per_unit: 80, sys_us_per_unit: 20 }),
      },
    });
    expect(lines).toContain('JSON (1 KiB), one connection, the same sidecar with capture on and off:');
    expect(lines).toContain('| main thread CPU from /proc (user + system) | 310.0 | 100.0 | 210.0 |');
    expect(lines).toContain('| of which system (kernel) | 60.0 | 20.0 | 40.0 |');
  });

  it('prints a dash where a run has no CPU figures (results from before they were taken)', () => {
    const lines = report.whereTheTimeGoes({ json_c16: { capture: analysis(300), nocapture: analysis(100) } });
    expect(lines).toContain('| main thread CPU from /proc (user + system) | – | – | – |');
  });

  it('reads a thread’s user and system time from /proc', () => {
    const before = lib.mainThreadTimes(process.pid);
    // Work on this thread until /proc has counted at least 100 ms of it (10 ms ticks), or 5 s pass.
    const until = Date.now() + 5000;
    let x = 0;
    while (Date.now() < until) {
      for (let i = 0; i < 1e6; i++) x += Math.sqrt(i);
      const now = lib.mainThreadTimes(process.pid);
      if (now.user + now.sys - before.user - before.sys >= 0.1) break;
    }
    const after = lib.mainThreadTimes(process.pid);
    expect(x).toBeGreaterThan(0);
    expect(after.user).toBeGreaterThanOrEqual(before.user);
    expect(after.sys).toBeGreaterThanOrEqual(before.sys);
    expect(after.user + after.sys - before.user - before.sys).toBeGreaterThanOrEqual(0.1);
  });
});
