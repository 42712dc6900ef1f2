package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ServiceName is the service.name pdplane's spans carry unless
// OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names another.
const ServiceName = "pdplane"

// tracesPath is where an OTLP/HTTP collector takes traces.
const tracesPath = "/v1/traces"

// Config says where traces go and what the process is.
type Config struct {
	// Endpoint is the OTLP/HTTP collector's base URL (--otlp-endpoint),
	// such as http://otel-collector:4318; /v1/traces is appended when it
	// has no path, as for OTEL_EXPORTER_OTLP_ENDPOINT. Empty leaves the
	// endpoint to the OTEL_EXPORTER_OTLP_* variables, and tracing off when
	// they name none.
	Endpoint string
	// Version is service.version.
	Version string
	// Replica is service.instance.id: which replica of the control plane
	// (or which agent) made the span.
	Replica string
	// Getenv reads the environment; os.Getenv when nil.
	Getenv func(string) string
}

// Provider is the process's tracer provider, or nothing when tracing is off.
// The zero value and nil are off.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// New builds the provider Config asks for. When tracing is off it returns
// an off Provider and builds no exporter.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	endpoint, on, err := cfg.endpoint()
	if err != nil || !on {
		return &Provider{}, err
	}
	var opts []otlptracehttp.Option
	if endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := cfg.resource(ctx)
	if err != nil {
		return nil, err
	}
	// No sampler option: the SDK then reads OTEL_TRACES_SAMPLER(_ARG).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{tp: tp}, nil
}

// endpoint returns the exporter's URL from --otlp-endpoint ("" leaves it to
// the exporter's variables) and whether tracing is on.
func (c *Config) endpoint() (string, bool, error) {
	if strings.EqualFold(strings.TrimSpace(c.Getenv("OTEL_SDK_DISABLED")), "true") ||
		strings.EqualFold(strings.TrimSpace(c.Getenv("OTEL_TRACES_EXPORTER")), "none") {
		return "", false, nil
	}
	if c.Endpoint == "" {
		on := c.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || c.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
		return "", on, nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false, fmt.Errorf("--otlp-endpoint %q: want an http or https URL such as http://otel-collector:4318", c.Endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = tracesPath
	}
	return u.String(), true, nil
}

// resource describes the process: pdplane's defaults, overridden by
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
func (c *Config) resource(ctx context.Context) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", ServiceName)}
	if c.Version != "" {
		attrs = append(attrs, attribute.String("service.version", c.Version))
	}
	if c.Replica != "" {
		attrs = append(attrs, attribute.String("service.instance.id", c.Replica))
	}
	own := resource.NewSchemaless(attrs...)
	env, err := resource.New(ctx, resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	merged, err := resource.Merge(own, env)
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	return merged, nil
}

// Enabled reports whether spans are exported.
func (p *Provider) Enabled() bool { return p != nil && p.tp != nil }

// TracerProvider is what the packages that trace are handed: nil when
// tracing is off, so that they skip every span.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if !p.Enabled() {
		return nil
	}
	return p.tp
}

// Shutdown exports the spans still buffered and stops the exporter, within
// ctx. It does nothing when tracing is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// ContinueTrace returns next, run in the trace context of the caller's
// W3C traceparent and tracestate headers when tp is set, so that the spans
// a request causes (registry writes) join the caller's trace; with tp nil
// (tracing off) it returns next itself.
func ContinueTrace(next http.Handler, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		return next
	}
	var tc propagation.TraceContext
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Traceparent") != "" {
			r = r.WithContext(tc.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		}
		next.ServeHTTP(w, r)
	})
}
