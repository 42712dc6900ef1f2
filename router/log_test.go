package router_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// rawLines keeps log output as written.
type rawLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *rawLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *rawLines) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSpace(l.buf.String())
	l.buf.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
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
	reg := newTestRegistry(t)
	for _, sm := range []*sim.Sim{s["p1"], s["p2"], s["d1"]} {
		spec, err := sm.Spec(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		reg.register(t, spec)
	}
	logs := &rawLines{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	rt, err := router.New(router.Config{PrefillPolicy: router.PolicyRoundRobin, APIKeys: []string{"k"}}, reg.mirror, reg.store,
		log.With().Str("component", "router").Logger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := server.New(server.Config{}, server.Deps{Store: reg.store, Snaps: reg.mirror, Registry: prometheus.NewRegistry(), Routes: rt},
		log.With().Str("component", "server").Logger())
	if err != nil {
		t.Fatal(err)
	}

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
	}
}
