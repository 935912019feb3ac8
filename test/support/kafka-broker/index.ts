export { API, ERR, KafkaTestBroker, startKafkaTestBroker, type KafkaTestBrokerOptions } from './broker';
export type { StoredRecord } from './record-batch';
