import { SpanStatusCode, type Tracer } from '@opentelemetry/api';

/**
 * Runs a tool inside an OTel GenAI `execute_tool` span, as an instrumented agent does: a thrown
 * error marks the span ERROR (with the exception recorded) and becomes the tool's result text.
 * `extra` attributes go on the span too (e.g. `lightning.rollout_id` for a tracer with no context).
 */
export function inToolSpan(tracer: Tracer, name: string, callId: string | null | undefined, fn: () => string, extra: Record<string, string> = {}): string {
  const attributes = { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': name, ...(callId ? { 'gen_ai.tool.call.id': callId } : {}), ...extra };
  return tracer.startActiveSpan(`execute_tool ${name}`, { attributes }, (span) => {
    try {
      return fn();
    } catch (err) {
      span.recordException(err as Error);
      span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
      return `error: ${(err as Error).message}`;
    } finally {
      span.end();
    }
  });
}
