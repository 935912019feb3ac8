import { SpanStatusCode, type Tracer } from '@opentelemetry/api';

/**
 * The tool span the sidecar reads: an OTel GenAI `execute_tool` span around the tool's code. The
 * sidecar joins it to the model call that asked for the tool by `gen_ai.tool.call.id` (or, without
 * it, by trace and tool name) and turns its status into an AIR reward: a thrown error marks the
 * span ERROR, which the default rules price at -0.5; a success at +0.1.
 */
export async function executeTool(tracer: Tracer, name: string, callId: string | undefined, run: () => string | Promise<string>): Promise<string> {
  const attributes = { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': name, ...(callId ? { 'gen_ai.tool.call.id': callId } : {}) };
  return tracer.startActiveSpan(`execute_tool ${name}`, { attributes }, async (span) => {
    try {
      return await run();
    } catch (err) {
      span.recordException(err as Error);
      span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
      return `error: ${(err as Error).message}`;
    } finally {
      span.end();
    }
  });
}

/** The one tool every example offers: `a + b`, `a - b`, `a * b` or `a / b`. */
export function calculator(expression: string): string {
  const m = /^\s*(-?[\d.]+)\s*([-+*/])\s*(-?[\d.]+)\s*$/.exec(expression);
  if (!m) throw new Error(`cannot evaluate ${JSON.stringify(expression)}`);
  const [a, b] = [Number(m[1]), Number(m[3])];
  return String(m[2] === '+' ? a + b : m[2] === '-' ? a - b : m[2] === '*' ? a * b : a / b);
}
