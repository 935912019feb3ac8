/**
 * `exporters.kafka.prompt_ids: delta` (docs/kafka-records.md): what a transition that continues
 * the previous call of its episode carries instead of its full prompt ids, namely what its prompt
 * adds to that call's (first choice's) prompt and response. Written by the exporters, read back
 * by the trainer side.
 */
export interface PromptIdsDelta {
  previous_transition_id: string;
  /** Length of the previous prompt plus the previous response: a check. */
  prefix_length: number;
  suffix: number[];
}
