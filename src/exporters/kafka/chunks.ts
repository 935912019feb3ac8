import { createHash } from 'node:crypto';
import type { OutMessage } from './producer';
import { extend } from '../../model/extend';

/**
 * Splits a record's value into ordered chunks under the same key (so the same partition, in
 * order), each self-describing in its headers; the format consumers reassemble is in
 * docs/kafka-records.md. A value that fits is one message without chunk headers.
 */
export function chunkMessages(key: string, value: Buffer, headers: Record<string, string>, recordId: string, chunkBytes: number): OutMessage[] {
  if (value.length <= chunkBytes) return [{ key, value, headers }];
  const count = Math.ceil(value.length / chunkBytes);
  const sha256 = createHash('sha256').update(value).digest('hex');
  const out: OutMessage[] = [];
  for (let index = 0; index < count; index++) {
    out.push({
      key,
      value: value.subarray(index * chunkBytes, Math.min(value.length, (index + 1) * chunkBytes)),
      headers: extend(headers, {
        'lightning-chunk': 'v1',
        'lightning-record-id': recordId,
        'lightning-chunk-index': String(index),
        'lightning-chunk-count': String(count),
        'lightning-record-bytes': String(value.length),
        'lightning-record-sha256': sha256,
      }),
    });
  }
  return out;
}
