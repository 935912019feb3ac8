import { context, propagation, trace } from '@opentelemetry/api';

/**
 * The OTel API keeps its global tracer provider, context manager and propagator on `globalThis`,
 * which outlives a test file in a reused jest worker. Files that register globals call this before
 * registering and after their tests, so each starts from a clean API.
 */
export function resetOtelGlobals(): void {
  trace.disable();
  context.disable();
  propagation.disable();
}
