import { readFileSync } from 'node:fs';
import type * as KafkajsModule from 'kafkajs';
import type { Kafka, KafkaConfig, Producer as KafkajsProducer, SASLOptions } from 'kafkajs';
import type { Config } from '../../config/schema';
import { createKafkaLogCreator, KAFKAJS_LOG_LEVEL } from '../../telemetry/kafka-log';
import type { Logger } from '../../telemetry/logger';
import type { OutMessage, Producer, SendResult } from './producer';
import { PIECEWISE_GZIP } from './parallel-gzip';

let kafkajsModule: typeof KafkajsModule | null = null;

/**
 * kafkajs, loaded when the first Kafka client is made: a sidecar that exports to files never
 * loads it, and its code does not sit in the heap every full collection marks.
 */
export function kafkajs(): typeof KafkajsModule {
  if (kafkajsModule === null) {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    kafkajsModule = require('kafkajs') as typeof KafkajsModule;
    // Codecs are kafkajs-wide: every client of this process compresses gzip in pieces (and reads it as kafkajs does).
    kafkajsModule.CompressionCodecs[kafkajsModule.CompressionTypes.GZIP] = () => PIECEWISE_GZIP;
  }
  return kafkajsModule;
}

export interface KafkajsProducerOptions {
  brokers: string[];
  clientId: string;
  compression: 'gzip' | 'none';
  connectionTimeoutMs: number;
  requestTimeoutMs: number;
  sasl?: { mechanism: 'plain' | 'scram-sha-256' | 'scram-sha-512'; username: string; password: string };
  tls?: { enabled: boolean; caFile?: string; certFile?: string; keyFile?: string; insecureSkipVerify: boolean };
}

/** The client settings of `exporters.kafka`, for every Kafka client the project creates. */
export function kafkaClientOptions(k: Config['exporters']['kafka'], clientId = k.client_id): KafkajsProducerOptions {
  return {
    brokers: k.brokers,
    clientId,
    compression: k.compression,
    connectionTimeoutMs: k.connection_timeout_ms,
    requestTimeoutMs: k.request_timeout_ms,
    sasl: k.sasl,
    tls: k.tls
      ? { enabled: k.tls.enabled, caFile: k.tls.ca_file, certFile: k.tls.cert_file, keyFile: k.tls.key_file, insecureSkipVerify: k.tls.insecure_skip_verify }
      : undefined,
  };
}

/**
 * A kafkajs client with our connection, auth, TLS and logging settings (shared by the exporter's
 * producer, the control consumer and the CLI's consumers): its logs go through our logger.
 */
export function createKafkaClient(options: KafkajsProducerOptions, logger: Logger): Kafka {
  const retries = 3;
  const config: KafkaConfig = {
    clientId: options.clientId,
    brokers: options.brokers,
    connectionTimeout: options.connectionTimeoutMs,
    requestTimeout: options.requestTimeoutMs,
    retry: { retries, initialRetryTime: 100, maxRetryTime: 2000 },
    logLevel: KAFKAJS_LOG_LEVEL,
    logCreator: createKafkaLogCreator(logger, { retries }),
  };
  if (options.sasl) config.sasl = { mechanism: options.sasl.mechanism, username: options.sasl.username, password: options.sasl.password } as SASLOptions;
  if (options.tls?.enabled) {
    config.ssl = {
      rejectUnauthorized: !options.tls.insecureSkipVerify,
      ca: options.tls.caFile ? [readFileSync(options.tls.caFile, 'utf8')] : undefined,
      cert: options.tls.certFile ? readFileSync(options.tls.certFile, 'utf8') : undefined,
      key: options.tls.keyFile ? readFileSync(options.tls.keyFile, 'utf8') : undefined,
    };
  }
  return new (kafkajs().Kafka)(config);
}

/** Our Producer over kafkajs: idempotent, acks=-1, one request in flight (ordering per partition). */
export function createKafkajsProducer(options: KafkajsProducerOptions, logger: Logger): Producer {
  const kafka = createKafkaClient(options, logger);
  const { CompressionTypes, Partitioners } = kafkajs();
  const compression = options.compression === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None;
  let producer: KafkajsProducer | null = null;
  let connected = false;
  let connecting: Promise<void> | null = null;

  const make = (): KafkajsProducer => {
    const p = kafka.producer({
      createPartitioner: Partitioners.DefaultPartitioner,
      idempotent: true,
      maxInFlightRequests: 1,
      allowAutoTopicCreation: true,
      retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 2000 },
    });
    p.on(p.events.CONNECT, () => (connected = true));
    p.on(p.events.DISCONNECT, () => (connected = false));
    return p;
  };

  return {
    get connected() {
      return connected;
    },
    connect(): Promise<void> {
      connecting ??= (async () => {
        producer ??= make();
        try {
          await producer.connect();
          connected = true;
        } catch (err) {
          // A failed kafkajs producer is not reused: the next attempt starts clean.
          await producer.disconnect().catch(() => {});
          producer = null;
          throw err;
        }
      })().finally(() => (connecting = null));
      return connecting;
    },
    async send(topic: string, messages: OutMessage[]): Promise<SendResult> {
      if (!producer || !connected) return { status: 'retryable', error: new Error('kafka: not connected') };
      try {
        await producer.send({
          topic,
          acks: -1,
          compression,
          timeout: options.requestTimeoutMs,
          messages: messages.map((msg) => ({ key: msg.key, value: msg.value, headers: msg.headers })),
        });
        return { status: 'success' };
      } catch (err) {
        return classify(err as KafkaError);
      }
    },
    async disconnect(): Promise<void> {
      const p = producer;
      producer = null;
      connected = false;
      await p?.disconnect().catch(() => {});
    },
  };
}

interface KafkaError extends Error {
  retriable?: boolean;
  type?: string;
}

/** kafkajs errors carry `retriable`; a retry-exhausted error wraps its cause. Size refusals are permanent. */
export function classify(err: KafkaError): SendResult {
  const root = err.name === 'KafkaJSNumberOfRetriesExceeded' && err.cause instanceof Error ? (err.cause as KafkaError) : err;
  if (root.type === 'MESSAGE_TOO_LARGE' || root.type === 'RECORD_LIST_TOO_LARGE') return { status: 'failure', error: root, tooLarge: true };
  const permanent = [
    'TOPIC_AUTHORIZATION_FAILED',
    'CLUSTER_AUTHORIZATION_FAILED',
    'SASL_AUTHENTICATION_FAILED',
    'INVALID_TOPIC_EXCEPTION',
    'UNSUPPORTED_VERSION',
  ];
  if (root.type && permanent.includes(root.type)) return { status: 'failure', error: root, tooLarge: false };
  if (err.retriable === false && root.retriable === false && root.type) return { status: 'failure', error: root, tooLarge: false };
  return { status: 'retryable', error: root };
}
