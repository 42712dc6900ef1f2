package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/router/routertest"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
	"github.com/pdplane/pdplane/web"
)

// raw sends one request with exactly the given headers (no defaults) and
// returns the status, the headers and the body.
func (b *bundle) raw(t *testing.T, method, path, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// problem decodes a problem+json answer, failing when it is not one.
func problem(t *testing.T, h http.Header, data []byte) api.Problem {
	t.Helper()
	var p api.Problem
	if ct := h.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q, want application/problem+json: %s", ct, data)
	}
	// Strictly: the answer is the contract's Problem, nothing more.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil || p.Type == "" {
		t.Fatalf("not a problem: %s (%v)", data, err)
	}
	return p
}

func (b *bundle) peerCount(t *testing.T) int {
	t.Helper()
	peers, err := b.store.List(context.Background(), registry.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return len(peers)
}

// TestBrowserCannotWriteCrossOrigin replays what a page on another origin
// can make a browser send without a preflight (a text/plain POST, with
// Origin and Sec-Fetch-Site set by the browser), and checks that nothing is
// written, while the server's own page and non-browser clients still are.
func TestBrowserCannotWriteCrossOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := string(specJSON(registrytest.Spec("p0", registry.RolePrefill)))
	auth := "Bearer " + joinToken

	for _, tc := range []struct {
		name   string
		hdr    []string
		status int
		field  string
	}{
		{"text/plain", []string{"Authorization", auth, "Content-Type", "text/plain"}, 415, "Content-Type"},
		{"form", []string{"Authorization", auth, "Content-Type", "application/x-www-form-urlencoded"}, 415, "Content-Type"},
		{"no content type", []string{"Authorization", auth}, 415, "Content-Type"},
		{"foreign origin", []string{"Authorization", auth, "Content-Type", "application/json", "Origin", "http://evil.example"}, 403, "Origin"},
		{"null origin", []string{"Authorization", auth, "Content-Type", "application/json", "Origin", "null"}, 403, "Origin"},
		{"cross-site fetch", []string{"Authorization", auth, "Content-Type", "application/json", "Sec-Fetch-Site", "cross-site"}, 403, "Origin"},
		{"cross-origin text/plain", []string{"Content-Type", "text/plain", "Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}, 403, "Origin"},
	} {
		code, h, data := b.raw(t, "POST", "/api/v1/peers", spec, tc.hdr...)
		if code != tc.status {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, code, tc.status, data)
		}
		if p := problem(t, h, data); apiconv.Deref(p.Field) != tc.field {
			t.Fatalf("%s: field %q, want %q", tc.name, apiconv.Deref(p.Field), tc.field)
		}
	}
	if n := b.peerCount(t); n != 0 {
		t.Fatalf("refused writes stored %d peers", n)
	}

	// The status page is same-origin: its browser sends Origin equal to the
	// server's own and Sec-Fetch-Site: same-origin.
	code, _, data := b.raw(t, "POST", "/api/v1/peers", spec, "Authorization", auth, "Content-Type", "application/json; charset=utf-8",
		"Origin", b.url, "Sec-Fetch-Site", "same-origin")
	if code != http.StatusCreated {
		t.Fatalf("same-origin registration: %d %s", code, data)
	}
	var created map[string]any
	if err := json.Unmarshal(data, &created); err != nil {
		t.Fatal(err)
	}
	id := created["id"].(string)

	// A body-less admin write from another origin is refused too.
	code, h, data := b.raw(t, "POST", "/api/v1/peers/"+id+"/drain", "", "Authorization", "Bearer "+adminToken, "Origin", "http://evil.example")
	if code != http.StatusForbidden || problem(t, h, data).Type != server.ProblemForbiddenOrigin {
		t.Fatalf("cross-origin drain: %d %s", code, data)
	}
	if p, err := b.store.Get(context.Background(), id); err != nil || p.State == registry.StateDraining {
		t.Fatalf("peer after a refused drain: %v %v", p.State, err)
	}
	// Reads stay open to any origin's browser (they carry no secret).
	if code, _, data := b.raw(t, "GET", "/api/v1/peers", "", "Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"); code != http.StatusOK {
		t.Fatalf("cross-origin read: %d %s", code, data)
	}
}

// TestAllowedHostsRefusesOtherNames checks --allowed-hosts: a bare host
// matches any port, host:port only that port, and anything else (a
// rebound DNS name) gets 421 problem+json naming Host.
func TestAllowedHostsRefusesOtherNames(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *server.Config, _ *server.Deps) {
		c.AllowedHosts = []string{"127.0.0.1", "PDPlane.internal", "cp.example:8443"}
	})
	for host, want := range map[string]int{
		"":                       http.StatusOK, // the client's own 127.0.0.1:port
		"pdplane.internal":       http.StatusOK,
		"pdplane.internal:9000":  http.StatusOK,
		"cp.example:8443":        http.StatusOK,
		"cp.example:80":          http.StatusMisdirectedRequest,
		"cp.example":             http.StatusMisdirectedRequest,
		"rebound.attacker.test":  http.StatusMisdirectedRequest,
		"127.0.0.1.attacker.dns": http.StatusMisdirectedRequest,
	} {
		var hdr []string
		if host != "" {
			hdr = []string{"Host", host}
		}
		code, h, data := b.raw(t, "GET", "/api/v1/peers", "", hdr...)
		if code != want {
			t.Fatalf("Host %q: status %d, want %d: %s", host, code, want, data)
		}
		if want != http.StatusOK {
			if p := problem(t, h, data); apiconv.Deref(p.Field) != "Host" || p.Type != server.ProblemMisdirected {
				t.Fatalf("Host %q: %+v", host, p)
			}
		}
	}
}

// TestMethodsAndPathsFollowTheSpec pins 405 with Allow for known paths,
// problem+json 404 for unknown /api paths (the status page no longer
// swallows them), and 405 for TRACE anywhere.
func TestMethodsAndPathsFollowTheSpec(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(_ *server.Config, d *server.Deps) {
		d.Web = web.Handler()
		rt, err := router.New(router.Config{}, d.Snaps, nil, zerolog.New(zerolog.NewTestWriter(t)), d.Registry)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rt.Close)
		d.Routes = rt
	})
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
		problem      bool
	}{
		{"PUT", "/api/v1/peers", 405, "GET, POST", true},
		{"PATCH", "/api/v1/peers/x", 405, "GET, DELETE", true},
		{"PUT", "/api/v1/peers/x/drain", 405, "GET, POST", true},
		{"TRACE", "/api/v1/peers", 405, "GET, POST", true},
		{"TRACE", "/metrics", 405, "GET", false},
		{"TRACE", "/", 405, "GET, HEAD", false},
		{"TRACE", "/nowhere", 405, "", false},
		{"POST", "/metrics", 405, "GET", false},
		{"DELETE", "/", 405, "GET, HEAD", false},
		{"GET", "/api/v1/nope", 404, "", true},
		{"POST", "/api/v1/nope", 404, "", true},
		{"DELETE", "/api/v2/peers", 404, "", true},
		{"GET", "/nope", 404, "", false},
		{"GET", "/v1/chat/completions", 405, "POST", false},
		{"DELETE", "/v1/models", 405, "GET", false},
		{"TRACE", "/generate", 405, "POST", false},
		{"PUT", "/healthz", 405, "GET", false},
		{"GET", "/", 200, "", false},
	} {
		code, h, data := b.raw(t, tc.method, tc.path, "")
		if code != tc.status {
			t.Fatalf("%s %s: status %d, want %d: %s", tc.method, tc.path, code, tc.status, data)
		}
		if code == 405 && h.Get("Allow") != tc.allow {
			t.Fatalf("%s %s: Allow %q, want %q", tc.method, tc.path, h.Get("Allow"), tc.allow)
		}
		if tc.problem {
			problem(t, h, data)
		} else if strings.Contains(h.Get("Content-Type"), "problem") {
			t.Fatalf("%s %s: problem+json outside /api: %s", tc.method, tc.path, data)
		}
	}
}

// TestDataAfterTheJSONBodyIsRefused: encoding/json's decoder stops after
// the first value, so "{...}{...}" used to register the first object.
func TestDataAfterTheJSONBodyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spec := string(specJSON(registrytest.Spec("p0", registry.RolePrefill)))
	for _, body := range []string{spec + "{}", spec + " x", spec + "\n" + spec, spec + "]"} {
		code, h, data := b.raw(t, "POST", "/api/v1/peers", body, "Authorization", "Bearer "+joinToken, "Content-Type", "application/json")
		if code != http.StatusBadRequest {
			t.Fatalf("status %d, want 400: %s", code, data)
		}
		if p := problem(t, h, data); apiconv.Deref(p.Field) != "body" {
			t.Fatalf("field %q, want body", apiconv.Deref(p.Field))
		}
	}
	if n := b.peerCount(t); n != 0 {
		t.Fatalf("refused bodies stored %d peers", n)
	}
	if code, _, data := b.raw(t, "POST", "/api/v1/peers", spec+" \r\n\t", "Authorization", "Bearer "+joinToken, "Content-Type", "application/json"); code != http.StatusCreated {
		t.Fatalf("trailing white space: %d %s", code, data)
	}
}

// wantStreamRefused opens an event stream that must be refused: 503 with a
// Retry-After and a problem of type problemType, the first refusal counted
// under reason.
func (b *bundle) wantStreamRefused(t *testing.T, what, problemType, reason string) {
	t.Helper()
	code, h, data := b.raw(t, "GET", "/api/v1/events/stream", "")
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Fatalf("%s: %d, Retry-After %q: %s", what, code, h.Get("Retry-After"), data)
	}
	if p := problem(t, h, data); p.Type != problemType {
		t.Fatalf("%s: problem %+v, want type %s", what, p, problemType)
	}
	if got := b.gauge(t, "pdplane_api_rejected_total", map[string]string{"reason": reason}); got != 1 {
		t.Fatalf("rejected_total{%s} = %v, want 1", reason, got)
	}
}

// gauge reads a gauge or counter from the bundle's registry: the first
// series of name whose labels include labels; 0 when there is none.
func (b *bundle) gauge(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return routertest.Value(t, b.reg, name, labels)
}

// openStream opens an event stream and waits for its greeting.
func (b *bundle) openStream(t *testing.T, ctx context.Context) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.url+"/api/v1/events/stream", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream: %d %s", resp.StatusCode, data)
	}
	if l, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(l, ":") {
		t.Fatalf("stream greeting %q: %v", l, err)
	}
	return resp
}

// TestEventStreamsAreCapped opens streams up to the cap: the next is 503
// with Retry-After and counted, and a slot comes back when a stream ends.
func TestEventStreamsAreCapped(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *server.Config, _ *server.Deps) { c.MaxEventStreams = 2 })
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	s1 := b.openStream(t, ctx1)
	defer s1.Body.Close()
	s2 := b.openStream(t, context.Background())
	defer s2.Body.Close()
	if got := b.gauge(t, "pdplane_api_event_streams", nil); got != 2 {
		t.Fatalf("open streams gauge = %v, want 2", got)
	}

	b.wantStreamRefused(t, "third stream", server.ProblemTooManyStreams, "max_event_streams")

	cancel1()
	simtest.WaitFor(t, "the first stream to end", func() bool { return b.gauge(t, "pdplane_api_event_streams", nil) == 1 })
	s3 := b.openStream(t, context.Background())
	s3.Body.Close()
}

// TestTrickledBodiesHoldNoMemoryAndAreCut replays the probe's attack: 40
// connections each declare a 32 MiB body and send one byte. The heap of
// this process (which serves them) must stay under 64 MiB while all 40 wait
// in the router's body read, and the body deadline must close each
// connection. Not parallel: the heap is measured without other tests'
// garbage.
func TestTrickledBodiesHoldNoMemoryAndAreCut(t *testing.T) {
	const (
		conns    = 40
		declared = 32 << 20
		deadline = 2 * time.Second // long enough for 40 connections to be counted on a loaded machine
	)
	var rt *router.Router
	b := setupWith(t, func(c *server.Config, d *server.Deps) {
		c.BodyTimeout = deadline
		c.MaxBodyBytes = 64 << 20
		var err error
		rt, err = router.New(router.Config{MaxBodyBytes: 64 << 20}, d.Snaps, nil, zerolog.New(zerolog.NewTestWriter(t)), d.Registry)
		if err != nil {
			t.Fatal(err)
		}
		d.Routes = rt
	})
	t.Cleanup(rt.Close)
	addr := strings.TrimPrefix(b.url, "http://")

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	type sent struct {
		c  net.Conn
		at time.Time
	}
	var open []sent
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		path := "/v1/chat/completions"
		if i%2 == 1 {
			path = "/generate"
		}
		// Stamped before the request goes: the server's deadline cannot
		// start earlier, while a stamp after the write could come later
		// than the server's start (it once did, by 1.3 ms).
		at := time.Now()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", path, addr, declared)
		open = append(open, sent{c, at})
	}
	simtest.WaitFor(t, "every connection in the router's body read", func() bool {
		return b.gauge(t, "pdplane_router_inflight_requests", nil) == conns
	})
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	t.Logf("heap: %d KiB before, %d KiB with %d trickling bodies", before.HeapAlloc>>10, during.HeapAlloc>>10, conns)
	if during.HeapAlloc > 64<<20 {
		t.Fatalf("heap %d MiB with %d connections that sent one byte each, want < 64 MiB", during.HeapAlloc>>20, conns)
	}

	for i, s := range open {
		// The client-side deadline only keeps a broken server from hanging
		// the test; the server must close well before it.
		_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(s.c), nil)
		if err != nil {
			t.Fatalf("connection %d: no answer: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("connection %d: status %d, want 408", i, resp.StatusCode)
		}
		if waited := time.Since(s.at); waited < deadline {
			t.Fatalf("connection %d answered after %s, before the %s deadline", i, waited, deadline)
		}
		if n, err := s.c.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
			t.Fatalf("connection %d still open after the answer (read %d, %v)", i, n, err)
		}
	}
	simtest.WaitFor(t, "no router request in flight", func() bool {
		return b.gauge(t, "pdplane_router_inflight_requests", nil) == 0
	})

	// The control plane's own API is cut the same way.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /api/v1/peers HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
		addr, joinToken, 1<<20)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("api: no answer: %v", err)
	}
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(data), `"field":"body"`) {
		t.Fatalf("api: %d %s", resp.StatusCode, data)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return err != nil && errors.As(err, &ne) && ne.Timeout()
}

// TestBodyDeadlineDoesNotCutStreams: the deadline covers the request body
// only. A generation stream that outlives it several times over, and an
// event stream (no body at all), must still deliver their next bytes. It
// pins the whole stack (middleware, router, strict handler) against any
// deadline or timeout that would end a stream.
func TestBodyDeadlineDoesNotCutStreams(t *testing.T) {
	t.Parallel()
	const deadline = 100 * time.Millisecond
	// The decode takes five body deadlines a token: the wait is the
	// condition under test, not a pause.
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = 5 * deadline })
	var rt *router.Router
	b := setupWith(t, func(c *server.Config, deps *server.Deps) {
		c.BodyTimeout = deadline
		ctx := context.Background()
		for _, s := range []*sim.Sim{p, d} {
			spec, err := s.Spec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			res, err := deps.Store.Register(ctx, spec, registry.Claim{Admin: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := deps.Store.Heartbeat(ctx, registry.Heartbeat{PeerID: res.Peer.ID, InstanceID: spec.InstanceID}); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		rt, err = router.New(router.Config{}, deps.Snaps, deps.Store, zerolog.New(zerolog.NewTestWriter(t)), deps.Registry)
		if err != nil {
			t.Fatal(err)
		}
		deps.Routes = rt
	})
	t.Cleanup(rt.Close)
	simtest.WaitFor(t, "the pair to be routable", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })

	events := b.openStream(t, context.Background())
	defer events.Body.Close()

	req, _ := http.NewRequest("POST", b.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	// A connection of its own: the router takes the slow stream's
	// connection over and, served without its Listener (httptest), closes
	// it at the stream's end, which a pooled connection would meet as a
	// reset on its next request.
	streamClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := streamClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("stream cut after %s: %v (read %q)", time.Since(start), err, data)
	}
	if events, done := simtest.Events(data); len(events) != 2 || !done {
		t.Fatalf("stream after the deadline: %s", data)
	}
	if time.Since(start) < 4*deadline {
		t.Fatalf("the stream ended after %s, before outliving the body deadline", time.Since(start))
	}

	// The event stream opened before all this is still served: a
	// registration now arrives on it.
	b.register(t, registrytest.Spec("late", registry.RolePrefill))
	sc := bufio.NewScanner(events.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			if !strings.Contains(sc.Text(), `"late"`) {
				t.Fatalf("event %s", sc.Text())
			}
			return
		}
	}
	t.Fatalf("event stream ended: %v", sc.Err())
}
