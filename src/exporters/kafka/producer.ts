/** One record for Kafka. */
export interface OutMessage {
  key: string;
  value: Buffer;
  headers: Record<string, string>;
}

/** A send's outcome as a value (opentelemetry-js style), never an exception. */
export type SendResult =
  | { status: 'success' }
  | { status: 'retryable'; error: Error }
  /** `tooLarge`: the broker refused the size; the caller splits or sets records aside. */
  | { status: 'failure'; error: Error; tooLarge: boolean };

/**
 * The small interface the exporter needs from a Kafka client, so kafkajs (dormant upstream)
 * stays swappable. Delivery is acks=all with an idempotent producer.
 */
export interface Producer {
  /** Resolves when connected; rejects if the brokers cannot be reached now. */
  connect(): Promise<void>;
  send(topic: string, messages: OutMessage[]): Promise<SendResult>;
  disconnect(): Promise<void>;
  readonly connected: boolean;
}
