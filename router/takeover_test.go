package router_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdplane/pdplane/httpwire"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// A decode whose tokens come further apart than the router's slow-stream
// wait (100 ms) makes a slow stream, which the router takes off net/http's
// connection (takeover.go).
const slowToken = 150 * time.Millisecond

func slowStreamBody(tokens int) string {
	return `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":` + strconv.Itoa(tokens) + `,"stream":true}`
}

// rawStreamRequest is a streamed chat completion of tokens tokens as an
// HTTP/1.1 client sends it.
func rawStreamRequest(tokens int) string {
	body := slowStreamBody(tokens)
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// dialRaw opens a plain connection to srv, closed with the test.
func dialRaw(t *testing.T, srv *httptest.Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// countingClient is a client whose dials are counted: a second request
// that does not dial went on the first one's connection (keep-alive).
func countingClient(dials *atomic.Int64) *http.Client {
	d := &net.Dialer{}
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}}}
}

// TestSlowStreamIsTakenOverAndKeepsItsConnection: a slow stream leaves
// net/http (its connection is hijacked) and still reaches the client whole,
// in valid chunked framing (Go's client refuses anything else), and the
// client's next request goes on the same connection, as it would have
// through net/http.
func TestSlowStreamIsTakenOverAndKeepsItsConnection(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			p, d := simtest.Pair(t, engine, func(c *sim.Config) { c.DecodeTimePerToken = slowToken })
			b := setupSims(t, router.Config{}, p, d)
			var dials atomic.Int64
			client := countingClient(&dials)
			const tokens = 4
			for i := range 3 {
				req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/v1/chat/completions", strings.NewReader(slowStreamBody(tokens)))
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: status %d, read: %v, body %q", i, resp.StatusCode, err, body)
				}
				if te := resp.TransferEncoding; len(te) != 1 || te[0] != "chunked" {
					t.Fatalf("request %d: transfer encoding %v", i, te)
				}
				events, done := simtest.Events(body)
				if !done || len(events) < tokens {
					t.Fatalf("request %d: %d events, [DONE] %v: %q", i, len(events), done, body)
				}
			}
			if n := b.takenOver(t); n != 3 {
				t.Fatalf("%d connections taken over, want one per stream (3)", n)
			}
			if n := b.metric(t, "pdplane_router_streams_taken_over_total", nil); n != 3 {
				t.Fatalf("streams_taken_over_total = %v, want 3", n)
			}
			if n := dials.Load(); n != 1 {
				t.Fatalf("the client dialed %d times: a taken-over connection was not kept alive", n)
			}
			b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"outcome": "ok"}, 3)
			// A stream stops counting once its terminator is out, which
			// the client may read before the router's next instruction.
			simtest.WaitFor(t, "no stream counted after every stream ended", func() bool { return b.rt.Detached() == 0 })
		})
	}
}

// TestFastStreamStaysOnNetHTTP: a stream generated at speed is never taken
// over; it pays nothing for the takeover.
func TestFastStreamStaysOnNetHTTP(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	b := setupSims(t, router.Config{}, p, d)
	resp, body := b.post(t, "/v1/chat/completions", slowStreamBody(8))
	if _, done := simtest.Events(body); resp.StatusCode != http.StatusOK || !done {
		t.Fatalf("status %d: %q", resp.StatusCode, body)
	}
	if n := b.takenOver(t); n != 0 {
		t.Fatalf("%d connections taken over for a fast stream", n)
	}
}

// TestClientLeavingATakenStreamCancelsIt: once the router owns the
// connection, a client that closes it still cancels the request at once:
// the decode's leg ends, the request counts as the client's leaving, and
// the router no longer counts the stream.
func TestClientLeavingATakenStreamCancelsIt(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = slowToken })
	b := setupSims(t, router.Config{}, p, d)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := b.send(t, ctx, "/v1/chat/completions", slowStreamBody(1000))
	sse := &sseReader{r: bufio.NewReader(resp.Body)}
	for range 3 {
		sse.next(t)
	}
	simtest.WaitFor(t, "the stream taken over", func() bool { return b.takenOver(t) == 1 && b.rt.Detached() == 1 })
	if n := b.metric(t, "pdplane_router_inflight_requests", nil); n != 1 {
		t.Fatalf("in-flight gauge %v while the taken-over stream runs, want 1", n)
	}
	cancel()
	resp.Body.Close()
	simtest.WaitFor(t, "the decode's leg cancelled", func() bool { return d.Load().Running == 0 })
	b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"outcome": "client_gone"}, 1)
	simtest.WaitFor(t, "the stream no longer counted", func() bool { return b.rt.Detached() == 0 })
	b.waitMetric(t, "pdplane_router_inflight_requests", nil, 0)
}

// TestCloseDetachedCutsTakenStreams: a shutdown's cut reaches streams the
// router took over: the client sees its answer cut (no chunked terminator:
// it cannot take it for complete) and the decode's leg is cancelled.
func TestCloseDetachedCutsTakenStreams(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = slowToken })
	b := setupSims(t, router.Config{}, p, d)
	resp := b.send(t, context.Background(), "/v1/chat/completions", slowStreamBody(1000))
	defer resp.Body.Close()
	simtest.WaitFor(t, "the stream taken over", func() bool { return b.rt.Detached() == 1 })
	b.rt.CloseDetached()
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading the cut stream: %v, want io.ErrUnexpectedEOF", err)
	}
	simtest.WaitFor(t, "the decode's leg cancelled", func() bool { return d.Load().Running == 0 })
	simtest.WaitFor(t, "the stream no longer counted", func() bool { return b.rt.Detached() == 0 })
}

// TestTakenConnectionPipelinedAndIdle, on a raw connection: a request the
// client sent before its slow stream ended (HTTP/1.1 pipelining, RFC 9112
// §9.3.2) is answered after it, in order; a connection then left idle is
// closed once the listener's idle time has passed.
func TestTakenConnectionPipelinedAndIdle(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = slowToken })
	b := setupSims(t, router.Config{}, p, d)
	const idle = 300 * time.Millisecond
	srv, hijacked := takenRawServer(t, b, idle)
	c := dialRaw(t, srv)
	if _, err := io.WriteString(c, rawStreamRequest(3)+rawStreamRequest(2)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	for i, tokens := range []int{3, 2} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("answer %d: status %d, read %v: %q", i, resp.StatusCode, err, body)
		}
		if events, done := simtest.Events(body); !done || len(events) < tokens {
			t.Fatalf("answer %d: %d events, [DONE] %v: %q", i, len(events), done, body)
		}
	}
	if hijacked.Load() != 2 {
		t.Fatalf("%d streams taken over, want 2", hijacked.Load())
	}
	start := time.Now()
	if n, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection read %v, %v: want it closed (EOF)", n, err)
	}
	if waited := time.Since(start); waited < idle/2 {
		t.Fatalf("idle connection closed after %v, before its idle time (%v)", waited, idle)
	}
}

// opaqueConn hides the connection's descriptor (syscall.Conn), as a TLS
// connection or any other wrapper does: the router can take such a stream
// over but cannot watch its connection.
type opaqueConn struct{ net.Conn }
type opaqueListener struct{ net.Listener }

func (l opaqueListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if c != nil {
		c = opaqueConn{c}
	}
	return c, err
}

// TestUnwatchedTakenConnectionClosesAfterItsStream: a taken-over
// connection the watcher cannot watch still gets its whole answer, and is
// then closed, not parked where nothing would see the client's next
// request (which would hang).
func TestUnwatchedTakenConnectionClosesAfterItsStream(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = slowToken })
	b := setupSims(t, router.Config{}, p, d)
	srv := httptest.NewUnstartedServer(b.rt.Routes())
	srv.Listener = httpwire.NewListener(opaqueListener{srv.Listener}, time.Minute)
	srv.Start()
	defer srv.Close()
	c := dialRaw(t, srv)
	if _, err := io.WriteString(c, rawStreamRequest(3)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := io.ReadAll(resp.Body)
	if events, done := simtest.Events(answer); err != nil || !done || len(events) < 3 {
		t.Fatalf("answer: %d events, [DONE] %v, read %v: %q", len(events), done, err, answer)
	}
	if n, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the stream the connection read %v, %v: want it closed (EOF)", n, err)
	}
}

// TestPanicInARequestReleasesItsAdmission: a request whose handling panics
// is cut (as net/http does for any handler) and still gives back its place
// under --max-inflight and in the in-flight gauge. The panic is injected
// through the router's clock while the request is being prepared.
func TestPanicInARequestReleasesItsAdmission(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	now := panicOnce(&armed, "(*dispatch).prepare")
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	b := setupSims(t, router.Config{MaxInflight: 1, Now: now}, p, d)
	const unary = `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	armed.Store(true)
	if resp, err := http.Post(b.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(unary)); err == nil {
		resp.Body.Close()
		t.Fatalf("the panicking request was answered %d, want it cut", resp.StatusCode)
	}
	if armed.Load() {
		t.Fatal("the fault was never injected")
	}
	resp, body := b.post(t, "/v1/chat/completions", unary)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request got %d (in-flight gauge %v): the panicking one kept its place: %s", resp.StatusCode,
			b.metric(t, "pdplane_router_inflight_requests", nil), body)
	}
	// Counted as the router's own failure, not as served.
	b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"outcome": "internal_error"}, 1)
	b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"outcome": "ok"}, 1)
}

// TestPanicInAnAttemptGivesBackItsProbe: the half-open probe a breaker
// lends an attempt comes back when the attempt panics. Otherwise the
// breaker would stay half-open with its probe out, and its peer would be
// left out of every pick for good: one request's fault spread to all that
// follow. The panic is injected through the router's clock as the attempt
// starts its decode leg, on the breaker's probe.
func TestPanicInAnAttemptGivesBackItsProbe(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{}
	var armed atomic.Bool
	panicking := panicOnce(&armed, "(*dispatch).runSGLang")
	now := func() time.Time {
		panicking()
		return clock.now()
	}
	p, d := simtest.Pair(t, registry.EngineSGLang, nil)
	setFault(t, p, sim.FaultPrefillError)
	b := setupSims(t, router.Config{MaxAttempts: 1, BreakerFailures: 1, BreakerCooldown: time.Minute, Now: now}, p, d)
	const unary = `{"model":"sim-model","prompt":"x","max_tokens":2}`
	if resp, body := b.post(t, "/v1/completions", unary); resp.StatusCode == http.StatusOK {
		t.Fatalf("a failing prefill answered 200: %s", body)
	}
	state := func() float64 { return b.metric(t, "pdplane_router_breaker_state", map[string]string{"peer": "p0"}) }
	if state() != 1 {
		t.Fatalf("the prefill's breaker is %v after its failure, want open (1)", state())
	}
	setFault(t, p, sim.FaultNone)
	clock.advance(time.Minute)
	armed.Store(true)
	if resp, err := http.Post(b.srv.URL+"/v1/completions", "application/json", strings.NewReader(unary)); err == nil {
		resp.Body.Close()
		t.Fatalf("the probe that panicked was answered %d, want it cut", resp.StatusCode)
	}
	if armed.Load() {
		t.Fatal("the fault was never injected")
	}
	if resp, body := b.post(t, "/v1/completions", unary); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the panicked probe: %d %s (breaker %v): its probe was never given back", resp.StatusCode, body, state())
	}
	if state() != 0 {
		t.Fatalf("the breaker is %v after a good probe, want closed (0)", state())
	}
}

// panicOnce is a clock for Config.Now that, once armed, panics the first
// time it is read from within fn (a function name's suffix), and then
// disarms: a fault injected where the router reads the time.
func panicOnce(armed *atomic.Bool, fn string) func() time.Time {
	return func() time.Time {
		if armed.Load() {
			pc := make([]uintptr, 16)
			frames := runtime.CallersFrames(pc[:runtime.Callers(2, pc)])
			for f, more := frames.Next(); ; f, more = frames.Next() {
				if strings.HasSuffix(f.Function, fn) && armed.CompareAndSwap(true, false) {
					panic("injected fault")
				}
				if !more {
					break
				}
			}
		}
		return time.Now()
	}
}

// TestPanicInATakenStreamIsCountedAsCut: a panic while relaying a stream
// on its own goroutine, here after the stream was taken over, cuts the
// client's answer (no chunked terminator) and counts the request as the
// router's failure, not as served.
func TestPanicInATakenStreamIsCountedAsCut(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	now := panicOnce(&armed, "(*dispatch).relay")
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = slowToken })
	b := setupSims(t, router.Config{Now: now}, p, d)
	resp := b.send(t, context.Background(), "/v1/chat/completions", slowStreamBody(1000))
	defer resp.Body.Close()
	simtest.WaitFor(t, "the stream taken over", func() bool { return b.rt.Detached() == 1 })
	armed.Store(true)
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading the stream: %v, want it cut (io.ErrUnexpectedEOF)", err)
	}
	b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"outcome": "internal_error"}, 1)
	simtest.WaitFor(t, "the stream no longer counted", func() bool { return b.rt.Detached() == 0 })
	b.waitMetric(t, "pdplane_router_inflight_requests", nil, 0)
}

// takenRawServer serves b's router as b.srv does, with its own idle time,
// counting the streams taken over.
func takenRawServer(t *testing.T, b *bundle, idle time.Duration) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hijacked atomic.Int64
	srv := httptest.NewUnstartedServer(b.rt.Routes())
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateHijacked {
			hijacked.Add(1)
		}
	}
	srv.Listener = httpwire.NewListener(srv.Listener, idle)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &hijacked
}

// TestClientLeavingAPipelinedTakenStreamCancelsIt: a client that sent its
// next request along with this one (pipelining: net/http has already read
// it when the stream is taken over) and then leaves still cancels the
// stream at once, as net/http's background read of the socket would have.
func TestClientLeavingAPipelinedTakenStreamCancelsIt(t *testing.T) {
	t.Parallel()
	// A decode silent for a minute after its first token: were the
	// leaving not watched, only the relay's next writes would find it.
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = time.Minute })
	b := setupSims(t, router.Config{}, p, d)
	srv := b.srv
	c := dialRaw(t, srv)
	if _, err := io.WriteString(c, rawStreamRequest(1000)+rawStreamRequest(2)); err != nil {
		t.Fatal(err)
	}
	simtest.WaitFor(t, "the stream taken over", func() bool { return b.takenOver(t) == 1 && b.rt.Detached() == 1 })
	c.Close()
	simtest.WaitFor(t, "the decode's leg cancelled", func() bool { return d.Load().Running == 0 })
	b.waitMetric(t, "pdplane_router_requests_total", map[string]string{"outcome": "client_gone"}, 1)
	simtest.WaitFor(t, "the stream no longer counted", func() bool { return b.rt.Detached() == 0 })
}

// TestRouterCloseClosesParkedConnections: a connection parked between
// requests after a taken-over stream is closed when the router closes,
// not left open with nothing to hand it back or expire it.
func TestRouterCloseClosesParkedConnections(t *testing.T) {
	t.Parallel()
	p, d := simtest.Pair(t, registry.EngineSGLang, func(c *sim.Config) { c.DecodeTimePerToken = slowToken })
	b := setupSims(t, router.Config{}, p, d)
	srv := b.srv
	c := dialRaw(t, srv)
	if _, err := io.WriteString(c, rawStreamRequest(2)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil || b.takenOver(t) != 1 {
		t.Fatalf("the stream: %v, %d taken over", err, b.takenOver(t))
	}
	simtest.WaitFor(t, "the stream no longer counted", func() bool { return b.rt.Detached() == 0 })
	b.rt.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("parked connection after Router.Close: read %v, %v; want it closed (EOF)", n, err)
	}
}
