import { extractFacts } from '../../../src/formats/extract';
import { CallCapture } from '../../../src/receivers/llm-proxy/capture';
import { memoryCapture } from '../../support/memory-capture';
import { parseSse, sseJsonPayloads } from '../../../src/formats/sse';

describe('SSE parsing', () => {
  it('handles LF, CRLF and CR line ends, comments, event names and multi-line data', () => {
    const text = ': keep-alive\r\nevent: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata:3\n\ndata: x\r\r';
    expect(parseSse(text)).toEqual({
      events: [
        { event: 'a', data: '1\n2' },
        { event: 'message', data: '3' },
        { event: 'message', data: 'x' },
      ],
      complete: true,
    });
  });
  it('returns the last event of a cut stream, flagged incomplete', () => {
    expect(parseSse('data: {"a":1}\n\ndata: {"b"')).toEqual({
      events: [
        { event: 'message', data: '{"a":1}' },
        { event: 'message', data: '{"b"' },
      ],
      complete: false,
    });
  });
  it('captures the same call whatever byte boundaries the stream arrived in, multi-byte characters included', () => {
    const text =
      'data: {"choices":[{"index":0,"delta":{"content":"h\u00e9"},"token_ids":[5]}],"prompt_token_ids":[1]}\r\n\r\n' +
      'data: {"choices":[{"index":0,"delta":{"content":"llo ✓ é"},"token_ids":[6],"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n';
    const bytes = Buffer.from(text.replace('\\u00e9', 'é'));
    const finish = (chunks: Buffer[]) => {
      const { sink, read } = memoryCapture();
      const c = new CallCapture(
        'chat.completions',
        { rolloutId: 'r', attemptId: '0', groupId: null, agentName: null, source: 'path' },
        0,
        null,
        null,
        0,
        1 << 20,
        sink,
      );
      c.callId = sink.callStarted({ type: 'call_start', correlation: c.correlation, seq: 0, traceId: null, at: 0 });
      c.streamed = true;
      c.responseStatus = 200;
      for (const chunk of chunks) c.response(chunk);
      return extractFacts(c.finish({ status: 'ok', error: null, endedAt: 1, endedMono: 1 }, 0), read).facts;
    };
    const whole = finish([bytes]);
    expect(whole.choices[0]).toMatchObject({ responseTokenIds: [5, 6], finishReason: 'stop' });
    expect((whole.response as { choices: { message: { content: string } }[] }).choices[0].message.content).toBe('héllo ✓ é');
    for (let i = 1; i < bytes.length; i++) {
      const split = finish([bytes.subarray(0, i), bytes.subarray(i)]);
      expect(split.response).toEqual(whole.response);
      expect(split.status).toBe('ok');
    }
  });

  it('counts unparsable payloads instead of throwing', () => {
    expect(sseJsonPayloads('data: {nope\n\ndata: {"ok":true}\n\n')).toMatchObject({ invalid: 1, payloads: [{ value: { ok: true } }] });
  });
});
