// Package tracing builds pdplane's OpenTelemetry tracer provider from its
// configuration and wraps the registry store so that its writes are spans.
//
// It owns:
//
//   - the exporter: OTLP over HTTP with protobuf bodies, to --otlp-endpoint
//     or to the endpoint the standard OTEL_EXPORTER_OTLP_ENDPOINT and
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variables name. With none of them
//     set, or OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none, tracing
//     is off: no exporter, no provider, and the packages that trace are
//     handed nil, which they take as "do nothing";
//   - the resource: service.name (pdplane unless OTEL_SERVICE_NAME says
//     otherwise), service.version, service.instance.id (the replica), and
//     whatever OTEL_RESOURCE_ATTRIBUTES adds;
//   - Store, the registry.Store whose writes (registrations, heartbeats,
//     stale marks, transfer failures, quarantines, sweeps) are spans, with
//     the heal step a heartbeat answer orders as a span event.
//
// The OpenTelemetry SDK and exporter read the other standard variables
// themselves: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (the sampler;
// parentbased_always_on by default), OTEL_BSP_* (the batch span processor),
// OTEL_EXPORTER_OTLP(_TRACES)_HEADERS, _TIMEOUT, _COMPRESSION, _INSECURE and
// _CERTIFICATE.
//
// It imports no pdplane package but registry. The router takes a
// trace.TracerProvider in its Config and never imports this package.
package tracing
