package router_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
	"github.com/pdplane/pdplane/tracing"
	"github.com/pdplane/pdplane/tracing/tracingtest"
)

// clientTraceparent is a W3C traceparent a client sends: its trace is the
// one the router's spans must continue.
const (
	clientTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientParentID    = "00f067aa0ba902b7"
	clientTraceparent = "00-" + clientTraceID + "-" + clientParentID + "-01"
)

// tracedSims starts sims that log what they receive, and a router that
// exports its spans to an in-process OTLP/HTTP receiver. flush exports
// the spans still buffered (the provider's shutdown, as at exit).
func tracedSims(t *testing.T, engine registry.Engine, cfg router.Config, roles ...registry.Role) (b *bundle, sims []*sim.Sim, rcv *tracingtest.Receiver, flush func()) {
	t.Helper()
	rcv = tracingtest.Start(t)
	prov, err := tracing.New(context.Background(), tracing.Config{Endpoint: rcv.URL, Version: "test", Replica: "r1",
		Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if !prov.Enabled() {
		t.Fatal("tracing with an endpoint is off")
	}
	names := map[registry.Role]int{}
	for _, role := range roles {
		c := simtest.Config(string(role)+"-"+string(rune('0'+names[role])), role, engine)
		names[role]++
		c.LogRequests = true
		sims = append(sims, simtest.Start(t, c))
	}
	cfg.TracerProvider = prov.TracerProvider()
	b = setupSims(t, cfg, sims...)
	flush = func() {
		t.Helper()
		if err := prov.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return b, sims, rcv, flush
}

// traceparentTraceID is the trace ID of a traceparent header.
func traceparentTraceID(t *testing.T, h string) (traceID, parentID string) {
	t.Helper()
	parts := strings.Split(h, "-")
	if len(parts) != 4 || parts[0] != "00" {
		t.Fatalf("traceparent %q is not W3C version 00", h)
	}
	return parts[1], parts[2]
}

// TestTraceOfOnePDRequest: one P/D request is one trace, continuing the
// client's: the router's server span, one attempt under it, a prefill and
// a decode span under that with the peer, URL and status; and each engine
// received a traceparent of that trace whose parent is its leg's span, so
// that the engines' own spans join the same trace.
func TestTraceOfOnePDRequest(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			b, sims, rcv, flush := tracedSims(t, engine, router.Config{}, registry.RolePrefill, registry.RoleDecode)
			resp, body := b.post(t, "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`,
				"Traceparent", clientTraceparent, "X-Request-Id", "trace-test-1")
			if resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			flush()
			spans := rcv.Spans()

			traces := map[string]bool{}
			for _, s := range spans {
				traces[s.TraceID] = true
			}
			if len(traces) != 1 || !traces[clientTraceID] {
				t.Fatalf("trace IDs %v, want only the client's %s", traces, clientTraceID)
			}
			roots := tracingtest.Named(spans, "POST /v1/chat/completions")
			if len(roots) != 1 {
				t.Fatalf("%d request spans, want 1: %+v", len(roots), spans)
			}
			root := roots[0]
			if root.ParentSpanID != clientParentID {
				t.Errorf("request span's parent %s, want the client's span %s", root.ParentSpanID, clientParentID)
			}
			for k, want := range map[string]string{"pdplane.request_id": "trace-test-1", "http.response.status_code": "200",
				"pdplane.outcome": "ok", "pdplane.model": "sim-model", "pdplane.attempts": "1",
				"pdplane.prefill": "prefill-0", "pdplane.decode": "decode-0"} {
				if root.Attrs[k] != want {
					t.Errorf("request span %s = %q, want %q", k, root.Attrs[k], want)
				}
			}
			if root.Resource["service.name"] != "pdplane" || root.Resource["service.instance.id"] != "r1" || root.Resource["service.version"] != "test" {
				t.Errorf("resource %v", root.Resource)
			}
			attempts := tracingtest.Children(spans, root)
			if len(attempts) != 1 || attempts[0].Name != "attempt" || attempts[0].Attrs["pdplane.attempt"] != "1" ||
				attempts[0].Attrs["pdplane.retry"] != "false" || attempts[0].Attrs["pdplane.pair"] != "prefill-0/decode-0" {
				t.Fatalf("request span's children %+v, want one first attempt on prefill-0/decode-0", attempts)
			}
			legs := map[string]tracingtest.Span{}
			for _, s := range tracingtest.Children(spans, attempts[0]) {
				legs[s.Name] = s
			}
			if len(legs) != 2 {
				t.Fatalf("attempt's children %v, want a prefill and a decode span", legs)
			}
			for i, name := range []string{"prefill", "decode"} {
				leg, ok := legs[name]
				if !ok {
					t.Fatalf("no %s span under the attempt: %v", name, legs)
				}
				if leg.StatusError || leg.Attrs["http.response.status_code"] != "200" ||
					leg.Attrs["pdplane.peer.name"] != name+"-0" || !strings.HasPrefix(leg.Attrs["url.full"], sims[i].URL()) {
					t.Errorf("%s span %+v", name, leg)
				}
				got := sims[i].Received()
				if len(got) != 1 {
					t.Fatalf("%s received %d requests", name, len(got))
				}
				tid, pid := traceparentTraceID(t, got[0].Header.Get("Traceparent"))
				if tid != clientTraceID || pid != leg.SpanID {
					t.Errorf("%s received traceparent of trace %s parent %s, want trace %s parent %s (its leg span)", name, tid, pid, clientTraceID, leg.SpanID)
				}
			}
			if legs["decode"].Attrs["http.response.body.size"] == "" || legs["decode"].Attrs["http.response.body.size"] == "0" {
				t.Errorf("decode span has no body size: %v", legs["decode"].Attrs)
			}
		})
	}
}

// TestTraceShowsRetry: a request whose first pair fails shows two attempt
// spans under its request span: the first failed on the prefill leg, the
// second a retry after it, which delivered.
func TestTraceShowsRetry(t *testing.T) {
	t.Parallel()
	b, sims, rcv, flush := tracedSims(t, registry.EngineSGLang, router.Config{PrefillPolicy: router.PolicyRoundRobin},
		registry.RolePrefill, registry.RolePrefill, registry.RoleDecode)
	setFault(t, sims[0], sim.FaultPrefillError)
	// Round robin reaches prefill-0 within two requests.
	for range 2 {
		if resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	flush()
	spans := rcv.Spans()
	var retried []tracingtest.Span
	for _, root := range tracingtest.Named(spans, "POST /v1/completions") {
		if root.Attrs["pdplane.attempts"] == "2" {
			retried = append(retried, root)
		}
	}
	if len(retried) == 0 {
		t.Fatalf("no request span with two attempts: %+v", spans)
	}
	byNumber := map[string]tracingtest.Span{}
	for _, s := range tracingtest.Children(spans, retried[0]) {
		byNumber[s.Attrs["pdplane.attempt"]] = s
	}
	first, second := byNumber["1"], byNumber["2"]
	if len(byNumber) != 2 || first.Name != "attempt" || second.Name != "attempt" {
		t.Fatalf("children of the retried request %+v, want attempts 1 and 2", byNumber)
	}
	if !first.StatusError || first.Attrs["pdplane.failure"] != "status" || first.Attrs["pdplane.failure.leg"] != "prefill" ||
		first.Attrs["pdplane.prefill"] != "prefill-0" {
		t.Errorf("first attempt %+v, want a prefill status failure on prefill-0", first)
	}
	if second.StatusError || second.Attrs["pdplane.retry"] != "true" || second.Attrs["pdplane.retry.after_failure"] != "status" ||
		second.Attrs["pdplane.prefill"] != "prefill-1" {
		t.Errorf("second attempt %+v, want a retry on prefill-1 after a status failure", second)
	}
	var failedPrefill bool
	for _, s := range tracingtest.Children(spans, first) {
		if s.Name == "prefill" && s.StatusError && s.Attrs["http.response.status_code"] == "500" {
			failedPrefill = true
		}
	}
	if !failedPrefill {
		t.Errorf("the first attempt has no failed prefill span: %+v", tracingtest.Children(spans, first))
	}
}

// TestNoTracingPassesTraceparentOn: with tracing off the router makes no
// spans and hands the client's traceparent and tracestate to both engines
// unchanged.
func TestNoTracingPassesTraceparentOn(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.LogRequests = true })
	b := setupSims(t, router.Config{}, p, d)
	if resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":2}`,
		"Traceparent", clientTraceparent, "Tracestate", "vendor=1"); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, s := range []*sim.Sim{p, d} {
		got := s.Received()
		if len(got) != 1 || got[0].Header.Get("Traceparent") != clientTraceparent || got[0].Header.Get("Tracestate") != "vendor=1" {
			t.Fatalf("%s received %+v", s.Config().Name, got)
		}
	}
}
