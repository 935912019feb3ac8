import { createKafkaLogCreator, type KafkajsLogEntry } from '../../src/telemetry/kafka-log';
import { createLogger } from '../../src/telemetry/logger';

function setup(level: 'debug' | 'info' = 'info') {
  const lines: Record<string, unknown>[] = [];
  const logger = createLogger({ level, component: 'exporter', write: (l) => lines.push(JSON.parse(l)), clock: () => 0 });
  const log = createKafkaLogCreator(logger, { retries: 2 })();
  const entry = (level: number, namespace: string, log: Record<string, unknown>): KafkajsLogEntry => ({
    level,
    namespace,
    label: '',
    log: { timestamp: 'x', logger: 'kafkajs', message: '', ...log },
  });
  return { lines, log, entry };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('kafkajs logs through our logger', () => {
  it('turns the connection error and the broker pool retry of one round into one warn line with broker, error and attempt', () => {
    const { lines, log, entry } = setup();
    for (let retryCount = 0; retryCount < 3; retryCount++) {
      log(
        entry(1, 'Connection', {
          message: 'Connection error: connect ECONNREFUSED 10.0.0.1:9092',
          broker: '10.0.0.1:9092',
          clientId: 'c',
          stack: 'Error: …\n    at x',
        }),
      );
      log(
        entry(1, 'BrokerPool', {
          message: 'Failed to connect to seed broker, trying another broker from the list: Connection error: connect ECONNREFUSED 10.0.0.1:9092',
          retryCount,
          retryTime: 300 * (retryCount + 1),
        }),
      );
    }
    expect(lines).toEqual(
      [1, 2, 3].map((attempt) => ({
        time: '1970-01-01T00:00:00.000Z',
        level: 'warn',
        component: 'exporter.kafka',
        msg: `kafka: cannot reach broker 10.0.0.1:9092: connect ECONNREFUSED 10.0.0.1:9092 (attempt ${attempt}${attempt === 3 ? ', the last' : `, next in ${300 * attempt} ms`})`,
        broker: '10.0.0.1:9092',
        error: 'connect ECONNREFUSED 10.0.0.1:9092',
        attempt,
        ...(attempt === 3 ? {} : { retry_in_ms: 300 * attempt }),
      })),
    );
  });

  it('still reports a connection error that no retry line follows (a broker lost mid-run)', async () => {
    const { lines, log, entry } = setup();
    log(entry(1, 'Connection', { message: 'Connection error: read ECONNRESET', broker: 'k:9092' }));
    expect(lines).toEqual([]);
    await tick();
    expect(lines).toEqual([expect.objectContaining({ level: 'warn', msg: 'kafka: cannot reach broker k:9092: read ECONNRESET', broker: 'k:9092' })]);
  });

  it('logs a consumer crash caused by a lost connection as detail, and its restart as a warning', () => {
    const { lines, log, entry } = setup();
    log(entry(1, 'Consumer', { message: 'Crash: KafkaJSNumberOfRetriesExceeded: Connection error: connect ECONNREFUSED k:9092', groupId: 'g', retryCount: 3 }));
    log(entry(1, 'Consumer', { message: 'Restarting the consumer in 1270ms', groupId: 'g', retryTime: 1270 }));
    expect(lines).toEqual([expect.objectContaining({ level: 'warn', msg: 'kafka: Restarting the consumer in 1270ms', retry_in_ms: 1270 })]);
  });

  it('logs the broker pool retrying a connection the broker closed as a warning with its attempt, not an error', () => {
    const { lines, log, entry } = setup();
    log(entry(1, 'BrokerPool', { message: 'Closed connection', retryCount: 0, retryTime: 115 }));
    log(entry(1, 'Producer', { message: 'Closed connection' }));
    log(entry(1, 'Consumer', { message: 'Crash: KafkaJSNonRetriableError: Closed connection', groupId: 'lightning-control' }));
    expect(lines).toEqual([
      expect.objectContaining({ level: 'warn', msg: 'kafka: Closed connection', kafka_namespace: 'BrokerPool', attempt: 1, retry_in_ms: 115 }),
      expect.objectContaining({ level: 'error', msg: 'kafka: Closed connection', kafka_namespace: 'Producer' }),
    ]);
  });

  it("keeps kafkajs' notice about the idempotent producer's bounded retries out of warnings (the pipeline retries from the journal)", () => {
    const { lines, log, entry } = setup();
    log(entry(2, 'Producer', { message: 'Limiting retries for the idempotent producer may invalidate EoS guarantees' }));
    expect(lines).toEqual([]);
    const debug = setup('debug');
    debug.log(debug.entry(2, 'Producer', { message: 'Limiting retries for the idempotent producer may invalidate EoS guarantees' }));
    expect(debug.lines).toEqual([expect.objectContaining({ level: 'debug' })]);
  });

  it('keeps kafkajs levels (info as debug), a fixed set of snake_case fields and no stack traces', () => {
    const { lines, log, entry } = setup('debug');
    log(
      entry(1, 'Consumer', {
        message: 'Crash: KafkaJSNumberOfRetriesExceeded: boom',
        groupId: 'g',
        retryCount: 5,
        stack: 'KafkaJSError\n    at y',
        error: 'boom',
      }),
    );
    log(entry(2, 'Producer', { message: 'slow', topic: 't', unrelated: { big: true } }));
    log(entry(4, 'ConsumerGroup', { message: 'Consumer has joined the group', groupId: 'g', memberAssignment: { t: [0] } }));
    expect(lines).toEqual([
      {
        time: '1970-01-01T00:00:00.000Z',
        level: 'error',
        component: 'exporter.kafka',
        msg: 'kafka: Crash: KafkaJSNumberOfRetriesExceeded: boom',
        kafka_namespace: 'Consumer',
        group_id: 'g',
        error: 'boom',
        attempt: 6,
      },
      { time: '1970-01-01T00:00:00.000Z', level: 'warn', component: 'exporter.kafka', msg: 'kafka: slow', kafka_namespace: 'Producer', topic: 't' },
      {
        time: '1970-01-01T00:00:00.000Z',
        level: 'debug',
        component: 'exporter.kafka',
        msg: 'kafka: Consumer has joined the group',
        kafka_namespace: 'ConsumerGroup',
        group_id: 'g',
      },
    ]);
  });
});
