package router_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/sim"
)

// logLines is a zerolog writer that keeps the JSON lines written to it.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// take returns the lines written since the last take, decoded.
func (l *logLines) take(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	l.buf.Reset()
	return out
}

// minted matches the IDs registry.NewRequestID mints.
var minted = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestOneRequestIDEndToEnd runs the router behind the control plane, as
// cmd/pdplane wires them, and checks that each request has one ID: the
// client's when it is valid, else one minted ID, and that the answer's
// header, both upstream legs and the router's request log line all show
// that same ID.
func TestOneRequestIDEndToEnd(t *testing.T) {
	t.Parallel()
	p, d := loggedPair(t, registry.EngineVLLM)
	reg := newTestRegistry(t)
	for _, s := range []*sim.Sim{p, d} {
		spec, err := s.Spec(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		reg.register(t, spec)
	}
	logs := &logLines{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
	rt, err := router.New(router.Config{}, reg.mirror, reg.store, log.With().Str("component", "router").Logger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := server.New(server.Config{}, server.Deps{Store: reg.store, Snaps: reg.mirror, Registry: prometheus.NewRegistry(), Routes: rt}, log)
	if err != nil {
		t.Fatal(err)
	}

	// serve sends one completion through the whole handler with the given
	// X-Request-Id values (none when nil), and returns the ID the answer
	// carries after checking that the legs and the logs agree with it.
	// The router alone (no control plane, so no access log) applies the
	// same rule itself.
	alone := rt.Routes()
	serve := func(t *testing.T, h http.Handler, ids []string) string {
		t.Helper()
		logs.take(t)
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"sim-model","prompt":"once","max_tokens":3}`))
		req.Header.Set("Content-Type", "application/json")
		for _, id := range ids {
			req.Header.Add("X-Request-Id", id) // Add, not Set: no canonical check of the value
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		got := rec.Header().Values("X-Request-Id")
		if len(got) != 1 || !registry.ValidRequestID(got[0]) {
			t.Fatalf("answer X-Request-Id %q, want one valid ID", got)
		}
		id := got[0]
		pr, dr := p.Received(), d.Received()
		if len(pr) == 0 || len(dr) == 0 {
			t.Fatal("the legs were not received")
		}
		for _, leg := range []sim.Received{pr[len(pr)-1], dr[len(dr)-1]} {
			if v := leg.Header.Values("X-Request-Id"); len(v) != 1 || v[0] != id {
				t.Fatalf("%s leg got X-Request-Id %q, the answer %q", leg.Path, v, id)
			}
		}
		// One request line, the router's: the access log counts the
		// request but leaves the line to the router, which knows more.
		var lines []map[string]any
		for _, l := range logs.take(t) {
			rid, ok := l["request_id"]
			if !ok {
				continue
			}
			if rid != id {
				t.Fatalf("log line %v has request_id %v, the answer %q", l, rid, id)
			}
			if l["message"] == "request" {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || lines[0]["component"] != "router" {
			t.Fatalf("request %q: request log lines %v, want the router's alone", id, lines)
		}
		return id
	}

	t.Run("client ID kept", func(t *testing.T) {
		if id := serve(t, srv.Handler(), []string{"client-rid-7"}); id != "client-rid-7" {
			t.Fatalf("client ID replaced by %q", id)
		}
	})
	t.Run("one ID minted", func(t *testing.T) {
		a := serve(t, srv.Handler(), nil)
		b := serve(t, srv.Handler(), nil)
		if !minted.MatchString(a) || a == b {
			t.Fatalf("two requests share the minted ID %q", a)
		}
	})
	for name, bad := range map[string]string{
		"too long":  strings.Repeat("a", 129),
		"CR LF":     "abc\r\nX-Injected: 1",
		"LF":        "abc\ndef",
		"space":     "abc def",
		"non-ASCII": "abc\u00e9",
		"NUL":       "abc\x00",
		"empty":     "",
	} {
		t.Run("replaced: "+name, func(t *testing.T) {
			if id := serve(t, srv.Handler(), []string{bad}); !minted.MatchString(id) {
				t.Fatalf("malicious ID %q answered as %q, want a minted one", bad, id)
			}
		})
	}
	t.Run("router alone", func(t *testing.T) {
		if id := serve(t, alone, []string{"alone-rid"}); id != "alone-rid" {
			t.Fatalf("client ID replaced by %q", id)
		}
		if id := serve(t, alone, []string{"abc\r\ndef"}); !minted.MatchString(id) {
			t.Fatalf("malicious ID answered as %q", id)
		}
		if id := serve(t, alone, nil); !minted.MatchString(id) {
			t.Fatalf("no ID: answered %q", id)
		}
	})
	t.Run("longest kept", func(t *testing.T) {
		long := strings.Repeat("b", 128)
		if id := serve(t, srv.Handler(), []string{long}); id != long {
			t.Fatalf("a 128-byte ID replaced by %q", id)
		}
	})
}
