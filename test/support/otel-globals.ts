import { context, propagation, trace } from '@opentelemetry/api';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { registerInstrumentations } from '@opentelemetry/instrumentation';
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { NodeTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';

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

/**
 * An OTel-instrumented agent's tracing, as the e2e tests set it up: a NodeTracerProvider exporting
 * each span at once (SimpleSpanProcessor) over OTLP/HTTP protobuf to `tracesUrl`, registered
 * globally, with undici instrumentation so model calls carry `traceparent`. `stop()` undoes it all.
 */
export function startAgentTracing(serviceName: string, tracesUrl: string): { provider: NodeTracerProvider; stop: () => Promise<void> } {
  resetOtelGlobals();
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': serviceName }),
    spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url: tracesUrl }))],
  });
  provider.register();
  const unregister = registerInstrumentations({ tracerProvider: provider, instrumentations: [new UndiciInstrumentation()] });
  return {
    provider,
    async stop() {
      resetOtelGlobals();
      unregister();
      await provider.shutdown();
      trace.disable();
      context.disable();
    },
  };
}
