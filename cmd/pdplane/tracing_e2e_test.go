//go:build linux

package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/tracing/tracingtest"
)

// TestDevExportsTraces runs `pdplane dev --otlp-endpoint` against an
// in-process OTLP/HTTP receiver: one P/D chat completion carrying a
// client's traceparent is one trace under the client's span, with the
// router's request span, its attempt, and a prefill and a decode span; the
// agents' registrations are spans of the same service; and what was
// buffered reaches the receiver by the time the process exits on SIGTERM.
func TestDevExportsTraces(t *testing.T) {
	t.Parallel()
	const traceID, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	rcv := tracingtest.Start(t)
	addr := bench.FreeAddr(t)
	p := startProcess(t, "dev-traced", "dev", "--addr", addr, "--otlp-endpoint", rcv.URL, "--replica", "r-e2e")
	base := "http://" + addr
	waitHTTP(t, base+"/readyz", 30*time.Second)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %d", resp.StatusCode)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("dev did not exit within 20s of SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM, want 0", code)
	}

	var trace []tracingtest.Span
	registrations := 0
	for _, s := range rcv.Spans() {
		if s.Resource["service.name"] != "pdplane" || s.Resource["service.instance.id"] != "r-e2e" {
			t.Errorf("span %s from resource %v", s.Name, s.Resource)
		}
		if s.TraceID == traceID {
			trace = append(trace, s)
		}
		if s.Name == "registry.register" {
			registrations++
		}
	}
	if registrations < 2 {
		t.Errorf("%d registry.register spans, want one per sim at least", registrations)
	}
	roots := tracingtest.Named(trace, "POST /v1/chat/completions")
	if len(roots) != 1 || roots[0].ParentSpanID != clientSpan {
		t.Fatalf("request spans of the trace %+v, want one under the client's span", roots)
	}
	attempts := tracingtest.Children(trace, roots[0])
	if len(attempts) != 1 || attempts[0].Name != "attempt" {
		t.Fatalf("children of the request span %+v, want one attempt", attempts)
	}
	legs := map[string]bool{}
	for _, s := range tracingtest.Children(trace, attempts[0]) {
		legs[s.Name] = true
	}
	if !legs["prefill"] || !legs["decode"] || len(legs) != 2 {
		t.Errorf("children of the attempt %v, want prefill and decode", legs)
	}
}
