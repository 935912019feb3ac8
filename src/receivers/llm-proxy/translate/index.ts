/**
 * Translation between the APIs agents speak (OpenAI Responses, Anthropic Messages) and chat
 * completions, the route on which vLLM and SGLang return token ids. Pure functions and
 * stream state machines: no I/O.
 */
export { responsesToChatRequest, type ResponsesContext, type ResponsesRequestTranslation } from './responses-request';
export { chatToResponsesResponse, chatErrorToResponsesError, type ResponsesAnswerTranslation } from './responses-response';
export { ChatStreamToResponsesEvents } from './responses-stream';
export { anthropicToChatRequest, type AnthropicContext, type AnthropicRequestTranslation } from './anthropic-request';
export { chatToAnthropicResponse, chatErrorToAnthropicError, type AnthropicAnswerTranslation } from './anthropic-response';
export { ChatStreamToAnthropicEvents } from './anthropic-stream';
