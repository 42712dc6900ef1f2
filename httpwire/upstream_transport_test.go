package httpwire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is an engine stand-in that counts the connections it
// accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections() // wakes handlers waiting on their request
		srv.Close()
	})
	return srv, &conns
}

// idleConns lists tr's idle connections.
func idleConns(tr *Transport) []*upConn {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []*upConn
	for _, list := range tr.idle {
		out = append(out, list...)
	}
	return out
}

func newTestTransport() *Transport {
	return NewTransport(TransportConfig{ConnectTimeout: time.Second, MaxIdleConnsPerHost: 4})
}

func post(t *testing.T, tr http.RoundTripper, ctx context.Context, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, NewRequestBody([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("X-Request-Id", "r1")
	return tr.RoundTrip(req)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

func TestUpstreamTransportReusesConnections(t *testing.T) {
	t.Parallel()
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get("X-Request-Id") != "r1" || r.ContentLength != int64(len(b)) {
			http.Error(w, "bad request head", 400)
			return
		}
		if strings.Contains(string(b), "chunked") {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
			}
			return
		}
		fmt.Fprintf(w, "echo %s", b)
	})
	tr := newTestTransport()
	defer tr.CloseIdleConnections()
	for i := range 10 {
		body := "plain"
		if i%2 == 1 {
			body = "chunked"
		}
		resp, err := post(t, tr, context.Background(), srv.URL+"/v1/completions?x=1", body)
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, resp)
		if resp.StatusCode != 200 || (body == "plain" && got != "echo plain") || (body == "chunked" && got != "data: 0\n\ndata: 1\n\ndata: 2\n\n") {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, got)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 10 sequential requests", n)
	}
	// The idle connection keeps nothing of the last answer: its reader's
	// response would hold the request and its prompt.
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, list := range tr.idle {
		for _, uc := range list {
			if uc.chunked.resp != nil || uc.fixed.br != nil {
				t.Errorf("an idle connection still holds its last answer's reader: %+v / %+v", uc.chunked, uc.fixed)
			}
		}
	}
}

func TestUpstreamTransportSurvivesEngineClosingIdleConnections(t *testing.T) {
	t.Parallel()
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	tr := newTestTransport()
	defer tr.CloseIdleConnections()
	for i := range 5 {
		resp, err := post(t, tr, context.Background(), srv.URL, "x")
		if err != nil {
			t.Fatalf("request %d after the engine closed idle connections: %v", i, err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("got %q", got)
		}
		srv.CloseClientConnections() // as uvicorn does after its keep-alive
		waitFor(t, "the engine's close to reach the idle connection", func() bool {
			for _, uc := range idleConns(tr) {
				if connAlive(uc.c) {
					return false
				}
			}
			return true
		})
	}
	if n := conns.Load(); n != 5 {
		t.Fatalf("%d connections, want 5 (each idle one was closed)", n)
	}

	// Past the idle timeout a connection is not reused either: the idle
	// one is made older than that rather than waited for.
	resp, _ := post(t, tr, context.Background(), srv.URL, "x")
	readAll(t, resp)
	for _, uc := range idleConns(tr) {
		uc.idleAt = uc.idleAt.Add(-tr.idleTimeout - time.Second)
	}
	resp, _ = post(t, tr, context.Background(), srv.URL, "x")
	readAll(t, resp)
	if n := conns.Load(); n != 7 {
		t.Fatalf("%d connections, want 7", n)
	}
}

func TestUpstreamTransportCancelWakesBlockedRead(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.WriteHeader(200)
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tr := newTestTransport()
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := post(t, tr, ctx, srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "data: first") {
		t.Fatalf("first read %q %v", buf[:n], err)
	}
	time.AfterFunc(20*time.Millisecond, cancel)
	start := time.Now()
	_, err = resp.Body.Read(buf)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("blocked read ended with %v after %v", err, time.Since(start))
	}
	resp.Body.Close()
	// The cancelled connection is not reused.
	resp, err = post(t, tr, context.Background(), srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}

	// Cancelling before the answer's head arrives fails the round trip.
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	hang, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // net/http notices a client leaving only once the body is read
		<-r.Context().Done()
	})
	if _, err := post(t, tr, ctx, hang.URL, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("round trip past its deadline: %v", err)
	}
}

// A connection put back less than peekAfter ago is reused without the
// peek's system call, even one the engine has closed meanwhile: the request
// then meets the closed connection and is sent again on a new one. One idle
// longer is peeked at, and a closed one is dropped before it is used.
func TestUpstreamTransportPeeksOnlyAtConnectionsIdleAWhile(t *testing.T) {
	t.Parallel()
	ok := func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }
	srv, _ := countingServer(t, ok)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		name      string
		peekAfter time.Duration
		reused    bool // whether get hands back the closed connection
	}{{"just put back", time.Hour, true}, {"idle a while", 0, false}} {
		tr := newTestTransport()
		tr.peekAfter = tc.peekAfter
		resp, err := post(t, tr, context.Background(), srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		tr.mu.Lock()
		pooled := tr.idle[addr][0]
		tr.mu.Unlock()
		srv.CloseClientConnections()
		waitFor(t, "the engine's close to reach the pooled connection", func() bool { return !connAlive(pooled.c) })
		uc, err := tr.get(context.Background(), addr, true)
		if err != nil {
			t.Fatal(err)
		}
		if got := uc == pooled && uc.reused; got != tc.reused {
			t.Fatalf("%s: get handed back the closed connection: %t, want %t", tc.name, got, tc.reused)
		}
		uc.c.Close()
		tr.CloseIdleConnections()
	}
	// Sent on a connection closed while it was pooled: answered all the
	// same, on a new connection.
	srv, conns := countingServer(t, ok)
	tr := newTestTransport()
	tr.peekAfter = time.Hour
	defer tr.CloseIdleConnections()
	for i := range 3 {
		resp, err := post(t, tr, context.Background(), srv.URL, "x")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("request %d: %q", i, got)
		}
		srv.CloseClientConnections()
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections for 3 requests each after a close, want 3", n)
	}
}

func TestUpstreamTransportDoesNotReuseUnfinishedOrClosedConnections(t *testing.T) {
	t.Parallel()
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		fmt.Fprint(w, strings.Repeat("x", 10000))
	})
	tr := newTestTransport()
	defer tr.CloseIdleConnections()
	// Closed before its end: the connection goes.
	resp, err := post(t, tr, context.Background(), srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = resp.Body.Read(make([]byte, 10))
	resp.Body.Close()
	// Connection: close: the connection goes.
	resp, err = post(t, tr, context.Background(), srv.URL+"/close", "x")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); len(got) != 10000 {
		t.Fatalf("body of %d bytes", len(got))
	}
	resp, err = post(t, tr, context.Background(), srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3", n)
	}
}

func TestUpstreamTransportConnectError(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tr := newTestTransport()
	if _, err := post(t, tr, context.Background(), "http://"+addr, "x"); err == nil {
		t.Fatal("no error from a closed port")
	}
}

// segmentReader hands out one segment per Read, as a connection delivers
// what the engine wrote, and fails once they are spent: a Read past them is
// a Read that would have waited on the engine.
type segmentReader struct{ segs []string }

var errWouldWait = errors.New("read past what arrived: would wait on the engine")

func (s *segmentReader) Read(p []byte) (int, error) {
	if len(s.segs) == 0 {
		return 0, errWouldWait
	}
	n := copy(p, s.segs[0])
	if s.segs[0] = s.segs[0][n:]; s.segs[0] == "" {
		s.segs = s.segs[1:]
	}
	return n, nil
}

// TestStreamChunkedBodyReadyAndAtEnd checks what the relay decides its
// flushes on: ready is true only when the next Read returns data, and
// atEnd only when it returns io.EOF, without reading the connection again.
// A relay that trusted either wrongly would leave bytes unflushed while it
// waits on the engine.
func TestStreamChunkedBodyReadyAndAtEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		arrived      string // what the first read of the connection brings
		first        string // the first Read's data
		ready, atEnd bool
	}{
		{"next chunk whole", "5\r\nhello\r\n6\r\nworld!\r\n", "hello", true, false},
		{"next chunk's first byte", "5\r\nhello\r\n6\r\nw", "hello", true, false},
		{"next chunk's size line only", "5\r\nhello\r\n6\r\n", "hello", false, false},
		{"half a size line", "5\r\nhello\r\n1", "hello", false, false},
		{"only the CRLF after the data", "5\r\nhello\r\n", "hello", false, false},
		{"rest of the current chunk", "8\r\nhello", "hel", true, false},
		{"another chunk, then the last", "5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n", "hello", true, false},
		{"the last chunk", "5\r\nhello\r\n0\r\n\r\n", "hello", false, true},
		{"the last chunk, zeros and an extension", "5\r\nhello\r\n000;x=1\r\n\r\n", "hello", false, true},
		{"the last chunk without its final CRLF", "5\r\nhello\r\n0\r\n", "hello", false, false},
		{"the last chunk, half its final CRLF", "5\r\nhello\r\n0\r\n\r", "hello", false, false},
		{"the last chunk and a trailer", "5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n", "hello", false, false},
		{"an empty size line", "5\r\nhello\r\n\r\n\r\n", "hello", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			uc := &upConn{}
			uc.br = bufio.NewReaderSize(&segmentReader{segs: []string{tc.arrived}}, 64)
			b := &chunkedBody{uc: uc, resp: &http.Response{}, maxTrailer: 1 << 10}
			p := make([]byte, len(tc.first))
			n, err := b.Read(p)
			if err != nil || string(p[:n]) != tc.first {
				t.Fatalf("first Read = %q, %v; want %q", p[:n], err, tc.first)
			}
			if got := b.ready(); got != tc.ready {
				t.Errorf("ready() = %v, want %v", got, tc.ready)
			}
			if got := b.atEnd(); got != tc.atEnd {
				t.Errorf("atEnd() = %v, want %v", got, tc.atEnd)
			}
			n, err = b.Read(make([]byte, 16))
			switch {
			case tc.ready && (n == 0 || err != nil):
				t.Errorf("Read after ready() = %d, %v: want data without waiting", n, err)
			case tc.atEnd && (n != 0 || err != io.EOF):
				t.Errorf("Read after atEnd() = %d, %v: want io.EOF without waiting", n, err)
			case tc.atEnd && !b.atEnd():
				t.Error("atEnd() false after the end was read")
			}
		})
	}
}

// relayRead reads body as the relay does: wait for bytes without a buffer,
// then read what arrived.
func relayRead(body io.Reader, p []byte) (int, error) {
	if rb, ok := body.(*upBody); ok {
		rb.Await()
	}
	return body.Read(p)
}

// An answer's bytes that a full read buffer left in the socket announce
// themselves no more: waiting for bytes must not wait for them.
func TestUpstreamAwaitDoesNotWaitForBytesAlreadySent(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 3*(2<<10)+100) // several read buffers in one chunk
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, big)
	})
	tr := newTestTransport()
	defer tr.CloseIdleConnections()
	resp, err := post(t, tr, context.Background(), srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	want := "data: first\n\n" + big
	if s := relayed(t, resp.Body, len(want), "the relay waited for bytes that had already arrived"); s != want {
		t.Fatalf("relayed %d bytes, want %d", len(s), len(want))
	}
}

// relayed reads body as the relay does until it has n bytes or an error,
// failing the test with stuck when that takes longer than a few seconds.
func relayed(t *testing.T, body io.Reader, n int, stuck string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		var all []byte
		p := make([]byte, 512)
		for len(all) < n {
			m, err := relayRead(body, p)
			all = append(all, p[:m]...)
			if err != nil {
				break
			}
		}
		got <- string(all)
	}()
	select {
	case s := <-got:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal(stuck)
	}
	return ""
}

// Between events a stream waits without a read buffer: the wait ends with
// the engine's next bytes, which the read then returns, and with the
// request's cancellation, which the read then reports.
func TestUpstreamAwaitWakesOnNextBytesAndOnCancel(t *testing.T) {
	t.Parallel()
	next := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		more := next
		if r.URL.Path == "/hold" {
			more = nil // no second event: only the client's leaving ends it
		}
		select {
		case <-more:
			fmt.Fprint(w, "data: second\n\n")
		case <-r.Context().Done():
		}
	})
	tr := newTestTransport()
	defer tr.CloseIdleConnections()
	open := func(ctx context.Context, path string) *http.Response {
		resp, err := post(t, tr, ctx, srv.URL+path, "x")
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, 64)
		if n, err := relayRead(resp.Body, p); err != nil || string(p[:n]) != "data: first\n\n" {
			t.Fatalf("first read %q, %v", p[:n], err)
		}
		return resp
	}
	type result struct {
		s   string
		err error
	}
	readNext := func(body io.Reader) <-chan result {
		ch := make(chan result, 1)
		go func() {
			p := make([]byte, 64)
			n, err := relayRead(body, p)
			ch <- result{string(p[:n]), err}
		}()
		return ch
	}
	wait := func(ch <-chan result) result {
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("the wait for the next bytes never ended")
		}
		return result{}
	}

	resp := open(context.Background(), "/")
	ch := readNext(resp.Body)
	close(next)
	if r := wait(ch); r.err != nil || r.s != "data: second\n\n" {
		t.Fatalf("read after the wait = %q, %v; want the second event", r.s, r.err)
	}
	if b := readAll(t, resp); b != "" {
		t.Fatalf("rest of the answer %q, want nothing", b)
	}

	ctx, cancel := context.WithCancel(context.Background())
	resp = open(ctx, "/hold")
	defer resp.Body.Close()
	ch = readNext(resp.Body)
	cancel()
	if r := wait(ch); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("read after a cancelled wait: %q, %v; want context.Canceled", r.s, r.err)
	}
}

// Between events nothing of a chunked stream stays in its read buffer: the
// CRLF that ends a chunk's data is taken as soon as it has arrived, and
// bytes that are not one are left for Read to report.
func TestChunkedBodySkipsDataEndBeforeWaiting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		arrived  string
		buffered int // bytes left in the buffer after skipDataEnd
		readErr  bool
	}{
		{"chunk with its CRLF", "5\r\nhello\r\n", 0, false},
		{"CRLF not yet arrived", "5\r\nhello", 0, false},
		{"half the CRLF", "5\r\nhello\r", 1, false},
		{"bytes that are not a CRLF", "5\r\nhelloXY", 2, true},
		{"CRLF and the next chunk's size", "5\r\nhello\r\n3\r\n", 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			uc := &upConn{}
			uc.br = bufio.NewReaderSize(&segmentReader{segs: []string{tc.arrived}}, 64)
			b := &chunkedBody{uc: uc, resp: &http.Response{}, maxTrailer: 1 << 10}
			p := make([]byte, 5)
			if n, err := b.Read(p); err != nil || string(p[:n]) != "hello" {
				t.Fatalf("first Read = %q, %v", p[:n], err)
			}
			b.skipDataEnd()
			if got := uc.br.Buffered(); got != tc.buffered {
				t.Fatalf("%d bytes buffered after skipDataEnd, want %d", got, tc.buffered)
			}
			if tc.readErr {
				if _, err := b.Read(p); err == nil {
					t.Fatal("Read after a chunk not ended by CRLF: no error")
				}
			}
		})
	}
}

// Bytes that arrived while nobody read the connection (the relay was
// writing to its client) end the wait at once: it asks the socket, not a
// readiness that a read since may have used up.
func TestUpstreamAwaitFindsBytesThatArrivedBetweenReads(t *testing.T) {
	t.Parallel()
	sent := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: second\n\n")
		w.(http.Flusher).Flush()
		close(sent)
		<-r.Context().Done()
	})
	tr := newTestTransport()
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(t, tr, ctx, srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-sent
	want := "data: first\n\ndata: second\n\n"
	if s := relayed(t, resp.Body, len(want), "the wait missed bytes that had arrived before it"); s != want {
		t.Fatalf("relayed %q, want %q", s, want)
	}
}

// TestUpstreamWaitAfterWrite pins writeRequest's wait, which begins before
// the request is written and does not ask the socket first: an answer
// that comes at once, one that comes after a pause, bytes an engine sent
// before it was asked anything (read with the answer, which then fails to
// parse), and an engine that sent such bytes and never answers (the
// request's context ends the wait) all end as a read would have.
func TestUpstreamWaitAfterWrite(t *testing.T) {
	const answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	engine := func(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					serve(c, bufio.NewReader(c))
				}()
			}
		}()
		return "http://" + ln.Addr().String() + "/generate"
	}
	readRequest := func(br *bufio.Reader) bool {
		req, err := http.ReadRequest(br)
		if err != nil {
			return false
		}
		_, err = io.Copy(io.Discard, req.Body)
		return err == nil
	}
	tr := newTestTransport()
	defer tr.CloseIdleConnections()

	t.Run("an answer before the wait", func(t *testing.T) {
		// The answer comes, and the poller sees it, between the leg's
		// write and its wait: the wait must not forget it (it would wait
		// for bytes that never come, here until the context's end).
		answered := make(chan struct{}, 1)
		url := engine(t, func(c net.Conn, br *bufio.Reader) {
			if readRequest(br) {
				_, _ = io.WriteString(c, answer)
				answered <- struct{}{}
				readRequest(br)
			}
		})
		tr := newTestTransport()
		defer tr.CloseIdleConnections()
		tr.afterWrite = func() {
			<-answered
			time.Sleep(20 * time.Millisecond) // the poller takes the bytes' readiness meanwhile: no event says when
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := post(t, tr, ctx, url, `{}`)
		if err != nil {
			t.Fatalf("%v (context: %v)", err, ctx.Err())
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("body %q", got)
		}
	})
	t.Run("answers", func(t *testing.T) {
		url := engine(t, func(c net.Conn, br *bufio.Reader) {
			for i := 0; readRequest(br); i++ {
				if i%2 == 1 {
					time.Sleep(50 * time.Millisecond) // the point: an answer that comes after the wait began
				}
				if _, err := io.WriteString(c, answer); err != nil {
					return
				}
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for range 6 { // on one connection, reused: at once, after a pause, ...
			resp, err := post(t, tr, ctx, url, `{}`)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, resp); got != "ok" {
				t.Fatalf("body %q", got)
			}
		}
	})
	t.Run("bytes before the request", func(t *testing.T) {
		url := engine(t, func(c net.Conn, br *bufio.Reader) {
			_, _ = io.WriteString(c, "junk\r\n")
			time.Sleep(50 * time.Millisecond) // slow to answer: the poller takes the junk's readiness first; no event says when
			if readRequest(br) {
				_, _ = io.WriteString(c, answer)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := post(t, tr, ctx, url, `{}`); err == nil || ctx.Err() != nil {
			t.Fatalf("an answer after unasked bytes: %v (context: %v), want a parse error", err, ctx.Err())
		}
	})
	t.Run("bytes and no answer", func(t *testing.T) {
		url := engine(t, func(c net.Conn, br *bufio.Reader) {
			_, _ = io.WriteString(c, "junk\r\n")
			readRequest(br)
			_, _ = io.Copy(io.Discard, br) // never answers: reads until the client hangs up
		})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := post(t, tr, ctx, url, `{}`)
		if err == nil {
			t.Fatal("no error")
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the request's context ended the wait only after %v", d)
		}
	})
}
