import type { Kafka, PartitionAssigner } from 'kafkajs';
import { loadConfig } from '../config/load';
import type { Config } from '../config/schema';
import { decodeEpisode, decodeTrajectory, decodeTransition, type Encoding } from '../exporters/kafka/encoding';
import { createKafkaClient, kafkaClientOptions, kafkajs } from '../exporters/kafka/kafkajs-producer';
import type { EpisodeSummary, Trajectory } from '../model/records';
import { createLogger, type Logger } from '../telemetry/logger';
import { headerValue, type WholeRecord } from '../trainer/chunk-reassembly';
import type { WireTransition } from '../trainer/prompt-delta';
import type { CliIo } from './command';

/** Config for a Kafka command: `--config` (or $LIGHTNING_CONFIG), env, then `--brokers`/`--topic`. */
export function kafkaCommandConfig(values: { config?: string; brokers?: string; topic?: string }, io: CliIo): Config {
  const kafka: Record<string, unknown> = {};
  if (values.brokers !== undefined)
    kafka.brokers = values.brokers
      .split(',')
      .map((b) => b.trim())
      .filter((b) => b.length > 0);
  if (values.topic !== undefined) kafka.topic = values.topic;
  return loadConfig({ file: values.config ?? (io.env.LIGHTNING_CONFIG || undefined), env: io.env, overrides: { exporters: { kafka } } });
}

/** A kafkajs client with the exporter's connection settings whose logs go through our logger, on stderr. */
export function kafkaForCommand(config: Config, command: string, io: CliIo): { kafka: Kafka; logger: Logger } {
  const logger = createLogger({ level: config.service.log_level, component: command, write: (line) => io.err.write(line) });
  return { kafka: createKafkaClient(kafkaClientOptions(config.exporters.kafka, `lightning-sidecar-${command}`), logger), logger };
}

export function encodingOf(record: WholeRecord): Encoding {
  return headerValue(record.headers, 'content-type') === 'application/x-protobuf' ? 'protobuf' : 'json';
}

export function decodeTransitionRecord(record: WholeRecord): WireTransition {
  return decodeTransition(record.value, encodingOf(record));
}

export function decodeEpisodeRecord(record: WholeRecord): EpisodeSummary {
  return decodeEpisode(record.value, encodingOf(record));
}

export function decodeTrajectoryRecord(record: WholeRecord): Trajectory {
  return decodeTrajectory(record.value, encodingOf(record));
}

/**
 * Partition `p` of every subscribed topic goes to the same member (the members sorted by id,
 * partition `p` to member `p mod N`): a consumer that owns a group's trajectories (or transitions)
 * owns its episodes too, since the sidecar keys all of a group's records alike and equal keys land
 * on equal partition numbers of topics with as many partitions (docs/kafka-records.md#consumer-groups).
 */
export const coPartitionedAssigner: PartitionAssigner = ({ cluster }) => ({
  name: 'LightningCoPartitioned',
  version: 0,
  async assign({ members, topics }) {
    const { MemberAssignment } = kafkajs().AssignerProtocol;
    const sorted = members.map((m) => m.memberId).sort();
    const assignment = new Map<string, Record<string, number[]>>(sorted.map((id) => [id, {}]));
    for (const topic of topics) {
      for (const { partitionId } of cluster.findTopicPartitionMetadata(topic)) {
        const member = assignment.get(sorted[partitionId % sorted.length])!;
        (member[topic] ??= []).push(partitionId);
      }
    }
    return sorted.map((memberId) => ({
      memberId,
      memberAssignment: MemberAssignment.encode({ version: 0, assignment: assignment.get(memberId)!, userData: Buffer.alloc(0) }),
    }));
  },
  protocol({ topics }) {
    const { MemberMetadata } = kafkajs().AssignerProtocol;
    return { name: 'LightningCoPartitioned', metadata: MemberMetadata.encode({ version: 0, topics, userData: Buffer.alloc(0) }) };
  },
});
