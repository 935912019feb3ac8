export { classifySpan, type RewardInfo, type SpanClass, type ToolOutcome, type ToolSpanInfo } from './classify';
export { spanAttribution, type RolloutAttribution } from './attribution';
