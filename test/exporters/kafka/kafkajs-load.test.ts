import { execFileSync } from 'node:child_process';
import path from 'node:path';

const ROOT = path.join(__dirname, '../../..');

/** Whether any of kafkajs' files is in `require.cache` after `script` ran in a fresh process (the built modules). */
function kafkajsLoaded(script: string): boolean {
  const out = execFileSync(
    process.execPath,
    ['-e', `${script}; process.stdout.write(String(Object.keys(require.cache).some((f) => f.includes('/node_modules/kafkajs/'))))`],
    { cwd: ROOT, encoding: 'utf8' },
  );
  return out === 'true';
}

describe('kafkajs is loaded only for a Kafka client', () => {
  it('is not loaded by the command line and the service (a sidecar exporting to files)', () => {
    expect(kafkajsLoaded("require('./dist/cli/program.js'); require('./dist/service/app.js')")).toBe(false);
  });

  it('is loaded when a Kafka client is made', () => {
    const script = `const k = require('./dist/exporters/kafka/kafkajs-producer.js');
      k.createKafkaClient({ brokers: ['127.0.0.1:9'], clientId: 't', compression: 'none', connectionTimeoutMs: 100, requestTimeoutMs: 100 }, { child: () => null, debug() {}, info() {}, warn() {}, error() {} })`;
    expect(kafkajsLoaded(script)).toBe(true);
  });
});
