package tracing_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/tracing"
	"github.com/pdplane/pdplane/tracing/tracingtest"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestTracingOffBuildsNothing: without an endpoint from the flag or the
// standard variables, or with the SDK disabled, no exporter or provider is
// built and the wrappers hand back what they were given.
func TestTracingOffBuildsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  tracing.Config
		on   bool
	}{
		{"no endpoint", tracing.Config{Getenv: env()}, false},
		{"flag", tracing.Config{Endpoint: "http://127.0.0.1:4318", Getenv: env()}, true},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", tracing.Config{Getenv: env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")}, true},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", tracing.Config{Getenv: env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")}, true},
		{"OTEL_SDK_DISABLED", tracing.Config{Endpoint: "http://c:4318", Getenv: env("OTEL_SDK_DISABLED", "true")}, false},
		{"OTEL_TRACES_EXPORTER=none", tracing.Config{Endpoint: "http://c:4318", Getenv: env("OTEL_TRACES_EXPORTER", "none")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := tracing.New(context.Background(), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
			if p.Enabled() != tc.on || (p.TracerProvider() != nil) != tc.on {
				t.Fatalf("enabled %v, provider %v; want on=%v", p.Enabled(), p.TracerProvider(), tc.on)
			}
			if tc.on {
				return
			}
			s := memstore.New(memstore.Config{})
			if got := tracing.NewStore(s, p.TracerProvider()); got != registry.Store(s) {
				t.Errorf("NewStore wrapped the store with tracing off: %T", got)
			}
			h := &http.ServeMux{}
			if got := tracing.ContinueTrace(h, p.TracerProvider()); got != http.Handler(h) {
				t.Errorf("ContinueTrace wrapped the handler with tracing off: %T", got)
			}
		})
	}
}

// TestEndpointFlagRefusesNonURL: --otlp-endpoint must be an http(s) URL,
// and the error names the flag.
func TestEndpointFlagRefusesNonURL(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"collector:4318", "grpc://c:4317", "http://"} {
		_, err := tracing.New(context.Background(), tracing.Config{Endpoint: bad, Getenv: env()})
		if err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
			t.Errorf("%q: %v, want an error naming --otlp-endpoint", bad, err)
		}
	}
}

// TestStandardVariablesReachTheCollector: OTEL_EXPORTER_OTLP_ENDPOINT alone
// turns tracing on and sends spans there, and OTEL_SERVICE_NAME renames
// the service. (t.Setenv: the exporter reads the process's environment.)
func TestStandardVariablesReachTheCollector(t *testing.T) {
	rcv := tracingtest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "pdplane-eu")
	p, err := tracing.New(context.Background(), tracing.Config{Version: "v9", Replica: "r2"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "one")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	if len(spans) != 1 || spans[0].Name != "one" {
		t.Fatalf("received %+v", spans)
	}
	if r := spans[0].Resource; r["service.name"] != "pdplane-eu" || r["service.version"] != "v9" || r["service.instance.id"] != "r2" {
		t.Errorf("resource %v", r)
	}
}

// TestStoreWritesAreSpans: registrations and stale marks are spans, in the
// trace of the context they are made in; a heartbeat is a span only when
// it is a heal step (here: the stale decode told to re-register), not
// while the peer stays as it is.
func TestStoreWritesAreSpans(t *testing.T) {
	t.Parallel()
	rcv := tracingtest.Start(t)
	p, err := tracing.New(context.Background(), tracing.Config{Endpoint: rcv.URL, Getenv: env()})
	if err != nil {
		t.Fatal(err)
	}
	store := tracing.NewStore(memstore.New(memstore.Config{}), p.TracerProvider())
	defer store.Close()
	ctx, parent := p.TracerProvider().Tracer("test").Start(context.Background(), "operator request")
	res, err := store.Register(ctx, registrytest.Spec("decode-0", registry.RoleDecode), registry.Claim{Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Peer.ID
	hb := registry.Heartbeat{PeerID: id, InstanceID: res.Peer.InstanceID}
	for range 3 { // pending → ready, then ready twice: no heal step
		if _, err := store.Heartbeat(context.Background(), hb); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.MarkStale(ctx, id, "test", "Missing NIXL destination KV memory kind"); err != nil {
		t.Fatal(err)
	}
	reply, err := store.Heartbeat(context.Background(), hb)
	if err != nil {
		t.Fatal(err)
	}
	parent.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	reg := tracingtest.Named(spans, "registry.register")
	stale := tracingtest.Named(spans, "registry.mark_stale")
	if len(reg) != 1 || reg[0].Attrs["pdplane.peer.name"] != "decode-0" || reg[0].Attrs["pdplane.peer.id"] != id ||
		reg[0].ParentSpanID != parent.SpanContext().SpanID().String() {
		t.Errorf("register spans %+v, want one under the caller's span", reg)
	}
	if len(stale) != 1 || stale[0].TraceID != parent.SpanContext().TraceID().String() {
		t.Errorf("mark_stale spans %+v, want one in the caller's trace", stale)
	}
	var steps []tracingtest.Span
	for _, s := range spans {
		if strings.HasPrefix(s.Name, "registry.heal_step.") || s.Name == "registry.heartbeat" {
			steps = append(steps, s)
		}
	}
	want := "registry.heal_step." + string(reply.Action)
	if reply.Action == registry.ActionNone {
		t.Fatalf("a stale peer's heartbeat answered %+v, want a heal step", reply)
	}
	if len(steps) != 1 || steps[0].Name != want || steps[0].Attrs["pdplane.peer.previous_state"] != string(registry.StateReady) ||
		steps[0].Attrs["pdplane.peer.state"] != string(reply.State) {
		t.Errorf("heartbeat spans %+v, want one %s from ready", steps, want)
	}
}
