import { decodeJson, decodeProtobuf, otlpRoot } from '../../../src/receivers/otlp/decode';

const TRACE = Buffer.from('5b8efff798038103d269b633813fc60c', 'hex');
const SPAN = Buffer.from('eee19b7ec3c1b174', 'hex');
const PARENT = Buffer.from('eee19b7ec3c1b173', 'hex');
const LINK_TRACE = Buffer.from('0af7651916cd43dd8448eb211c80319c', 'hex');
const LINK_SPAN = Buffer.from('b7ad6b7169203331', 'hex');
const BYTES = Buffer.from([0, 1, 2, 250, 255]);

/** Every AnyValue kind, in protobuf-object form and in OTLP/JSON form. */
const values: [string, object, object][] = [
  ['s', { string_value: 'héllo' }, { stringValue: 'héllo' }],
  ['b', { bool_value: true }, { boolValue: true }],
  ['i', { int_value: 42 }, { intValue: '42' }],
  ['i_num', { int_value: -7 }, { intValue: -7 }],
  ['i_big', { int_value: '9007199254740993' }, { intValue: '9007199254740993' }],
  ['d', { double_value: 1.5 }, { doubleValue: 1.5 }],
  ['bytes', { bytes_value: BYTES }, { bytesValue: BYTES.toString('base64') }],
  [
    'arr',
    { array_value: { values: [{ string_value: 'x' }, { int_value: 1 }, { array_value: { values: [{ bool_value: false }] } }] } },
    { arrayValue: { values: [{ stringValue: 'x' }, { intValue: '1' }, { arrayValue: { values: [{ boolValue: false }] } }] } },
  ],
  [
    'kv',
    {
      kvlist_value: {
        values: [
          { key: 'inner', value: { double_value: 2.25 } },
          { key: 'deep', value: { kvlist_value: { values: [{ key: 'z', value: { string_value: 'q' } }] } } },
        ],
      },
    },
    {
      kvlistValue: {
        values: [
          { key: 'inner', value: { doubleValue: 2.25 } },
          { key: 'deep', value: { kvlistValue: { values: [{ key: 'z', value: { stringValue: 'q' } }] } } },
        ],
      },
    },
  ],
  ['empty', {}, {}],
];

const pbAttrs = values.map(([key, pb]) => ({ key, value: pb }));
const jsonAttrs = values.map(([key, , js]) => ({ key, value: js }));

const pbRequest = {
  resource_spans: [
    {
      resource: { attributes: [{ key: 'service.name', value: { string_value: 'svc' } }], dropped_attributes_count: 1 },
      schema_url: 'https://opentelemetry.io/schemas/1.26.0',
      scope_spans: [
        {
          scope: { name: 'scope', version: '9.9', attributes: [{ key: 'sa', value: { int_value: 3 } }] },
          spans: [
            {
              trace_id: TRACE,
              span_id: SPAN,
              trace_state: 'vendor=1',
              parent_span_id: PARENT,
              flags: 0x301,
              name: 'execute_tool golden',
              kind: 3,
              start_time_unix_nano: '1700000000123456789',
              end_time_unix_nano: '1700000001987654321',
              attributes: pbAttrs,
              dropped_attributes_count: 2,
              events: [
                { time_unix_nano: '1700000000500000000', name: 'exception', attributes: [{ key: 'exception.type', value: { string_value: 'ValueError' } }] },
              ],
              dropped_events_count: 3,
              links: [{ trace_id: LINK_TRACE, span_id: LINK_SPAN, trace_state: 'l=2', attributes: [{ key: 'la', value: { bool_value: true } }], flags: 1 }],
              dropped_links_count: 4,
              status: { code: 2, message: 'failed' },
            },
          ],
        },
      ],
    },
  ],
};

const jsonRequest = {
  resourceSpans: [
    {
      resource: { attributes: [{ key: 'service.name', value: { stringValue: 'svc' } }], droppedAttributesCount: 1 },
      schemaUrl: 'https://opentelemetry.io/schemas/1.26.0',
      scopeSpans: [
        {
          scope: { name: 'scope', version: '9.9', attributes: [{ key: 'sa', value: { intValue: 3 } }] },
          spans: [
            {
              traceId: TRACE.toString('hex').toUpperCase(),
              spanId: SPAN.toString('hex'),
              traceState: 'vendor=1',
              parentSpanId: PARENT.toString('hex'),
              flags: 0x301,
              name: 'execute_tool golden',
              kind: 3,
              startTimeUnixNano: '1700000000123456789',
              endTimeUnixNano: '1700000001987654321',
              attributes: jsonAttrs,
              droppedAttributesCount: 2,
              events: [
                { timeUnixNano: '1700000000500000000', name: 'exception', attributes: [{ key: 'exception.type', value: { stringValue: 'ValueError' } }] },
              ],
              droppedEventsCount: 3,
              links: [
                {
                  traceId: LINK_TRACE.toString('hex'),
                  spanId: LINK_SPAN.toString('hex'),
                  traceState: 'l=2',
                  attributes: [{ key: 'la', value: { boolValue: true } }],
                  flags: 1,
                },
              ],
              droppedLinksCount: 4,
              status: { code: 2, message: 'failed' },
              unknownFieldFromTheFuture: { ignored: true },
            },
          ],
        },
      ],
    },
  ],
};

describe('golden: every Span field and AnyValue kind through both decoders', () => {
  const type = otlpRoot().lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
  const fromPb = decodeProtobuf(type.encode(type.fromObject(pbRequest)).finish());
  const fromJson = decodeJson(JSON.stringify(jsonRequest));

  it('gives identical normalized spans', () => {
    expect(fromPb.rejected).toBe(0);
    expect(fromJson.rejected).toBe(0);
    expect(fromJson.spans).toEqual(fromPb.spans);
  });

  it('gives the expected values for every field', () => {
    const [s] = fromPb.spans;
    expect(s).toEqual({
      traceId: '5b8efff798038103d269b633813fc60c',
      spanId: 'eee19b7ec3c1b174',
      parentSpanId: 'eee19b7ec3c1b173',
      traceState: 'vendor=1',
      flags: 0x301,
      name: 'execute_tool golden',
      kind: 3,
      startTimeUnixNano: '1700000000123456789',
      endTimeUnixNano: '1700000001987654321',
      attributes: {
        s: 'héllo',
        b: true,
        i: 42,
        i_num: -7,
        i_big: '9007199254740993',
        d: 1.5,
        bytes: new Uint8Array(BYTES),
        arr: ['x', 1, [false]],
        kv: { inner: 2.25, deep: { z: 'q' } },
        empty: null,
      },
      events: [{ name: 'exception', timeUnixNano: '1700000000500000000', attributes: { 'exception.type': 'ValueError' } }],
      links: [{ traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceState: 'l=2', attributes: { la: true } }],
      status: { code: 2, message: 'failed' },
      resource: { 'service.name': 'svc' },
      scope: { name: 'scope', version: '9.9', attributes: { sa: 3 } },
    });
  });
});
