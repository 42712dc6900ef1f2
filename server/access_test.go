package server

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/replica"
)

// securityFor is the security list openapi.yaml must give each
// x-pdplane-access value, so that tools reading only `security` see the
// same rule the server enforces. nil: the document's default ({}).
var securityFor = map[string][]string{
	"open":     nil,
	"register": {"joinToken", "peerCredential", "adminToken", ""},
	"self":     {"peerCredential", "adminToken", ""},
	"report":   {"peerCredential", "adminToken", ""},
	"peer":     {"peerCredential", "adminToken", ""},
	"admin":    {"adminToken", ""},
	"api-key":  {"bearer", ""},
}

// TestSpecDeclaresAccess walks openapi.yaml itself (not only the control
// operations embedded in server/api): every operation declares who may call
// it, /api/v1 with a level the server enforces, the OpenAI and ops routes
// with api-key or open, and each security list says the same.
func TestSpecDeclaresAccess(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	n := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			n++
			key := method + " " + path
			v, ok := op.Extensions[accessExtension].(string)
			if !ok {
				t.Errorf("%s declares no %s", key, accessExtension)
				continue
			}
			control := slices.Contains(op.Tags, "control")
			if _, known := accessNames[v]; control != known && !(v == "open" && !control) {
				t.Errorf("%s (tags %v) has %s %q", key, op.Tags, accessExtension, v)
			}
			if control != strings.HasPrefix(path, "/api/") {
				t.Errorf("%s: tag control and the /api/ prefix disagree", key)
			}
			var got []string
			if op.Security != nil {
				for _, req := range *op.Security {
					names := slices.Sorted(maps.Keys(req))
					got = append(got, strings.Join(names, "+"))
				}
			}
			if want := securityFor[v]; !slices.Equal(got, want) {
				t.Errorf("%s: %s %q, but security %q (want %q)", key, accessExtension, v, got, want)
			}
		}
	}
	if n < 20 {
		t.Fatalf("walked %d operations: is this openapi.yaml?", n)
	}
}

// TestEmbeddedAccessTable pins the table the server reads from the embedded
// spec to what auth.go's tests rely on, and proves the spec was regenerated
// (a declaration changed in openapi.yaml but not in server/api shows here).
func TestEmbeddedAccessTable(t *testing.T) {
	got, err := loadRouteAccess()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]access{
		"POST /api/v1/peers":                                 accessRegister,
		"GET /api/v1/peers":                                  accessOpen,
		"GET /api/v1/peers/{id}":                             accessOpen,
		"DELETE /api/v1/peers/{id}":                          accessAdmin,
		"GET /api/v1/peers/{id}/registration":                accessPeer,
		"GET /api/v1/peers/{id}/probe":                       accessPeer,
		"PUT /api/v1/peers/{id}/probe":                       accessSelf,
		"PUT /api/v1/pairs/{prefill}/{decode}/preflight":     accessPeer,
		"POST /api/v1/peers/{id}/drain":                      accessSelf,
		"GET /api/v1/peers/{id}/drain":                       accessOpen,
		"POST /api/v1/peers/{id}/heartbeat":                  accessSelf,
		"POST /api/v1/peers/{id}/stale":                      accessReport,
		"GET /api/v1/pairs":                                  accessOpen,
		"GET /api/v1/pairs/groups":                           accessOpen,
		"GET /api/v1/fleet":                                  accessOpen,
		"DELETE /api/v1/pairs/{prefill}/{decode}/quarantine": accessAdmin,
		"GET /api/v1/events":                                 accessOpen,
		"GET /api/v1/events/stream":                          accessOpen,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("access table from the embedded spec:\n got %v\nwant %v", got, want)
	}
}

func TestRouteAccessFromRefusesUnscoped(t *testing.T) {
	spec := func(write, read map[string]any) *openapi3.T {
		doc := &openapi3.T{Paths: openapi3.NewPaths()}
		doc.Paths.Set("/api/v1/things", &openapi3.PathItem{
			Post: &openapi3.Operation{Extensions: write},
			Get:  &openapi3.Operation{Extensions: read},
		})
		return doc
	}
	declared := map[string]any{accessExtension: "admin"}
	open := map[string]any{accessExtension: "open"}
	if tbl, err := routeAccessFrom(spec(declared, open)); err != nil || tbl["POST /api/v1/things"] != accessAdmin || tbl["GET /api/v1/things"] != accessOpen {
		t.Fatalf("declared: %v, %v", tbl, err)
	}
	for name, c := range map[string]struct {
		write, read map[string]any
		want        string
	}{
		"write without":  {nil, open, "write POST /api/v1/things declares no x-pdplane-access"},
		"read without":   {declared, nil, "operation GET /api/v1/things declares no x-pdplane-access"},
		"unknown level":  {map[string]any{accessExtension: "everyone"}, open, `x-pdplane-access everyone`},
		"not a string":   {map[string]any{accessExtension: 3}, open, "x-pdplane-access 3"},
		"api-key on api": {map[string]any{accessExtension: "api-key"}, open, "x-pdplane-access api-key"},
	} {
		if tbl, err := routeAccessFrom(spec(c.write, c.read)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: table %v, error %v; want an error naming %q", name, tbl, err, c.want)
		}
	}
}

type emptySnaps struct{}

func (emptySnaps) Snapshot() *replica.Snapshot { return &replica.Snapshot{} }

// TestUnscopedRouteRefused: a served route the access table does not list
// is refused with 403 problem+json, with a token, without one, and on an
// open control plane, rather than served open.
func TestUnscopedRouteRefused(t *testing.T) {
	for _, cfg := range []Config{{AdminToken: "admin-secret", JoinTokens: []string{"join-secret"}}, {}} {
		s, err := New(cfg, Deps{Store: memstore.New(memstore.Config{}), Snaps: emptySnaps{}, Registry: prometheus.NewRegistry()}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		s.access = maps.Clone(s.access)
		delete(s.access, "POST /api/v1/peers/{id}/drain")
		delete(s.access, "GET /api/v1/pairs")
		for _, c := range []struct{ method, path, token string }{
			{http.MethodPost, "/api/v1/peers/" + "00000000-0000-0000-0000-000000000001" + "/drain", "admin-secret"},
			{http.MethodPost, "/api/v1/peers/" + "00000000-0000-0000-0000-000000000001" + "/drain", ""},
			{http.MethodGet, "/api/v1/pairs", ""},
		} {
			req := httptest.NewRequest(c.method, c.path, nil)
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			var p Problem
			if rec.Code != http.StatusForbidden || rec.Header().Get("Content-Type") != "application/problem+json" ||
				json.Unmarshal(rec.Body.Bytes(), &p) != nil || p.Type != ProblemForbidden || !strings.Contains(p.Detail, "x-pdplane-access") {
				t.Errorf("open=%v %s %s: %d %s %s", s.open(), c.method, c.path, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
			}
		}
		// The declared routes still answer.
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/peers", nil))
		if rec.Code != http.StatusOK {
			t.Errorf("open=%v GET /api/v1/peers: %d %s", s.open(), rec.Code, rec.Body)
		}
	}
}

// TestServerLogsCarryRequestID: the server's own log lines (the access
// log, a failure's cause) carry the request's ID, the client's when valid,
// as its X-Request-Id answer does.
func TestServerLogsCarryRequestID(t *testing.T) {
	var buf bytes.Buffer
	s, err := New(Config{}, Deps{Store: memstore.New(memstore.Config{}), Snaps: emptySnaps{}, Registry: prometheus.NewRegistry()},
		zerolog.New(&buf).Level(zerolog.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/api/v1/peers/00000000-0000-0000-0000-000000000001", nil)
	req.Header.Set(pdproto.RequestIDHeader, "client-id-42")
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusNotFound || rec.Header().Get(pdproto.RequestIDHeader) != "client-id-42" {
		t.Fatalf("answer %d with X-Request-Id %q, want 404 with client-id-42", rec.Code, rec.Header().Get(pdproto.RequestIDHeader))
	}
	var lines int
	for line := range strings.Lines(buf.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		lines++
		if rec["request_id"] != "client-id-42" {
			t.Errorf("log line without the request's ID: %s", line)
		}
	}
	if lines == 0 {
		t.Fatal("nothing logged at debug level, want the access log line")
	}

	// A server-made ID when the client sent none, the same in the log.
	buf.Reset()
	rec = httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	id := rec.Header().Get(pdproto.RequestIDHeader)
	if id == "" || !strings.Contains(buf.String(), `"request_id":"`+id+`"`) {
		t.Errorf("X-Request-Id %q, log %s: want the answer's ID in the access log line", id, buf.String())
	}
}
