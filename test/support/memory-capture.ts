import type { CaptureSink } from '../../src/model/component';
import type { CallRecord, CallStartRecord } from '../../src/model/records';
import type { BodyReader } from '../../src/formats/extract';

/** A capture sink that keeps body frames in memory, with the reader extraction needs. */
export function memoryCapture(): { sink: CaptureSink; read: BodyReader; started: CallStartRecord[]; ended: CallRecord[] } {
  const frames = new Map<number, Buffer>();
  const started: CallStartRecord[] = [];
  const ended: CallRecord[] = [];
  let next = 0;
  const sink: CaptureSink = {
    callStarted: (r) => {
      started.push(r);
      return next++;
    },
    body: (_callId, _kind, bytes, offsets) => {
      frames.set(next, Buffer.isBuffer(bytes) ? Buffer.from(bytes) : Buffer.concat(bytes));
      offsets.push(next++);
      return true;
    },
    restartBody: () => {},
    bodyFlush: () => true,
    callEnded: (r) => void ended.push(r),
    flush: () => {},
    afterWrite: (then) => then(),
    writeSoon: () => {},
    beforeWrite: (then) => then(),
    read: (offsets) => read(offsets),
  };
  const read: BodyReader = (offsets) => Buffer.concat(offsets.map((o) => frames.get(o)!));
  return { sink, read, started, ended };
}
