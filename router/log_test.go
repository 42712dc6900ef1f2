package router_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/sim"
)

// The router's logs behind the control plane: one request line per request,
// no key twice, and one request ID from the answer to the legs and the logs.

// logLines is a zerolog writer that keeps the lines written to it.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// take returns the lines written since the last take, as written.
func (l *logLines) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSpace(l.buf.String())
	l.buf.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// takeDecoded returns the lines written since the last take, decoded.
func (l *logLines) takeDecoded(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range l.take() {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// controlPlane registers the sims with a test registry and serves a router
// built with cfg behind the control plane, as serve wires them: both
// register their metrics with prom and log to log, each as its component.
func controlPlane(t *testing.T, cfg router.Config, prom *prometheus.Registry, log zerolog.Logger, sims ...*sim.Sim) (*router.Router, *server.Server) {
	t.Helper()
	reg := newTestRegistry(t)
	for _, s := range sims {
		reg.registerSim(t, s)
	}
	rt, err := router.New(cfg, reg.mirror, reg.store, log.With().Str("component", "router").Logger(), prom)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := server.New(server.Config{}, server.Deps{Store: reg.store, Snaps: reg.mirror, Registry: prom, Routes: rt},
		log.With().Str("component", "server").Logger())
	if err != nil {
		t.Fatal(err)
	}
	return rt, srv
}

// loggedControlPlane is controlPlane logging at debug level to the returned
// lines.
func loggedControlPlane(t *testing.T, cfg router.Config, sims ...*sim.Sim) (*router.Router, *server.Server, *logLines) {
	t.Helper()
	logs := &logLines{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	rt, srv := controlPlane(t, cfg, prometheus.NewRegistry(), log, sims...)
	return rt, srv, logs
}

// duplicateKeys walks a JSON value token by token and returns the keys that
// appear twice in one object (encoding/json's decoding would keep the last
// silently).
func duplicateKeys(line string) ([]string, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	var dups []string
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				if seen[key] {
					dups = append(dups, key)
				}
				seen[key] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token() // '}'
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ']'
			return err
		}
		return nil
	}
	if err := walk(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the value: %v", err)
	}
	return dups, nil
}

func TestDuplicateKeys(t *testing.T) {
	t.Parallel()
	if d, err := duplicateKeys(`{"a":1,"b":{"a":2,"c":[{"d":1,"d":2}]},"a":3}`); err != nil || strings.Join(d, ",") != "d,a" {
		t.Fatalf("duplicates %v, %v", d, err)
	}
}

// TestOneRequestLogLine: through the control plane, with the loggers serve
// gives the server and the router, a generation request — served, retried
// or refused — logs exactly one "request" line; no line has a key twice
// (component used to be); durations are in milliseconds, named so.
func TestOneRequestLogLine(t *testing.T) {
	t.Parallel()
	s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{
		"p1": registry.RolePrefill, "p2": registry.RolePrefill, "d1": registry.RoleDecode,
	})
	setFault(t, s["p1"], sim.FaultPrefillError)
	_, srv, logs := loggedControlPlane(t, router.Config{PrefillPolicy: router.PolicyRoundRobin, APIKeys: []string{"k"}}, s["p1"], s["p2"], s["d1"])

	send := func(key, body string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	const chat = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	logs.take()
	retried := false // a served request's line names the attempt that failed before it
	for i, tc := range []struct {
		key, body string
		status    int
	}{
		{"k", chat, http.StatusOK}, // p1 or p2 first: retried on p2 when p1
		{"k", chat, http.StatusOK}, // the other
		{"wrong", chat, http.StatusUnauthorized},
		{"k", `{"model":"sim-model","messages":"nope"}`, http.StatusBadRequest},
		{"k", `{"model":"gone","messages":[{"role":"user","content":"hi"}]}`, http.StatusNotFound},
	} {
		if got := send(tc.key, tc.body); got != tc.status {
			t.Fatalf("request %d: status %d, want %d", i, got, tc.status)
		}
		var requestLines []map[string]any
		for _, line := range logs.take() {
			if dups, err := duplicateKeys(line); err != nil || len(dups) > 0 {
				t.Fatalf("request %d: log line %s: duplicate keys %v (%v)", i, line, dups, err)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			if _, ok := m["duration"]; ok {
				t.Fatalf("request %d: a duration without its unit: %s", i, line)
			}
			if m["message"] == "request" {
				requestLines = append(requestLines, m)
			}
		}
		if len(requestLines) != 1 {
			t.Fatalf("request %d: %d request lines, want 1: %v", i, len(requestLines), requestLines)
		}
		l := requestLines[0]
		if l["component"] != "router" || l["request_id"] == nil || l["route"] != "chat_completions" || l["status"] != float64(tc.status) {
			t.Fatalf("request %d: request line %v", i, l)
		}
		if tc.status != http.StatusUnauthorized {
			if ms, ok := l["duration_ms"].(float64); !ok || ms < 0 {
				t.Fatalf("request %d: duration_ms %v", i, l["duration_ms"])
			}
		}
		if tc.status == http.StatusOK {
			if l["prefill"] != "p2" || l["prefill_generation"] != float64(1) || l["decode_generation"] != float64(1) {
				t.Fatalf("request %d: the pair that served it: %v", i, l)
			}
			if f, ok := l["failed_attempts"].([]any); ok {
				retried = len(f) == 1 && f[0] == "status:p1>d1"
			}
		}
	}
	if !retried {
		t.Fatal("no request line named the attempt on p1 that failed before it (failed_attempts)")
	}
}

// minted matches the IDs pdproto.NewRequestID mints.
var minted = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestOneRequestIDEndToEnd runs the router behind the control plane, as
// cmd/pdplane wires them, and checks that each request has one ID: the
// client's when it is valid, else one minted ID, and that the answer's
// header, both upstream legs and the router's request log line all show
// that same ID.
func TestOneRequestIDEndToEnd(t *testing.T) {
	t.Parallel()
	p, d := loggedPair(t, registry.EngineVLLM)
	rt, srv, logs := loggedControlPlane(t, router.Config{}, p, d)

	// serve sends one completion through the whole handler with the given
	// X-Request-Id values (none when nil), and returns the ID the answer
	// carries after checking that the legs and the logs agree with it.
	// The router alone (no control plane, so no access log) applies the
	// same rule itself.
	alone := rt.Routes()
	serve := func(t *testing.T, h http.Handler, ids []string) string {
		t.Helper()
		logs.take()
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
		if len(got) != 1 || !pdproto.ValidRequestID(got[0]) {
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
		for _, l := range logs.takeDecoded(t) {
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

// TestLogServedEverySamplesServedRequests: with LogServedEvery 3, one
// served request in three gets its "request" line at info level, marked
// sampled_1_in=3, the others at debug; a request that is not served is at
// info or above whatever the sampling.
func TestLogServedEverySamplesServedRequests(t *testing.T) {
	t.Parallel()
	s := startSimsOf(t, registry.EngineSGLang, map[string]registry.Role{"p": registry.RolePrefill, "d": registry.RoleDecode})
	_, srv, logs := loggedControlPlane(t, router.Config{LogServedEvery: 3}, s["p"], s["d"])
	send := func(body string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	const chat = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	logs.take()
	var levels []string
	for i := range 6 {
		if got := send(chat); got != http.StatusOK {
			t.Fatalf("request %d: status %d", i, got)
		}
		for _, l := range logs.takeDecoded(t) {
			if l["message"] != "request" {
				continue
			}
			levels = append(levels, fmt.Sprint(l["level"]))
			if sampled := l["sampled_1_in"]; (l["level"] == "info") != (sampled == float64(3)) {
				t.Fatalf("request %d: level %v with sampled_1_in %v", i, l["level"], sampled)
			}
		}
	}
	if got := strings.Join(levels, ","); got != "debug,debug,info,debug,debug,info" {
		t.Fatalf("served request lines at levels %s, want one in three at info", got)
	}
	if got := send(`{"model":"sim-model","messages":"nope"}`); got != http.StatusBadRequest {
		t.Fatalf("bad request: status %d", got)
	}
	for _, l := range logs.takeDecoded(t) {
		if l["message"] == "request" && (l["level"] != "info" || l["sampled_1_in"] != nil) {
			t.Fatalf("refused request logged at %v, sampled_1_in %v: want info, unsampled", l["level"], l["sampled_1_in"])
		}
	}
}
