package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/router/routertest"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// bundle is one router under test, served over real HTTP, over the real
// registry (the store holds the peers, the router reports to it) and with
// its metrics registry.
type bundle struct {
	rt    *router.Router
	srv   *httptest.Server
	reg   *testRegistry
	prom  *prometheus.Registry
	clock *fakeClock
}

// fakeClock is a settable clock for breaker cool-downs.
type fakeClock struct{ off atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// setup registers the peers' specs in a fresh registry (the store assigns
// their IDs; the test's IDs are not kept) and starts a router over it.
func setup(t *testing.T, cfg router.Config, peers ...registry.Peer) *bundle {
	t.Helper()
	b := &bundle{reg: newTestRegistry(t), prom: prometheus.NewRegistry(), clock: &fakeClock{}}
	for _, p := range peers {
		b.reg.register(t, p.PeerSpec)
	}
	if cfg.Now == nil {
		cfg.Now = b.clock.now
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = time.Millisecond
	}
	rt, err := router.New(cfg, b.reg.mirror, b.reg.store, testLog(t).Level(zerolog.DebugLevel), b.prom)
	if err != nil {
		t.Fatal(err)
	}
	b.rt = rt
	// Served as pdplane serve serves it: through the router's Listener,
	// which takes back the connections of slow streams (takeover.go).
	b.srv = httptest.NewUnstartedServer(rt.Routes())
	b.srv.Config.IdleTimeout = time.Minute
	ln := httpwire.NewListener(b.srv.Listener, b.srv.Config.IdleTimeout)
	if routerFront {
		ln.Front(rt.Routes(), 10*time.Second, rt.Watcher())
	}
	b.srv.Listener = ln
	b.srv.Start()
	t.Cleanup(func() {
		b.srv.Close()
		rt.Close()
	})
	return b
}

// testLog is a logger that writes to t until t's cleanups end: a request
// the front is still finishing when the test's server has closed
// (httptest.Server.Close waits only for the connections net/http serves)
// must not log to a test that has ended. Made before the server's cleanup
// is registered, its own runs after it.
func testLog(t *testing.T) zerolog.Logger {
	w := &untilEnd{w: zerolog.NewTestWriter(t)}
	t.Cleanup(func() {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	return zerolog.New(w)
}

// untilEnd passes writes to w until ended, then drops them.
type untilEnd struct {
	mu    sync.Mutex
	ended bool
	w     io.Writer
}

func (u *untilEnd) Write(p []byte) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ended {
		return len(p), nil
	}
	return u.w.Write(p)
}

// routerFront says whether the router's tests reach it through the
// Listener's front (front.go), as pdplane serve does by default; the test
// script runs them a second time without it (PDPLANE_ROUTER_FRONT=false),
// as serve --front=false and systems other than Linux serve.
var routerFront = os.Getenv("PDPLANE_ROUTER_FRONT") != "false"

// takenOver is how many streams the router took over, by its own count:
// a connection its front serves is hijacked without net/http seeing it.
func (b *bundle) takenOver(t *testing.T) int64 {
	t.Helper()
	return int64(b.metric(t, "pdplane_router_streams_taken_over_total", nil))
}

// post sends a JSON body to the router and returns the answer, read whole.
func (b *bundle) post(t *testing.T, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	resp := b.send(t, context.Background(), path, body, hdr...)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return resp, out
}

func (b *bundle) send(t *testing.T, ctx context.Context, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// waitMetric waits for a metric to reach want.
func (b *bundle) waitMetric(t *testing.T, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := b.metric(t, name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v, want %v", name, labels, got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// metric returns the value of the first series of name whose labels
// include labels: a counter's or gauge's value, a histogram's count; 0 when
// there is none.
func (b *bundle) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return routertest.Value(t, b.prom, name, labels)
}

// total sums a counter (or a histogram's count) over every series of name
// whose labels include labels.
func (b *bundle) total(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, v := range routertest.Samples(t, b.prom, name, labels) {
		sum += v
	}
	return sum
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, body []byte) openAIError {
	t.Helper()
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error: %s (%v)", body, err)
	}
	return e
}

// sseReader reads SSE data payloads one at a time.
type sseReader struct{ r *bufio.Reader }

func (s *sseReader) next(t *testing.T) string {
	t.Helper()
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("read SSE: %v (partial %q)", err, line)
		}
		if d, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			return d
		}
	}
}

// TestPrefillErrorAfterDecodeHeaders: a decode that already sent 200 and
// its headers (SGLang's /generate does when it accepts the request) must
// not hide a failed prefill: the client gets 502, the request is not
// retried and the decode's leg is cancelled. The prefill fails on its
// transfer to the decode (the decode's registration lacks its memory
// kinds), which can only come after the decode accepted the request.
func TestPrefillErrorAfterDecodeHeaders(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.RoomTimeout = time.Minute })
	setFault(t, d, sim.FaultMissingMemKind)
	b := setupSims(t, router.Config{MaxAttempts: 1}, p, d)
	resp, body := b.post(t, "/generate", `{"text":"hi","sampling_params":{"max_new_tokens":3},"stream":true}`)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("a 200 hid the failed prefill: %d %s", resp.StatusCode, body)
	}
	if n := p.Stats().MissingMemKind; n != 1 {
		t.Fatalf("the prefill failed %d times, want 1", n)
	}
	if n := d.Stats().Requests; n != 1 {
		t.Fatalf("the decode got %d requests, want 1", n)
	}
	// Its room would wait a minute; only the router's cancel frees it.
	simtest.WaitFor(t, "the decode's leg cancelled", func() bool { l := d.Load(); return l.Running+l.Queued == 0 })
}

// TestMemKindTextInASuccessfulAnswerIsNotAnError: an answer that merely
// holds the memory-kind error's text (here the prompt, echoed by both
// legs) is a success; the same text in a streamed abort is the failure.
func TestMemKindTextInASuccessfulAnswerIsNotAnError(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	b := setupSims(t, router.Config{}, p, d)
	resp, body := b.post(t, "/v1/completions", `{"model":"sim-model","prompt":"Missing NIXL destination KV memory kind","max_tokens":2,"echo":true}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Missing NIXL destination KV memory kind") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := len(b.reg.staleEvents(t, "d0")); n != 0 {
		t.Fatalf("a successful answer marked the decode stale %d times", n)
	}
	// The same message in a streamed abort event is the real thing.
	setFault(t, d, sim.FaultMissingMemKind)
	resp, _ = b.post(t, "/generate", `{"text":"x","stream":true}`)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if m := b.reg.waitStale(t, "d0"); !strings.Contains(m.Error, "Missing NIXL destination KV memory kind") {
		t.Fatalf("stale mark %+v", m)
	}
	if n := len(b.reg.staleEvents(t, "d0")); n != 1 {
		t.Fatalf("%d stale marks", n)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	snaps := newTestRegistry(t).mirror
	// Each bound names its own field.
	for _, tc := range []struct {
		field string
		cfg   router.Config
	}{
		{"PrefillPolicy", router.Config{PrefillPolicy: "fastest"}},
		{"DecodePolicy", router.Config{DecodePolicy: "fastest"}},
		{"MaxBodyBytes", router.Config{MaxBodyBytes: -1}},
		{"MaxInflight", router.Config{MaxInflight: -1}},
		{"MaxResponseBytes", router.Config{MaxResponseBytes: -1}},
		{"MaxAttempts", router.Config{MaxAttempts: -1}},
		{"RetryBackoff", router.Config{RetryBackoff: -time.Second}},
		{"RetryBackoffMax", router.Config{RetryBackoffMax: -time.Second}},
		{"BreakerFailures", router.Config{BreakerFailures: -1}},
		{"BreakerCooldown", router.Config{BreakerCooldown: -time.Second}},
		{"ConnectTimeout", router.Config{ConnectTimeout: -time.Second}},
		{"PrefillTimeout", router.Config{PrefillTimeout: -time.Second}},
		{"DecodeFirstByteTimeout", router.Config{DecodeFirstByteTimeout: -time.Second}},
		{"MaxIdleConnsPerHost", router.Config{MaxIdleConnsPerHost: -1}},
		{"CacheAwarePrefixBytes", router.Config{CacheAwarePrefixBytes: -1}},
		{"CacheAwareBalanceAbs", router.Config{CacheAwareBalanceAbs: -1}},
		{"CacheAwareBalanceRel", router.Config{CacheAwareBalanceRel: 0.5}},
		{"CacheAwareVirtualNodes", router.Config{CacheAwareVirtualNodes: -1}},
		{"CacheAwareVirtualNodes", router.Config{CacheAwareVirtualNodes: 1025}},
		{"APIKeys[0]", router.Config{APIKeys: []string{""}}},
	} {
		if _, err := router.New(tc.cfg, snaps, nil, zerolog.Nop(), nil); err == nil || !strings.Contains(err.Error(), " "+tc.field+":") {
			t.Errorf("%s out of bounds: err %v, want one naming %s", tc.field, err, tc.field)
		}
	}
	reg := prometheus.NewRegistry()
	if _, err := router.New(router.Config{}, snaps, nil, zerolog.Nop(), reg); err != nil {
		t.Fatal(err)
	}
	if _, err := router.New(router.Config{}, snaps, nil, zerolog.Nop(), reg); err == nil {
		t.Fatal("registered the metrics twice")
	}
}
