import fc from 'fast-check';
import { ConfigError, loadConfig } from '../../src/config/load';
import type { Api } from '../../src/model/records';
import { extractBody, extractStream } from '../../src/formats/adapters';
import { parseSse } from '../../src/formats/sse';
import { decodeJson, decodeProtobuf, DecodeError, otlpRoot } from '../../src/receivers/otlp/decode';

/** Fixed seeds: CI runs the same cases every time; change the seed to explore. */
const RUN = { seed: 20261122, numRuns: 300 };
const APIS: Api[] = ['chat.completions', 'completions', 'responses', 'anthropic.messages'];

/** Either a value or a DecodeError: anything else thrown is a bug. */
function decodesOrRefuses(fn: () => unknown): boolean {
  try {
    fn();
    return true;
  } catch (err) {
    if (err instanceof DecodeError) return true;
    throw err;
  }
}

function validRequest(): Uint8Array {
  const Req = otlpRoot().lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
  const span = {
    trace_id: Buffer.alloc(16, 1),
    span_id: Buffer.alloc(8, 2),
    name: 'execute_tool calculator',
    kind: 1,
    start_time_unix_nano: '1700000000000000000',
    end_time_unix_nano: '1700000000100000000',
    attributes: [
      { key: 'gen_ai.tool.name', value: { string_value: 'calculator' } },
      {
        key: 'nested',
        value: {
          kvlist_value: {
            values: [
              {
                key: 'a',
                value: { array_value: { values: [{ int_value: 1 }, { double_value: 2.5 }, { bool_value: true }, { bytes_value: Buffer.from('x') }] } },
              },
            ],
          },
        },
      },
    ],
    status: { code: 2, message: 'boom' },
  };
  return Req.encode(
    Req.fromObject({
      resource_spans: [
        {
          resource: { attributes: [{ key: 'service.name', value: { string_value: 'fuzz' } }] },
          scope_spans: [{ spans: [span, { ...span, span_id: Buffer.alloc(8, 3) }] }],
        },
      ],
    }),
  ).finish();
}

describe('OTLP decoders never throw anything but DecodeError', () => {
  const valid = validRequest();

  it('protobuf: arbitrary bytes', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 2048 }), (bytes) => decodesOrRefuses(() => decodeProtobuf(bytes))),
      RUN,
    );
  });

  it('protobuf: a valid request truncated anywhere, or with bytes overwritten', () => {
    expect(decodeProtobuf(valid).spans).toHaveLength(2);
    fc.assert(
      fc.property(
        fc.nat({ max: valid.length }),
        fc.array(fc.tuple(fc.nat({ max: valid.length - 1 }), fc.integer({ min: 0, max: 255 })), { maxLength: 8 }),
        (cut, flips) => {
          const bytes = Buffer.from(valid.subarray(0, cut));
          for (const [at, v] of flips) if (at < bytes.length) bytes[at] = v;
          return decodesOrRefuses(() => decodeProtobuf(bytes));
        },
      ),
      RUN,
    );
  });

  it('protobuf: deeply nested AnyValue (kvlist/array) is refused or decoded, without a stack overflow', () => {
    // Built by hand on the wire (protobufjs's encoder refuses such depth).
    const varint = (n: number): number[] => {
      const out: number[] = [];
      while (n > 127) {
        out.push((n & 127) | 128);
        n >>>= 7;
      }
      return [...out, n];
    };
    const ld = (field: number, bytes: Buffer): Buffer => Buffer.concat([Buffer.from([(field << 3) | 2, ...varint(bytes.length)]), bytes]);
    for (const depth of [10, 60, 1000, 20_000]) {
      let v = ld(1, Buffer.from('leaf')); // AnyValue.string_value
      for (let i = 0; i < depth; i++) v = i % 2 ? ld(5, ld(1, v)) : ld(6, ld(1, Buffer.concat([ld(1, Buffer.from('k')), ld(2, v)]))); // array_value / kvlist_value
      const span = Buffer.concat([
        ld(1, Buffer.alloc(16, 1)),
        ld(2, Buffer.alloc(8, 1)),
        ld(5, Buffer.from('deep')),
        ld(9, Buffer.concat([ld(1, Buffer.from('deep')), ld(2, v)])),
      ]);
      const bytes = ld(1, ld(2, ld(2, span))); // resource_spans → scope_spans → spans
      let outcome = 'decoded';
      try {
        decodeProtobuf(bytes);
      } catch (err) {
        if (!(err instanceof DecodeError)) throw err;
        outcome = 'refused';
      }
      // Up to 64 AnyValues deep is read (docs/reliability.md).
      expect(outcome).toBe(depth <= 60 ? 'decoded' : 'refused');
    }
  });

  it('JSON: arbitrary text and arbitrary JSON values', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 512, unit: 'binary' }), (text) => decodesOrRefuses(() => decodeJson(text))),
      RUN,
    );
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 6 }), (value) => decodesOrRefuses(() => decodeJson(JSON.stringify(value)))),
      RUN,
    );
  });

  it('JSON: OTLP-shaped documents with wrong types in every position', () => {
    const anyish = fc.oneof(
      fc.string(),
      fc.integer(),
      fc.double(),
      fc.boolean(),
      fc.constant(null),
      fc.array(fc.jsonValue({ maxDepth: 2 }), { maxLength: 3 }),
      fc.dictionary(fc.string(), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 3 }),
    );
    const span = fc.record(
      {
        traceId: anyish,
        spanId: anyish,
        name: anyish,
        kind: anyish,
        startTimeUnixNano: anyish,
        endTimeUnixNano: anyish,
        attributes: fc.oneof(
          anyish,
          fc.array(
            fc.record({ key: anyish, value: fc.oneof(anyish, fc.record({ stringValue: anyish, intValue: anyish, kvlistValue: anyish, arrayValue: anyish })) }),
            { maxLength: 3 },
          ),
        ),
        status: anyish,
      },
      { requiredKeys: [] },
    );
    const doc = fc.record(
      {
        resourceSpans: fc.oneof(
          anyish,
          fc.array(
            fc.record(
              {
                resource: anyish,
                scopeSpans: fc.oneof(
                  anyish,
                  fc.array(fc.record({ scope: anyish, spans: fc.oneof(anyish, fc.array(span, { maxLength: 4 })) }, { requiredKeys: [] }), { maxLength: 3 }),
                ),
              },
              { requiredKeys: [] },
            ),
            { maxLength: 3 },
          ),
        ),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(doc, (d) => decodesOrRefuses(() => decodeJson(JSON.stringify(d)))),
      RUN,
    );
  });
});

describe('SSE parsing', () => {
  const field = fc.string({ maxLength: 40 }).filter((s) => !/[\r\n]/.test(s));
  const events = fc.array(
    fc.record({
      event: fc.option(
        field.filter((s) => s.length > 0 && !s.includes(':') && s.trim() === s),
        { nil: undefined },
      ),
      data: fc.array(field, { minLength: 1, maxLength: 3 }),
    }),
    { maxLength: 12 },
  );

  it('gives the same events whatever the line endings (LF, CRLF, CR) and interleaved comments', () => {
    fc.assert(
      fc.property(
        events,
        fc.array(fc.constantFrom('\n', '\r\n', '\r'), { minLength: 1, maxLength: 64 }),
        fc.array(fc.boolean(), { maxLength: 64 }),
        (evs, eols, comments) => {
          let k = 0;
          let last = '';
          // A CR followed by an LF is one CRLF by definition: after a CR, an LF ending is written as CRLF.
          const eol = () => {
            const e = eols[k++ % eols.length];
            last = last === '\r' && e === '\n' ? '\r\n' : e;
            return last;
          };
          let text = '';
          for (const [i, e] of evs.entries()) {
            if (comments[i]) text += `: keep-alive ${i}${eol()}`;
            if (e.event !== undefined) text += `event: ${e.event}${eol()}`;
            for (const d of e.data) text += `data: ${d}${eol()}`;
            text += eol();
          }
          const parsed = parseSse(text);
          expect(parsed.complete).toBe(true);
          expect(parsed.events).toEqual(evs.map((e) => ({ event: e.event || 'message', data: e.data.join('\n') })));
        },
      ),
      RUN,
    );
  });

  it('never throws on arbitrary text, invalid UTF-8, huge lines, or a stream cut anywhere; assembles every API', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 1024 }), (bytes) => {
        const text = Buffer.from(bytes).toString('utf8');
        parseSse(text);
        for (const api of APIS) extractStream(api, text);
        return true;
      }),
      RUN,
    );
    const huge = `data: ${'x'.repeat(8 * 1024 * 1024)}\n\n`;
    expect(parseSse(huge).events[0].data.length).toBe(8 * 1024 * 1024);
    const chat =
      [
        '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"hé"},"token_ids":[5]}],"prompt_token_ids":[1,2]}',
        '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"llo"},"finish_reason":"stop","token_ids":[6]}]}',
      ]
        .map((d) => `data: ${d}\n\n`)
        .join('') + 'data: [DONE]\n\n';
    const whole = extractStream('chat.completions', chat);
    expect(whole.choices[0].responseTokenIds).toEqual([5, 6]);
    // Cut before the data line carrying finish_reason is whole: recorded as incomplete, never thrown.
    const lastEventEnd = chat.indexOf('\n', chat.indexOf('"finish_reason":"stop"'));
    fc.assert(
      fc.property(fc.nat({ max: chat.length }), (cut) => {
        const partial = extractStream('chat.completions', chat.slice(0, cut));
        if (cut < lastEventEnd) expect(partial.incomplete).toBe(true);
        return true;
      }),
      { ...RUN, numRuns: Math.min(RUN.numRuns, chat.length + 1) },
    );
  });
});

describe('response bodies of every API never make extraction throw', () => {
  it('arbitrary JSON values, wrong types, deep nesting, huge arrays', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 8 }), (value) => {
        for (const api of APIS) extractBody(api, value);
        return true;
      }),
      RUN,
    );
    const shaped = fc.record(
      {
        choices: fc.oneof(
          fc.jsonValue({ maxDepth: 3 }),
          fc.array(
            fc.record(
              {
                index: fc.jsonValue({ maxDepth: 1 }),
                message: fc.jsonValue({ maxDepth: 3 }),
                token_ids: fc.oneof(fc.jsonValue({ maxDepth: 2 }), fc.array(fc.integer())),
                logprobs: fc.jsonValue({ maxDepth: 3 }),
              },
              { requiredKeys: [] },
            ),
            { maxLength: 3 },
          ),
        ),
        prompt_token_ids: fc.jsonValue({ maxDepth: 2 }),
        usage: fc.jsonValue({ maxDepth: 2 }),
        output: fc.jsonValue({ maxDepth: 3 }),
        content: fc.jsonValue({ maxDepth: 3 }),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(shaped, (value) => {
        for (const api of APIS) extractBody(api, value);
        return true;
      }),
      RUN,
    );
    let deep: unknown = 1;
    for (let i = 0; i < 5000; i++) deep = { choices: [deep] };
    for (const api of APIS) extractBody(api, deep);
    for (const api of APIS) extractBody(api, { choices: new Array(200_000).fill({ index: 0 }) });
  });
});

describe('config: any input gives a config or `path: message` problems', () => {
  const segment = String.raw`(?:[A-Za-z0-9_-]+|\[(?:\d+|"(?:[^"\\]|\\.)*")\])`;
  const problemShape = new RegExp(String.raw`^(\(root\)|${segment}(?:\.[A-Za-z0-9_-]+|\[(?:\d+|"(?:[^"\\]|\\.)*")\])*)( \(from [A-Z_]+\))?: \S`);
  it('arbitrary override objects', () => {
    const keys = fc.constantFrom(
      'receivers',
      'processors',
      'exporters',
      'service',
      'llm_proxy',
      'otlp',
      'episodes',
      'credit',
      'air',
      'kafka',
      'file',
      'journal',
      'endpoint',
      'brokers',
      'rules',
      'mode',
      'fsync',
      'bogus',
    );
    const tree = fc.letrec((tie) => ({
      node: fc.oneof({ depthSize: 'small' }, fc.jsonValue({ maxDepth: 1 }), fc.dictionary(keys, tie('node'), { maxKeys: 4 })),
    })).node;
    fc.assert(
      fc.property(fc.dictionary(keys, tree, { maxKeys: 4 }), (overrides) => {
        try {
          loadConfig({ env: {}, overrides: overrides as Record<string, unknown> });
        } catch (err) {
          if (!(err instanceof ConfigError)) throw err;
          for (const p of err.problems) expect(p).toMatch(problemShape);
        }
        return true;
      }),
      RUN,
    );
  });

  it('arbitrary env values', () => {
    const names = fc.constantFrom(
      'LIGHTNING_PROXY_ADDR',
      'LIGHTNING_KAFKA_BROKERS',
      'LIGHTNING_EXPORTER',
      'LIGHTNING_EPISODE_IDLE_TIMEOUT_MS',
      'LIGHTNING_KAFKA_TLS',
      'LIGHTNING_API_TOKEN',
      'LIGHTNING_POLICY_VERSION',
      'LIGHTNING_UPSTREAM_URL',
    );
    fc.assert(
      fc.property(fc.dictionary(names, fc.string({ maxLength: 30 }), { maxKeys: 4 }), (env) => {
        try {
          loadConfig({ env });
        } catch (err) {
          if (!(err instanceof ConfigError)) throw err;
          for (const p of err.problems) expect(p).toMatch(problemShape);
        }
        return true;
      }),
      RUN,
    );
  });
});
